"""plumbing: shape-only ops no earlier rule claimed (kind aux): they join the stage that consumes them.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import SHAPE_OPS
from ..records import OpRecord

KIND = "aux"


def plumbing(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """Shape-only ops no rule claimed (k.transpose(-2, -1), contiguous, float): helpers."""
    return "aux" if op.name in SHAPE_OPS and g.x_inputs(op) else None


RULES = (plumbing,)
