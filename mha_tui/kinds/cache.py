"""cache: torch.cat onto an empty key/value cache, plumbing rather than a step (kind aux, no stage).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import CONCATS
from ..records import OpRecord

KIND = "aux"


def cache_append(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """torch.cat onto an empty tensor (a key/value cache filled for the first time): the
    tensor passes through unchanged, so it is plumbing, not a step."""
    if op.name not in CONCATS or len(g.x_inputs(op)) != 1:
        return None
    others = g.other_inputs(op)
    return "aux" if others and all(g.snap(r).values.size == 0 for r in others) else None


RULES = (cache_append,)
