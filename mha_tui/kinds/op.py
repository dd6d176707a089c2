"""op: an x-dependent op no rule claimed, shown as it ran (its line, inputs, outputs); never
dropped. Also the fallback when a kind's builder fails. Its cells are explained by the op that
made them, from its recorded inputs (op_cell: the generic op arithmetic).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ops.graph import Graph
from ..records import OpRecord, Ref, Stage
from ._parts.cell import Cell, Why
from ._parts.maker import StageMaker, public_name
from ._parts.op_cell import explain, locate
from ._parts.op_cell.reading import ALONG, BINARY, IDENTITY, REDUCE, SAME_ORDER, UNARY
from ._parts.unit import Unit

KEEP = {*UNARY, *BINARY, *IDENTITY, *ALONG, "masked_fill", "dropout"}

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "op"
RULES = ()  # the default: what no rule claims

# Where an op sits in the attention dataflow: the stage kinds of each phase, in the order
# they run. The one table of them (kv_cache's rule reads it too).
QKV = {"project", "qkv_split", "view", "transpose", "rotary", "norm", "kv_repeat", "cosine"}
SCORES = {"scores", "scale", "mask", "pos_bias", "softcap", "sinks"}
WEIGHTS = {"softmax", "dropout"}
HEADS_OUT = {"attend", "concat", "sdpa"}
OUTPUT = {"w_o", "residual"}

# From the kinds of the ops it is made from, latest first: what a learner can be told about
# an op no kind names.
_ROLES = (
    (OUTPUT, "a transform of the output, after W_O"),
    (HEADS_OUT, "a transform of the heads' outputs, after the weights are applied"),
    (WEIGHTS, "a transform of the weights, after softmax"),
    (SCORES, "a transform of the scores before softmax"),
    (QKV, "a transform of q, k or v before the scores"),
)


def code_of(title: str) -> str:
    """The code an op stage's title shows, without its role and its line."""
    return title.split(": ", 1)[-1].rsplit(", line ", 1)[0]


def role(g: Graph, op: OpRecord) -> str:
    """The op's place in the dataflow, in words: between x and the projections, on q, k or
    v, on the scores before softmax, on the weights, on the output."""
    for kinds, words in _ROLES:
        if g.op_derives(op, kinds):
            return words
    return "a transform of x before the projections"


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    ops = [m.op(i) for i in unit.ops]
    tensors = []
    # A loop's unit: the tensors of its last pass (what the ops after it read).
    for op in ops if unit.runs == 1 else ops[-len(ops) // unit.runs:]:
        for ref in m.g.x_inputs(op)[:2]:
            snap = m.snap(ref)
            tensors.append(m.b.record(f"{public_name(op)} input: {m.origin_name(ref)}", snap,
                                         input_dims(m, ref)))
        for n, out in enumerate(op.outputs[:3]):
            tensors.append(m.b.record(m.tensor_name(op, n, fallback=op.name), out,
                                         output_dims(m, op, out.shape)))
    first = ops[0]
    where = role(m.g, first)
    # titled by its role, then its code and line: what a learner is told about an op no kind
    # names ("A transform of the scores before softmax: torch.tanh(scores), line 12")
    title = f"{where[0].upper()}{where[1:]}: {m.call_text(first)}, line {first.source.line}"
    explanation = (f"{where[0].upper()}{where[1:]} that no rule of mha-tui names, so it is "
                   "shown as it ran: its line, what it consumed and what it made.")
    if unit.runs > 1:
        explanation += (f" A Python loop ran this line {unit.runs:,} times ({len(ops):,} ops in "
                        "all): the tensors shown are those of its last pass.")
    src = m.snap(m.g.x_inputs(first)[0]) if m.g.x_inputs(first) else first.out
    dims_in = input_dims(m, m.g.x_inputs(first)[0]) if m.g.x_inputs(first) else m.dims(src.shape)
    return m.stage(unit, stage_id, "op", tensors[-4:], [], shape_in=src.shape,
                      shape_out=ops[-1].out.shape, dims_in=dims_in,
                      dims_out=output_dims(m, ops[-1], ops[-1].out.shape), title=title,
                      explanation=explanation)


def input_dims(m: StageMaker, ref: Ref) -> tuple[str, ...]:
    """The dims the stage that made the tensor gave it, or that the op which made it from
    such a tensor keeps (output_dims); else guessed from its sizes (neutral d0, d1, ...
    when two label sets fit)."""
    snap = m.snap(ref)
    known = m.b.known_dims(snap)
    if known is not None:
        return known
    producer = m.g.producer(ref)
    return output_dims(m, producer, snap.shape) if producer is not None else m.dims(snap.shape)


def output_dims(m: StageMaker, op: OpRecord, shape: tuple[int, ...]) -> tuple[str, ...]:
    """An op's output dims from its first input's known dims where the op keeps its axes
    (elementwise, softmax along one), drops the reduced ones (`w.mean(dim=1)`) or only
    splits B*h into B, h or merges them (torch's MHA's views); else guessed from sizes."""
    inputs = m.g.x_inputs(op)
    known = m.b.known_dims(m.snap(inputs[0])) if inputs else None
    base = op.name.strip("_").removesuffix("_")
    if known is not None:
        if base in KEEP and tuple(shape) == m.snap(inputs[0]).shape:
            return known
        if base in REDUCE:
            kept = _reduced(op, known, len(shape))
            if kept is not None:
                return kept
        if base in SAME_ORDER:
            text = ",".join(known)
            for regrouped in (text.replace("B*h", "B,h"), text.replace("B,h", "B*h")):
                dims = tuple(regrouped.split(","))
                if regrouped != text and m.dims(shape, dims) == dims:
                    return dims
    return m.dims(shape)


def _reduced(op: OpRecord, dims: tuple[str, ...], ndim: int) -> tuple[str, ...] | None:
    """The axes left by a reduction over `dim` (torch) or `axis` (NumPy), without keepdim."""
    given = op.args[1] if len(op.args) > 1 else op.kwarg("dim", op.kwarg("axis", None))
    along = given if isinstance(given, tuple | list) else (given,)
    if not along or not all(isinstance(d, int) and not isinstance(d, bool) for d in along):
        return None
    dropped = {d % len(dims) for d in along}
    kept = tuple(d for k, d in enumerate(dims) if k not in dropped)
    return kept if len(kept) == ndim else None


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    g = j.classified()
    return [j.row(s, "op", None, None, f"{role(g, s.ops[-1]) if s.ops else 'an op'} that no rule "
                                          f"of mha-tui names: not judged on its own")
            for s in j.trace.stages if s.kind == "op"]


def why(cell: Cell) -> Why:
    """The op that made the cell, recomputed from its recorded inputs (or said not to be)."""
    return explain(cell, *locate(cell, cell.stage.ops))
