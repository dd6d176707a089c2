"""Classified ops grouped into units, one per future stage: ops of one kind together,
identity dropouts folded into the stage before them, helpers (ops that do not depend on x,
shape plumbing) joined to the unit that consumes them. Nothing is dropped: an op no unit
takes becomes a plain `op` unit.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ..kinds._parts.unit import Unit
from ..ops.graph import Graph
from ..ops.numeric import equal


def group(g: Graph) -> list[Unit]:
    """Ops into units: one per kind (dropout and op may repeat), helpers attached."""
    units: list[Unit] = []
    by_kind: dict[str, Unit] = {}
    owner: dict[int, Unit] = {}
    for op in g.ops:
        kind = g.kind.get(op.index)
        if kind is None or kind == "aux":
            continue
        if kind == "dropout":
            source = g.producer(g.x_inputs(op)[0])
            while source is not None and source.index not in owner and g.x_inputs(source):
                source = g.producer(g.x_inputs(source)[0])  # back through plumbing (.type())
            same = equal(op.out.values, g.snap(g.x_inputs(op)[0]).values)
            if same and source is not None and source.index in owner:
                owner[source.index].folded.append(op.index)
                owner[op.index] = owner[source.index]
                continue
        repeatable = kind in ("op", "dropout")
        unit = None if repeatable else by_kind.get(kind)
        if repeatable and units and units[-1].kind == kind and kind == "op" and \
                g.ops[units[-1].ops[-1]].source == op.source:
            unit = units[-1]
        if unit is None:
            unit = Unit(kind)
            units.append(unit)
            if not repeatable:
                by_kind[kind] = unit
        unit.ops.append(op.index)
        owner[op.index] = unit
    # helpers: shape plumbing and ops that do not depend on x join their consumer's unit
    for op in reversed(g.ops):
        if op.index in owner:
            continue
        consumer_units = [owner[c] for c in g.consumers[op.index] if c in owner]
        if consumer_units:
            owner[op.index] = consumer_units[0]
            consumer_units[0].helpers.append(op.index)
    for op in g.ops:  # plumbing nobody consumed (the forward's last reshape): its producer's
        if op.index in owner:
            continue
        producers = [owner[r.op] for r in op.inputs if r.kind == "op" and r.op in owner]
        if producers:
            owner[op.index] = producers[0]
            producers[0].helpers.append(op.index)
        else:
            unit = Unit("op", [op.index])
            units.append(unit)
            owner[op.index] = unit
    units.sort(key=lambda u: min(u.ops or u.helpers))
    return units

