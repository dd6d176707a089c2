"""view: the channel axis cut into (h, d_h) heads (view, reshape, unflatten): a new shape, the same memory.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math

import numpy as np

from ...records import Check, OpRecord, Stage
from ..builder import BTC, BTHD, yes
from ..cell import Cell, Why, moved
from ..graph import Graph
from ..grouping import Unit
from ..maker import StageMaker
from ..sizes import Sizes

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
        tensors.append(b.record(m.tensor_name(op), op.out, m.dims(op.out.shape, BTHD),
                                share=(source_name, src)))
        shared &= op.out.storage == src.storage
        same &= bool(np.array_equal(op.out.values.reshape(-1), src.values.reshape(-1)))
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


def why(cell: Cell) -> Why:
    """The same number, found at another index of the input (moved, not computed)."""
    return moved(cell)
