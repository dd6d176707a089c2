"""Classified ops grouped into units, one per future stage: ops of one kind together,
identity dropouts folded into the stage before them, helpers (ops that do not depend on x,
shape plumbing) joined to the unit that consumes them. Nothing is dropped: an op no unit
takes becomes a plain `op` unit; only an op whose value goes only to Python (a print, an
`.item()`: Graph.for_python) is no stage.

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
        if op.index in owner or op.index in g.for_python:
            continue
        consumer_units = [owner[c] for c in g.consumers[op.index] if c in owner]
        if consumer_units:
            owner[op.index] = consumer_units[0]
            consumer_units[0].helpers.append(op.index)
    for op in g.ops:  # plumbing nobody consumed (the forward's last reshape): its producer's
        if op.index in owner or op.index in g.for_python:  # values read by Python: no stage
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
    return _fold_loops(g, units)


def _fold_loops(g: Graph, units: list[Unit]) -> list[Unit]:
    """A Python loop that runs the same unrecognised lines again and again is one `op` unit
    per line, not one per pass: in a run of consecutive `op` units, a unit whose line an
    earlier unit of the run already holds joins it (20,000 passes are not 20,000 stages)."""
    folded: list[Unit] = []
    first: dict[tuple[str, int], Unit] = {}
    for unit in units:
        if unit.kind != "op" or not unit.ops:
            first = {}
            folded.append(unit)
            continue
        source = g.ops[unit.ops[0]].source
        line = (source.file, source.line)
        earlier = first.get(line)
        if earlier is None:
            first[line] = unit
            folded.append(unit)
            continue
        earlier.ops = sorted((*earlier.ops, *unit.ops))
        earlier.helpers = sorted((*earlier.helpers, *unit.helpers))
        earlier.folded = sorted((*earlier.folded, *unit.folded))
        earlier.runs += 1
    return folded

