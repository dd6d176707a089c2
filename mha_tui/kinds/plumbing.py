"""plumbing: shape-only ops no earlier rule claimed (kind aux): they join the stage that consumes them.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import SHAPE_OPS
from ..records import OpRecord

KIND = "aux"


def plumbing(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """Shape-only ops no rule claimed (k.transpose(-2, -1), contiguous, float): helpers."""
    return "aux" if op.name in SHAPE_OPS and g.x_inputs(op) else None


def guards_unused(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """torch.nan_to_num(scores) that found no NaN or inf on this run (Diff Transformer's guard
    before its mask): it changed nothing, so it is a helper of the stage after it."""
    if op.name not in ("nan_to_num", "nan_to_num_") or not g.x_inputs(op):
        return None
    before = g.snap(g.x_inputs(op)[0]).values
    return "aux" if before.shape == op.out.values.shape and np.array_equal(
        before, op.out.values) else None


RULES = (plumbing, guards_unused)
