"""dropout: a dropout on x-derived values (an identity one in eval mode is folded into the stage before).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ...records import Check, OpRecord, Stage
from ..builder import BHTT, BTC
from ..graph import Graph
from ..grouping import Unit
from ..maker import StageMaker
from ..sizes import Sizes
from ..vocab import DROPOUTS

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
