"""w_o: the output projection, x times a weight parameter after attend (it mixes the heads).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import PRODUCTS
from ..records import Check, OpRecord, Stage, Trace
from ._parts.builder import BTC
from ._parts.cell import Cell, Why
from ._parts.maker import StageMaker
from ._parts.product_cell import projection_why
from ._parts.quizzing import Question, shape_question
from ._parts.unit import Unit
from .project import build_projection, linear_row, weight_product

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "w_o"


def output_projection(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """x times a weight parameter, downstream of attend (or concat, or a fused sdpa)."""
    return "w_o" if weight_product(g, op) and g.op_derives(op, {"attend", "concat", "sdpa"}) else None


RULES = (output_projection,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    stage = build_projection(m, unit, stage_id, kind="w_o")
    product = stage.checks[0]  # build_projection's first check: out equals x @ W (+ b)
    s = m.s
    weight = next((t for t in stage.tensors if t.dims in (("C_out", "C_in"), ("C_in", "C_out"))), None)
    checks = list(stage.checks)
    in_axis = -1 if weight is not None and weight.dims[0] == "C_out" else 0
    if weight is not None and s.h > 1 and weight.values.shape[in_axis] == s.h * s.d_h:
        w = weight.values if weight.dims[0] == "C_out" else weight.values.T
        mixes = all(bool((w[:, i * s.d_h:(i + 1) * s.d_h] != 0).any(axis=1).all()) for i in range(s.h))
        checks.insert(0, Check(f"every output channel reads from all {s.h} heads "
                               f"(no all-zero block)", mixes))
    out = stage.tensors[-1]
    last = m.op(max([*unit.ops, *unit.helpers]))
    if last.out.shape != tuple(out.values.shape) and last.out.shape == (s.B, s.T, s.C):
        out = m.b.record(out.name, last.out, BTC)
    renamed = replace(out, shares_with="concat's " + _concat_name(m), head_split=None, caption="")
    # nn.Linear's product check is said by the checks above; it stays only when it failed.
    linear = any(m.op(i).name == "linear" for i in unit.ops)
    stage = replace(stage, tensors=(*stage.tensors[:-1], renamed),
                    checks=tuple(c for c in checks if c is not product or not linear or c.ok is not True))
    m.made[KIND] = stage
    return stage

def _concat_name(m: StageMaker) -> str:
    stage = m.made.get("concat")
    return stage.tensors[-1].name if stage else "context"


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    stages = [s for s in j.trace.stages if s.kind == "w_o"]
    if stages:
        return [linear_row(j, s, "w_o") for s in stages]
    if j.trace.failed:
        return []
    used = {r.name for op in j.g.ops for r in op.inputs if r.kind == "param"}
    unused = [(n, s) for n, s in j.facts.parameters if n not in used and len(s) == 2]
    last = j.g.ops[-1] if j.g.ops else None
    src = last.source if last is not None else None
    if unused:
        name, shape = unused[0]
        return [j.row(None, "w_o", False, None,
                         "the concatenated heads go through the output projection",
                         source=src, position=len(j.trace.stages) + 1,
                         diagnosis=("no_output_projection",
                                    f"no output projection: the module has {name} "
                                    f"{tuple(shape)} but its forward never uses it, so the "
                                    "concatenated heads are returned unmixed"))]
    unplaced = _unplaced_output_weight(j)
    if unplaced is not None:  # a W_O it has, in a form no rule places (a head axis)
        op, name, shape = unplaced
        return [j.row(j.stage_of.get(op.index), "w_o", None, None,
                      f"its output projection {name} {tuple(shape)} (line {op.source.line}) is "
                      "a weight mha-tui does not place as W_O yet: not judged on its own",
                      source=op.source)]
    j.differences.append("has no output projection (the heads' concatenation is the "
                            "output, as in Raschka's MultiHeadAttentionWrapper): compared "
                            "with a reference whose W_O is the identity")
    return []


def _unplaced_output_weight(j: Judge) -> tuple[OpRecord, str, tuple[int, ...]] | None:
    """A product of the attention's result with a weight parameter after attend that no rule
    placed (TransformerLens' and ARENA's W_O of shape (h, d_h, C), read by einsum): the
    module has an output projection, so it is never said to lack one."""
    g = j.classified()
    for op in g.ops:
        if op.name not in PRODUCTS or not g.from_x[op.index] or g.kind.get(op.index) == "w_o" \
                or not g.op_derives(op, {"attend", "concat", "sdpa"}):
            continue
        params = [r for r in op.inputs if r.kind == "param" and g.snap(r).ndim >= 2]
        if params and op.out.shape and op.out.shape[-1] == j.C:
            return op, params[0].name or "a weight", g.snap(params[0]).shape
    return None

# ------------------------------------------------------------ sdpa


def why(cell: Cell) -> Why:
    """An output channel: the concatenated heads' row dotted with one row of W_O (or the
    column or row of a raw W_O parameter the product reads: product_cell)."""
    return projection_why(cell, "W_O")


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The output's shape."""
    return (shape_question(stage, stage.tensors[-1], "the output projection"),) if stage.tensors else ()
