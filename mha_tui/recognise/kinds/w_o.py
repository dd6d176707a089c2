"""w_o: the output projection, x times a weight parameter after attend (it mixes the heads).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ...records import Check, OpRecord, Stage, TensorRecord
from ..builder import BTC
from ..cell import Cell, Why, linear
from ..graph import Graph
from ..grouping import Unit
from ..maker import StageMaker
from ..sizes import Sizes
from .project import build_projection, weight_product

KIND = "w_o"


def output_projection(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """x times a weight parameter, downstream of attend (or concat, or a fused sdpa)."""
    return "w_o" if weight_product(g, op) and g.op_derives(op, {"attend", "concat", "sdpa"}) else None


RULES = (output_projection,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    stage = build_projection(m, unit, stage_id, kind="w_o")
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
    renamed = TensorRecord(**{**out.__dict__, "shares_with": "concat's " + _concat_name(m),
                              "head_split": None, "caption": ""})
    object.__setattr__(stage, "tensors", (*stage.tensors[:-1], renamed))
    object.__setattr__(stage, "checks", tuple(c for c in checks if "nn.Linear" not in c.label
                                              or ("bias" in c.label and c.ok is not True)))
    return stage

def _concat_name(m: StageMaker) -> str:
    stage = m.made.get("concat")
    return stage.tensors[-1].name if stage else "context"


def why(cell: Cell) -> Why:
    """An output channel: the concatenated heads' row dotted with one row of W_O."""
    return linear(cell, "W_O")
