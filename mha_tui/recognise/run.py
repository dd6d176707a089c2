"""recognise(): a recorded forward in, the stages a learner reads out.

graph (graph.py) -> sizes and heads (sizes.py) -> each op's kind (classify.py, by the
registry's rules) -> units (grouping.py) -> stages (assemble.py, by the kinds' builders).
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ..config import Config
from ..kinds import kv_repeat
from ..kinds._parts.builder import Builder
from ..ops.graph import Graph
from ..ops.sizes import Sizes, assign_heads, assign_loop_heads, head_calls, infer_sizes
from ..records import Embedded, Recording, Stage
from .assemble import build_stages
from .classify import classify
from .grouping import group


def recognise(rec: Recording, config: Config, *, embedded: Embedded | None = None,
              forward_equal: bool | None = None, n_params: int | None = None) -> tuple[Stage, ...]:
    """The stages of one recorded forward, in the module's own order."""
    x = next((snap for name, snap in rec.inputs if snap.dtype.startswith("float") and snap.ndim == 3),
             rec.inputs[0][1] if rec.inputs else None)
    calls = head_calls(rec)
    if x is None:
        sizes = Sizes(1, config.seq_len, config.embed_dim, config.num_heads, config.head_dim)
    else:
        sizes = infer_sizes(rec, x, config.num_heads, calls)
    g = Graph(rec)
    assign_heads(g, calls)
    assign_loop_heads(g, sizes)
    classify(g, sizes)
    units = group(g)
    builder = Builder(g, sizes, config, calls)
    builder.h_kv = kv_repeat.kv_heads(builder)
    return build_stages(builder, units, rec, embedded=embedded, forward_equal=forward_equal,
                        n_params=n_params)
