"""recognise(): a recorded forward in, the stages a learner reads out.

graph (graph.py) -> sizes and heads (sizes.py) -> each op's kind (classify.py, by the
registry's rules) -> units (grouping.py) -> stages (assemble.py, by the kinds' builders).
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import Config
from ..kinds import kv_repeat
from ..kinds._parts.builder import Builder
from ..ops.graph import Graph
from ..ops.numeric import computed_in, recorded_dtype
from ..ops.sizes import Sizes, assign_heads, assign_loop_heads, head_calls, infer_sizes
from ..records import Embedded, Recording, Snapshot, Stage
from .assemble import build_stages
from .batch import padding_words
from .classify import classify
from .cross import cache_words, cross_words
from .grouping import group


def recognise(rec: Recording, config: Config, *, embedded: Embedded | None = None,
              forward_equal: bool | None = None, n_params: int | None = None) -> tuple[Stage, ...]:
    """The stages of one recorded forward, in the module's own order."""
    x = next((snap for name, snap in rec.inputs
              if snap.dtype.startswith(("float", "bfloat")) and snap.ndim == 3),
             rec.inputs[0][1] if rec.inputs else None)
    calls = head_calls(rec)
    if x is None:
        sizes = Sizes(1, config.seq_len, config.embed_dim, config.num_heads, config.head_dim)
    else:
        sizes = infer_sizes(rec, x, config.num_heads, calls)
    sizes = replace(sizes, start=len(config.cached))  # a decode step's new token's position
    with computed_in(recorded_dtype(rec)):  # every check allows the module's own rounding
        return _recognise(rec, config, x, sizes, calls, embedded=embedded,
                          forward_equal=forward_equal, n_params=n_params)


def _recognise(rec: Recording, config: Config, x: Snapshot | None, sizes: Sizes,
               calls: list, *, embedded: Embedded | None, forward_equal: bool | None,
               n_params: int | None) -> tuple[Stage, ...]:
    g = Graph(rec)
    if g.key_names:  # cross-attention: T is the queries' T_q, the context's T_k
        context = dict(rec.inputs)[min(g.key_names)]
        sizes = replace(sizes, T_k=context.shape[-2])
    assign_heads(g, calls)
    assign_loop_heads(g, sizes)
    classify(g, sizes)
    if not sizes.cross:  # a decode step: T new queries against the cache's longer keys
        sizes = _cached_keys(g, sizes)
    units = group(g)
    builder = Builder(g, sizes, config, calls)
    builder.h_kv = kv_repeat.kv_heads(builder)
    stages = build_stages(builder, units, rec, embedded=embedded, forward_equal=forward_equal,
                          n_params=n_params)
    if sizes.cross:  # the words' shapes name the keys' axis T_k where the sizes say so
        stages = tuple(replace(stage, dims_in=builder.cross_dims(stage.shape_in, stage.dims_in),
                               dims_out=builder.cross_dims(stage.shape_out, stage.dims_out))
                       for stage in stages)
        if g.key_names:
            stages = cross_words(stages, sizes, query=" and ".join(sorted(g.query_names)) or "x",
                                 context=" and ".join(sorted(g.key_names)) or "the context")
        else:
            stages = cache_words(stages, sizes)
    if config.batch:  # the padding, row by row, as the mask op wrote it
        stages = padding_words(stages, config)
    return stages



def _cached_keys(g: Graph, sizes: Sizes) -> Sizes:
    """A decode step with a KV cache: the scores are (T, T_k) with T_k the keys kept so far
    (the cache and the new ones), longer than the T new queries. The keys' axis is then T_k,
    as in cross-attention. A cache allocated up front (gpt-fast's KVCache) holds more slots
    than tokens: the keys' axis is then every slot, those not written yet masked."""
    for op in g.ops:
        if g.kind.get(op.index) == "scores" and op.out.ndim >= 2:
            T_q, T_k = op.out.shape[-2], op.out.shape[-1]
        elif op.name == "scaled_dot_product_attention" and len(op.inputs) >= 2 and \
                g.snap(op.inputs[0]).ndim >= 2:  # the fused op: its q's and k's lengths
            T_q, T_k = g.snap(op.inputs[0]).shape[-2], g.snap(op.inputs[1]).shape[-2]
        else:
            continue
        return replace(sizes, T_k=T_k) if T_q == sizes.T and T_k > sizes.T else sizes
    return sizes
