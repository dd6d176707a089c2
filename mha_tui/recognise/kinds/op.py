"""op: an x-dependent op no rule claimed, shown as it ran (its line, inputs, outputs); never
dropped. Also the fallback when a kind's builder fails. Its cells are explained by the op that
made them, from its recorded inputs (op_cell: the generic op arithmetic).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...records import Stage
from ..cell import Cell, Why
from ..grouping import Unit
from ..maker import StageMaker, public_name
from .op_cell import explain, locate

if TYPE_CHECKING:
    from ...judge.judging import Judge, Row


KIND = "op"
RULES = ()  # the default: what no rule claims


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    ops = [m.op(i) for i in unit.ops]
    tensors = []
    for op in ops:
        for ref in m.g.x_inputs(op)[:2]:
            snap = m.snap(ref)
            tensors.append(m.b.record(f"{public_name(op)} input: {m.origin_name(ref)}", snap,
                                         m.dims(snap.shape)))
        for n, out in enumerate(op.outputs[:3]):
            tensors.append(m.b.record(m.tensor_name(op, n, fallback=op.name), out,
                                         m.dims(out.shape)))
    first = ops[0]
    title = m.call_text(first)
    explanation = ("No rule of mha-tui places this op in the attention recipe, so it is shown "
                   "as it ran: its line, what it consumed and what it made.")
    src = m.snap(m.g.x_inputs(first)[0]) if m.g.x_inputs(first) else first.out
    return m.stage(unit, stage_id, "op", tensors[-4:], [], shape_in=src.shape,
                      shape_out=ops[-1].out.shape, dims_in=m.dims(src.shape),
                      dims_out=m.dims(ops[-1].out.shape), title=title, explanation=explanation)


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    return [j.row(s, "op", None, None, "an op no rule of mha-tui recognises: not judged "
                                          "on its own") for s in j.trace.stages
            if s.kind == "op"]


def why(cell: Cell) -> Why:
    """The op that made the cell, recomputed from its recorded inputs (or said not to be)."""
    return explain(cell, *locate(cell, cell.stage.ops))
