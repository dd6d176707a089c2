"""view: the channel axis cut into (h, d_h) heads (view, reshape, unflatten): a new shape, the same memory.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import ATOL, RTOL, close, equal, f64, max_diff, tolerance
from ..ops.sizes import Sizes
from ..ops.vocab import SHAPE_OPS
from ..records import Check, OpRecord, Stage, Trace
from ._parts.builder import BTC, BTHD, yes
from ._parts.cell import Cell, Why, moved
from ._parts.maker import StageMaker
from ._parts.quizzing import Question, shape_question
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "view"


def head_split(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """view/reshape/unflatten cutting the channel axis into (h, d_h) before attention."""
    if op.name not in {"view", "reshape", "unflatten"} or not g.x_inputs(op):
        return None
    if g.op_derives(op, {"scores", "attend"}):
        return None
    before, after = g.snap(g.x_inputs(op)[0]).shape, op.out.shape
    if after[-1] == sizes.d_h and before[-1] == sizes.h * sizes.d_h and sizes.h * sizes.d_h != sizes.d_h \
            and math.prod(after) == math.prod(before) and len(after) >= len(before):
        return "view"
    if len(after) == len(before) + 1 and after[-1] == sizes.d_h and before[-1] == sizes.h * sizes.d_h:
        return "view"  # one head: the new axis has size 1
    return None


RULES = (head_split,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    b = m.b
    ops = [m.op(i) for i in unit.ops]
    tensors, shared, same = [], True, True
    for op in ops:
        src_ref = m.x_in(op)
        src = m.snap(src_ref)
        source_name = m.origin_name(src_ref)
        tensors.append(b.record(m.tensor_name(op), op.out, m.role_dims(op, op.out.shape, BTHD),
                                share=(source_name, src)))
        shared &= op.out.storage == src.storage
        same &= equal(op.out.values.reshape(-1), src.values.reshape(-1))
    names = ", ".join(t.name for t in tensors)
    first = ops[0]
    checks = [
        Check(f"{names} share storage with the projections: {yes(shared)}"
              f"{', nothing copied' if shared else ''}", shared),
        Check(f"the numbers are untouched: {tensors[0].name}.{first.name}(...) flattened back equals "
              f"{tensors[0].name}", same),
    ]
    src = m.snap(m.x_in(first))
    return m.stage(unit, stage_id, "view", tensors, checks, shape_in=src.shape,
                      shape_out=first.out.shape, dims_in=m.dims(src.shape, BTC),
                      dims_out=m.dims(first.out.shape, BTHD))


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    """The view and transpose stages together: the head split judged on the tensors the scores
    and attend ops actually used."""
    rows: list[Row] = []
    split_stages = [s for s in j.trace.stages if s.kind in ("view", "transpose")]
    worst, ok, diagnosis, culprit = 0.0, True, None, None
    judged = False
    for role, entries in j.head_operands().items():
        per_head = [e for e in entries if j.head_index(e[2]) is not None]
        for values, ref, _consumer in entries:
            projected, factor, proj_op, passed = j.chain_to_projection(ref)
            if projected is None:
                continue
            projected = j.canonical_projection(f64(projected))
            got = f64(values)
            if per_head and got.ndim == 3:  # one head's own module: nothing was split
                expected = projected * factor
                judged = True
                good, d = close(got, expected)
            else:
                if projected.shape[-1] != j.h * j.d_h or got.size != projected.size:
                    continue
                judged = True
                expected = (projected.reshape(j.B, -1, j.h, j.d_h)  # T, or K's and V's T_k
                            .transpose(0, 2, 1, 3) * factor)
                got4 = got.reshape(expected.shape) if got.ndim != 4 else got
                good, d = close(got4, expected)
                if not good and diagnosis is None:
                    diagnosis = _head_count_diagnosis(j, got, projected * factor, role) \
                        or _split_diagnosis(j, got4, projected * factor, role)
                    culprit = passed[0] if passed else proj_op
            worst = max(worst, d)
            ok &= good
    if not judged:
        return rows
    target = None
    if culprit is not None:
        target = j.stage_of.get(culprit.index)
    if target is None or target.kind not in ("view", "transpose"):
        target = split_stages[-1] if split_stages else None
    checked = (f"head i holds channels [{j.d_h}i, {j.d_h}i+{j.d_h}) of every "
               f"token's Q, K, V")
    for stage in split_stages:
        if stage is target:
            continue
        same, d = same_numbers(j, stage)
        rows.append(j.row(stage, stage.kind, same, d,
                             "a new shape or axis order only: the same numbers"))
    if target is not None:
        rows.append(j.row(target, target.kind, ok, worst, checked,
                             source=culprit.source if (culprit and not ok) else None,
                             diagnosis=diagnosis))
    elif not ok:
        src = culprit.source if culprit is not None else None
        rows.append(j.row(None, "view", ok, worst, checked, source=src,
                             diagnosis=diagnosis, position=j.position_before("scores")))
    return rows


def same_numbers(j: Judge, stage: Stage) -> tuple[bool, float]:
    """Every op of a view/transpose stage keeps its input's numbers (order aside)."""
    worst = 0.0
    for op in stage.ops:
        xs = j.g.x_inputs(op)
        if not xs or op.name not in SHAPE_OPS:
            continue
        before = f64(j.g.snap(xs[0]).values).reshape(-1)
        for out in op.outputs:
            after = f64(out.values).reshape(-1)
            if op.name in ("view", "reshape", "flatten", "unflatten", "contiguous", "clone",
                           "float", "to", "detach"):
                d = max_diff(after, before) if after.size == before.size else math.inf
            else:
                d = max_diff(np.sort(after), np.sort(before)) if after.size == before.size \
                    else 0.0 if np.isin(after, before).all() else math.inf
            worst = max(worst, d)
    return worst <= ATOL, worst


def _head_count_diagnosis(j: Judge, got: np.ndarray, projected: np.ndarray, role: str
                          ) -> tuple[str, str] | None:
    """A right split into another number of heads than --heads: (B, h', T, C/h')."""
    if got.ndim != 4 or got.shape[1] in (j.h, 0) or got.shape[1] * got.shape[3] != j.C:
        return None
    h, d = got.shape[1], got.shape[3]
    split = projected.reshape(j.B, -1, h, d).transpose(0, 2, 1, 3)
    if split.shape != got.shape or not np.allclose(got, split, **tolerance(atol=ATOL, rtol=RTOL)):
        return None
    name = {"Q": "queries", "K": "keys", "V": "values"}[role]
    return ("head_count",
            f"the {name} are split into {h} heads of {d} channel{'s' * (d != 1)} where the "
            f"module was built with {j.h} heads of {j.d_h} (--heads {j.h}): split into the "
            "number of heads it is given")


def _split_diagnosis(j: Judge, got: np.ndarray, projected: np.ndarray, role: str) -> tuple[str, str]:
    name = {"Q": "queries", "K": "keys", "V": "values"}[role]
    if np.allclose(got.reshape(-1), projected.reshape(-1), equal_nan=True, **tolerance(atol=ATOL, rtol=RTOL)):
        last = (j.T_q * j.d_h - 1) // j.C  # the token head 0's last number is from
        tokens = "token 0" if last == 0 else f"tokens 0-{last}"
        return ("split_without_transpose",
                f"heads split with a single view(B, h, T, d_h) and no transpose: the {name}' "
                f"numbers are all there but in memory order, so head 0 holds the first "
                f"T*d_h = {j.T_q * j.d_h} numbers ({tokens}, all channels) instead of "
                f"channels 0-{j.d_h - 1} of every token; view(B, T, h, d_h), then "
                f"transpose(1, 2)")
    if np.allclose(np.sort(got.reshape(-1)), np.sort(projected.reshape(-1)),
                   **tolerance(atol=ATOL, rtol=RTOL)):
        return ("split_permuted",
                f"the {name} hold the right numbers in the wrong places (a permutation): "
                f"head i must get channels [i*{j.d_h}, (i+1)*{j.d_h}) of each token")
    return ("split_wrong", f"the head-split {name} are not the projection's numbers")

# ------------------------------------------------------------ scores / scale / mask / softmax


def why(cell: Cell) -> Why:
    """The same number, found at another index of the input (moved, not computed)."""
    return moved(cell)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The shape after the head split."""
    return (shape_question(stage, stage.tensors[-1], stage.kind),) if stage.tensors else ()
