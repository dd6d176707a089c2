"""sinks: attention sinks (gpt-oss): one learned logit per head appended to every row of the
scores as an extra key column before softmax, and dropped after it, so that a query may
give part of its weight to no token at all.

Recognised from the ops and checked on the values, never from names: a `cat` along the key
axis of the scores and a tensor not made from x, whose result (after an optional shift by
the row max, which softmax ignores) goes to softmax, and whose extra columns are cut off the
weights right after.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import CONCATS, SOFTMAXES
from ..records import Check, OpRecord, Stage
from ..stages import title_of
from ._parts.cell import Cell, Why
from ._parts.found import held
from ._parts.grown import Part
from ._parts.maker import StageMaker, score_dims
from ._parts.op_cell import explain, locate
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "sinks"
EXPECTED = "sinks"  # check --expect sinks grows the reference by reference(j)
_SHIFT = {"max", "amax", "sub", "getitem"}  # combined - combined.max(-1, keepdim=True).values


@dataclass(frozen=True)
class Sink:
    cat: OpRecord
    softmax: OpRecord
    shift: tuple[int, ...]  # the row-max shift between them (max, its .values, sub)
    extra: int  # columns appended

    @property
    def ops(self) -> frozenset[int]:
        return frozenset({self.cat.index, *self.shift})


def _last_axis(op: OpRecord) -> bool:
    dim = op.kwarg("dim", next((a for a in op.args[1:] if isinstance(a, int)), 0))
    return dim in (-1, op.out.values.ndim - 1)


def sink_at(g: Graph, cat: OpRecord) -> Sink | None:
    if cat.name not in CONCATS or not _last_axis(cat):
        return None
    x_parts, others = g.x_inputs(cat), g.other_inputs(cat)
    if len(x_parts) != 1 or not others or not g.derives(x_parts[0], {"scores"}):
        return None
    T = g.snap(x_parts[0]).shape[-1]
    extra = cat.out.values.shape[-1] - T
    if extra < 1:
        return None
    shift: list[int] = []
    ref_op = cat
    for _ in range(6):  # on to softmax, through the row-max shift
        nexts = [g.ops[i] for i in g.consumers[ref_op.index]]
        soft = next((o for o in nexts if o.name in SOFTMAXES), None)
        if soft is not None:
            break
        sub = next((o for o in nexts if o.name == "sub"), None)
        if sub is None:
            return None
        shift.extend(o.index for o in nexts if o.name in _SHIFT)
        shift.extend(i for o in nexts if o.name in ("max", "amax") for i in g.consumers[o.index]
                     if g.ops[i].name == "getitem")
        ref_op = sub
    else:
        return None
    dropped = any(g.ops[i].name == "getitem" and g.ops[i].out.values.shape[-1] == T
                  for i in g.consumers[soft.index])
    return Sink(cat, soft, tuple(sorted(set(shift))), extra) if dropped else None


def sinks(g: Graph) -> list[Sink]:
    return [s for op in g.ops if op.name in ("cat", "concat", "concatenate") and g.from_x[op.index]
            for s in [sink_at(g, op)] if s is not None]


def appends_a_sink(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """The cat of a sink column onto the scores, and the row-max shift before softmax."""
    if op.name not in {"cat", "concat", "concatenate", *_SHIFT} or not g.op_derives(op, {"scores"}):
        return None
    return KIND if any(op.index in s.ops for s in sinks(g)) else None


RULES = (appends_a_sink,)


def _weights_kept(g: Graph, sink: Sink) -> np.ndarray:
    """What the weights on the real keys sum to, per row (1 minus the sink's weight)."""
    weights = sink.softmax.out.values.astype(np.float64)
    return weights[..., : weights.shape[-1] - sink.extra].sum(axis=-1)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    found = held(sinks(m.g), unit)
    assert found is not None  # the rule claimed its ops
    combined = found.cat.out
    dims = score_dims(m, combined.values)
    column = combined.values[..., -found.extra:]
    tensors = [m.b.record("sink logits", combined, (*dims[:-1], "sink"), values=column,
                          caption="the learned logit each head appends to every row"),
               m.b.record("scores with the sink", combined, dims, values=combined.values,
                          caption=f"T + {found.extra} columns: the keys, then the sink")]
    kept = _weights_kept(m.g, found)
    per_head = column.reshape(-1, *column.shape[-2:]) if column.ndim >= 2 else column
    same = bool(np.allclose(per_head, per_head[..., :1, :], atol=0)) if per_head.ndim == 3 else True
    checks = [Check("the sink logit is the same for every query of a head (a learned number, "
                    "not made from x)", same),
              Check(f"after softmax the sink column is dropped: each query's weights on the "
                    f"{combined.shape[-1] - found.extra} keys sum to {kept.min():.4f} .. "
                    f"{kept.max():.4f}, less than 1 (computed by mha-tui)",
                    bool((kept < 1.0 + 1e-6).all()))]
    explanation = (
        "Attention sinks (gpt-oss): every head has a learned logit that is appended to each "
        "row of the scores as if it were one more key. Softmax spreads each query's weight "
        "over the real keys and this sink; the sink's column is then dropped, so the weights "
        "on the real keys sum to less than 1. A head can so attend to 'nothing' instead of "
        "being forced to put all its weight on some token.")
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=combined.shape,
                   shape_out=combined.shape, dims_in=dims, dims_out=dims, title=title_of(KIND),
                   explanation=explanation, extra_ops=sorted(found.ops))


def _logits(j: Judge, sink: Sink) -> np.ndarray | None:
    """The sink logits per head, (h, n), as the cat appended them (the first query's row of
    the first batch row: the same for every query of a head)."""
    column = sink.cat.out.values[..., -sink.extra:]  # (B, h, T, n), or (B, h_kv, m, T, n)
    if column.ndim < 3 or (column.size // (column.shape[-2] * sink.extra)) % j.h:
        return None
    rows = column.reshape(-1, j.h, column.shape[-2], sink.extra)  # the leading axes: B, then heads
    return np.asarray(rows[0, :, 0, :], dtype=np.float64)


def _dropped_right(j: Judge, sink: Sink) -> OpRecord | None:
    """The cut of the weights after softmax that keeps the sink's columns and drops a key's
    instead (`W[..., 1:]` for a sink appended last); None when the keys' columns are kept."""
    weights = sink.softmax.out.values
    T = weights.shape[-1] - sink.extra
    for i in j.g.consumers[sink.softmax.index]:
        cut = j.g.ops[i]
        if cut.name == "getitem" and cut.out.values.shape[-1] == T and \
                not np.array_equal(cut.out.values, weights[..., :T]):
            return cut
    return None


def reference(j: Judge) -> Part | None:
    """--expect sinks: the module's own sink logits per head (its sinks stage)."""
    found = sinks(j.classified())
    logits = _logits(j, found[0]) if found else None
    if logits is None:
        return None
    shown = ", ".join(f"{v:.4g}" for v in logits[:, 0][:4]) + (", ..." if j.h > 4 else "")
    return Part(f"attention sinks (a learned logit per head, {shown}, appended to the scores "
                f"before softmax and dropped after)", sinks=logits)


def _expected(j: Judge, found: list[Sink]) -> list[Row]:
    """Rows for --expect sinks: the sink's column dropped after softmax (not a key's); a sink
    appended and never dropped; none at all."""
    rows = []
    for sink in found:
        cut = _dropped_right(j, sink)
        if cut is not None:
            line = j.where(cut.source)[1]
            rows.append(j.row(j.stage_of.get(cut.index), KIND, False, None,
                              "the sink column dropped after softmax", source=cut.source,
                              diagnosis=("sinks_not_dropped", f"the sink column is not dropped: "
                                         f"the cut of the weights at line {line} keeps the "
                                         f"sink's column and drops a key's; --expect sinks drops "
                                         f"the {sink.extra} appended column"
                                         f"{'s' if sink.extra > 1 else ''} after softmax "
                                         f"(gpt-oss: W[..., :-1])")))
    if found:
        return rows
    g = j.classified()
    for cat in (op for op in g.ops if op.name in ("cat", "concat", "concatenate")
                and g.from_x[op.index] and _last_axis(op) and g.other_inputs(op)
                and g.op_derives(op, {"scores", "scale", "mask"})
                and not g.op_derives(op, {"softmax"})):
        line = j.where(cat.source)[1]
        return [j.row(j.stage_of.get(cat.index), KIND, False, None,
                      "the sink column dropped after softmax", source=cat.source,
                      diagnosis=("sinks_not_dropped", f"the sink column appended to the scores "
                                 f"at line {line} is never dropped after softmax: the weights "
                                 f"keep its column; --expect sinks drops it (gpt-oss: "
                                 f"W[..., :-1]) before the weights meet V"))]
    scores = next((s for s in j.trace.stages if s.kind in ("scores", "sdpa")), None)
    return [j.row(None, KIND, False, None, "a learned sink logit per head appended to the "
                  "scores before softmax", source=scores.source if scores is not None else None,
                  position=j.position_before("softmax"),
                  diagnosis=("mechanism_missing", "no attention sinks: --expect sinks wants a "
                             "learned logit per head appended to every row of the scores as an "
                             "extra key before softmax and dropped after (gpt-oss), and no "
                             "column was appended to the scores"))]


def judge(j: Judge) -> list[Row]:
    rows = []
    found = sinks(j.classified())
    if EXPECTED in j.facts.mechanisms:
        rows += _expected(j, found)
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        sink = held(found, stage)
        ok = sink is not None and bool((_weights_kept(j.g, sink) < 1.0 + 1e-6).all())
        rows.append(j.row(stage, KIND, ok if sink is not None else None, None,
                          "a learned sink logit per head appended to the scores before softmax "
                          "and dropped after (not part of plain attention)",
                          source=sink.cat.source if sink is not None else None))
    return rows


def mechanism(j: Judge, stage: Stage) -> str | None:
    sink = held(sinks(j.classified()), stage)
    if sink is None:
        return None
    kept = _weights_kept(j.g, sink)
    return (f"attention sinks: a learned logit per head appended to the scores as "
            f"{'an extra key' if sink.extra == 1 else f'{sink.extra} extra keys'} before "
            f"softmax and dropped after (gpt-oss), so each query's weights on the real keys sum "
            f"to {kept.min():.3f} .. {kept.max():.3f}, not 1; plain multi-head attention has no sink")


def why(cell: Cell) -> Why:
    """A number of the scores with the sink: a key's score or the head's sink logit, copied by
    the cat from its recorded inputs."""
    made = explain(cell, *locate(cell, cell.stage.ops))
    T = cell.record.values.shape[-1]
    extra = sum(1 for op in cell.stage.ops if op.name in ("cat", "concat", "concatenate"))
    column = cell.index[-1]
    said = ("the sink's column: the head's learned logit, the same for every query"
            if extra and column >= T - extra else "a key's column: the score as it was")
    return replace(made, kind=KIND, notes=(*made.notes, said, "softmax spreads each row over "
                                           "the keys and the sink; the sink's column is then "
                                           "dropped"))
