"""dropout: a dropout on x-derived values (an identity one in eval mode is folded into the stage before).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ops.graph import Graph
from ..ops.numeric import ATOL, f64, max_diff
from ..ops.sizes import Sizes
from ..ops.vocab import DROPOUTS
from ..records import Check, OpRecord, Stage
from ._parts.builder import BHTT, BTC
from ._parts.cell import Cell, Term, Why, WhyError, where
from ._parts.maker import StageMaker
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "dropout"


def dropout(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    return "dropout" if op.name in DROPOUTS and g.x_inputs(op) else None


RULES = (dropout,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    op = m.op(unit.ops[0])
    src = m.snap(m.x_in(op))
    rec = m.b.record(m.tensor_name(op), op.out, m.dims(op.out.shape, BHTT, BTC))
    zeros = int((op.out.values == 0).sum() - (src.values == 0).sum())
    checks = [Check(f"dropout zeroed {zeros} entries and scaled the rest by 1/(1-p)", None)]
    return m.stage(unit, stage_id, "dropout", [rec], checks, shape_in=src.shape,
                      shape_out=op.out.shape, dims_in=rec.dims, dims_out=rec.dims)


# ---------------------------------------------------------------- why this number


def why(cell: Cell) -> Why:
    """A number after dropout: the number before it (recorded), dropped to 0 or kept and
    scaled by 1/(1-p). Which entries are dropped is random: mha-tui reads it from the module's
    output, it cannot recompute it."""
    op = next((o for o in cell.stage.ops if o.name in DROPOUTS), None)
    if op is None:
        raise WhyError(f"stage {cell.stage.id} holds no dropout to explain {cell.name} by")
    before = float(cell.operand(op, 0)[cell.index])
    p = op.kwarg("p", next((a for a in op.scalars() if isinstance(a, float)), None))
    training = op.kwarg("training", next((a for a in op.scalars() if isinstance(a, bool)), None))
    terms = [Term("before dropout (recorded)", (), before)]
    notes = ["which entries dropout drops is random: mha-tui reads whether this one was dropped "
             "from the module's output (0 where the number before was not)"]
    if training is False or not isinstance(p, float) or p <= 0:
        computed = before
        terms.append(Term("dropout is off (training=False or p = 0): passed unchanged", (),
                          computed))
        notes = []
    elif cell.recorded == 0 and before != 0:
        computed = 0.0
        terms.append(Term(f"dropped (probability p = {p:g}): written 0", (), computed))
    else:
        scale = 1 / (1 - p)
        computed = before * scale
        terms.append(Term(f"kept, × 1/(1-p), p = {p:g}", (before, "×", scale), computed))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = dropout(the number before it)", tuple(terms), tuple(notes),
               computed, cell.recorded)


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    rows = []
    for stage in j.trace.stages:
        if stage.kind != "dropout":
            continue
        ops = j.main_ops(stage, DROPOUTS)
        if not ops:
            continue
        op = ops[0]
        before = f64(j.g.snap(j.g.x_inputs(op)[0]).values)
        d = max_diff(op.out.values, before)
        good = d <= ATOL
        diag = None
        if not good:
            p = op.kwarg("p", next((a for a in op.scalars() if isinstance(a, float)), None))
            training = op.kwarg("training", next((a for a in op.scalars() if isinstance(a, bool)), None))
            zeroed = int(((f64(op.out.values) == 0) & (before != 0)).sum())
            again = j.runs_differ()
            mode = ("the module is in eval mode, but this dropout ran with training=True"
                    if training is True and not j.facts.training else
                    "the module is in training mode")
            diag = ("dropout_active",
                    f"dropout is active: {mode}, so it zeroed {zeroed} of {before.size} "
                    f"entries and scaled the rest by 1/(1-p)"
                    f"{f' (p={p})' if isinstance(p, float) else ''}; {again}. Call "
                    f"module.eval(), or pass training=self.training to F.dropout")
        rows.append(j.row(stage, "dropout", good, d,
                             "dropout leaves the numbers unchanged in eval mode",
                             source=op.source, diagnosis=diag))
    return rows
