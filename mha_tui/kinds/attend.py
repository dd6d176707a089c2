"""attend: the weights times V, a product of two x-derived tensors downstream of softmax.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import products_agree
from ..ops.sizes import Sizes
from ..ops.vocab import MATMULS
from ..records import Check, OpRecord, Stage, Trace
from ._parts.builder import BHTD, BHTT
from ._parts.cell import Cell, Why, broadcast_lead, dot, head_prefix, shared_note, where
from ._parts.maker import StageMaker, batched_product, broadcast_heads
from ._parts.op_cell.reading import bracket
from ._parts.product_cell import by_rows, called, generic, summed_over
from ._parts.quizzing import Question, shape_question
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "attend"


def weights_times_values(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """A product of two x-derived tensors downstream of softmax (or dropout): weights @ V."""
    if op.name not in MATMULS or len(g.x_inputs(op)) < 2:
        return None
    return "attend" if g.op_derives(op, {"softmax", "dropout"}) else None


RULES = (weights_times_values,)


def _product(op: OpRecord) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """What weights @ v computes from its two operands (an einsum as its subscripts say)."""
    equation = next((x for x in op.args if isinstance(x, str)), None) \
        if op.name == "einsum" else None
    return np.matmul if equation is None else (lambda a, c: np.einsum(equation, a, c))


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    values, snap = m.four_d(unit, BHTD)
    ok = m.unit_products_agree(unit, _product, frozenset({"matmul", "bmm", "einsum", "mm"}))
    first = m.op(unit.ops[0])
    h = m.s.h
    what = "einsum" if first.name == "einsum" else "batched matmul"
    shared_kv = broadcast_heads(m.g, first, h)
    checks = [Check(batched_product(h, "weights_i @ V_i", what) if not m.b.per_head and not shared_kv
                    else f"one {what} = {h} per-head weights_i @ V_0: V has one head, and the "
                         f"matmul broadcasts it to all {h} query heads (no copy is made)"
                    if shared_kv else f"each head's own weights @ v, {h} heads side by side", ok)]
    rec = m.b.record(m.tensor_name(first, fallback="context"), snap,
                        BHTD if values.ndim == 4 else None, values=values,
                        caption="row t: token t's weighted mix of values")
    m.out_of_kind["attend"] = (values, snap)
    src = m.snap(m.x_in(first))
    return m.stage(unit, stage_id, "attend", [rec], checks, shape_in=src.shape,
                      shape_out=values.shape if m.b.per_head else snap.shape,
                      dims_in=m.dims(src.shape, BHTT, ("T", "T")), dims_out=rec.dims)


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    rows = []
    for stage in j.trace.stages:
        if stage.kind != "attend" or j.is_sdpa(stage):
            continue
        ops = j.main_ops(stage, {"matmul", "bmm", "einsum", "baddbmm"})
        ok, worst = products_agree(j.g, ops)
        rows.append(j.row(stage, "attend", ok, worst,
                             "context = weights_i @ V_i for every head"))
    return rows

# ------------------------------------------------------------ concat


def why(cell: Cell) -> Why:
    """A context value: V's rows weighted by the softmax row, one term per key token."""
    if not cell.ops("matmul", "bmm") and cell.ops("einsum"):
        return _einsum_why(cell)
    op, index = cell.per_head(cell.ops("matmul", "bmm"))
    weights, values = cell.operand(op, 0), cell.operand(op, 1)
    *lead, i, c = index
    at_w, at_v = broadcast_lead(weights, lead), broadcast_lead(values, lead)
    return weighted_sum_why(cell, weights[(*at_w, i)], values[(*at_v, slice(None), c)],
                            notes=shared_note(at_v, lead, "V"))


def _einsum_why(cell: Cell) -> Why:
    """torch.einsum("bhqk,bkhd->bqhd", weights, v), or any subscripts: the weights' row and
    V's column, read from the einsum's recorded inputs."""
    c, f = by_rows(cell)
    if len(f.summed) != 1:
        return generic(c, f"{called(c)} sums over {', '.join(f.summed)}: not one term per key "
                          "token")
    column = tuple("k" if k == ":" else k for k in f.at[1])
    return weighted_sum_why(cell, f.a, f.b, f"{f.names[1]}{bracket(column)}", (
        f"the weights and V are {called(c)}'s recorded inputs, {f.names[0]} and {f.names[1]}; "
        f"{summed_over(f)}, the key token",))


def weighted_sum_why(cell: Cell, weights: np.ndarray, values: np.ndarray,
                     v_column: str = "", notes: tuple[str, ...] = ()) -> Why:
    """The arithmetic of one context value, whoever computed its inputs: Σ_k w[i, k] ×
    V[k, c], one term per key token (`v_column`: how V's column is written, V[k, c])."""
    *_, i, c = cell.index
    h = head_prefix(cell)
    labels = [f"key {cell.key_token(k)}: w[{h}{i}, {k}] × V[{h}{k}, {c}]" for k in range(len(weights))]
    terms, many, total = dot(cell, weights, values, labels, "weighted values")
    column = v_column or f"V[{h}k, {c}]"
    return Why(cell.stage.id, "attend", cell.record.name, cell.index,
               where(cell), f"{cell.name} = Σ_k weights[{h}{i}, k] × {column}  (one term "
               "per key token: V's rows weighted by the softmax row)", terms,
               (f"column {c} of V, weighted by row {i} of the attention weights", *notes, *many),
               total, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The shape of the context: one d_h vector per head and token."""
    return (shape_question(stage, stage.tensors[-1], "weights @ V"),) if stage.tensors else ()
