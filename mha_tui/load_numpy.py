"""The load room for NumPy modules: the blueprint (`--model blueprint`) and a learner's class.

Built in the order a reader of the NumPy blueprint (seed 002) builds it:

    module = MultiHeadAttention(d_model, n_heads, seed=seed)   # W_Q, W_K, W_V, W_O from
                                                               # np.random.default_rng(seed)
    table = np.random.default_rng(seed + 1).standard_normal((V, d_model)).astype(np.float32)
    x = table[ids]                                             # (T, d_model), no batch axis
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)   # or None: --no-causal

then `module.forward(x, mask)`. A learner's NumPy class (`--module`) is built by the same
rules as a torch module (d_model / n_heads / seed ... filled by name) and gets the same x and
the blueprint's additive mask in a forward parameter named `mask` or `attn_mask`.

NumPy only: importing this module (and running a NumPy module) never imports torch.
Never import rich, textual or typer here either.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .config import Config

if TYPE_CHECKING:
    from .records import Trace

MASK_NAMES = ("mask", "attn_mask")


def embedding_table(config: Config) -> np.ndarray:
    """The blueprint's embedding: a second generator, seeded seed + 1, one row per token."""
    rng = np.random.default_rng(config.seed + 1)
    return rng.standard_normal((len(config.vocab), config.embed_dim)).astype(np.float32)


def causal_mask(T: int) -> np.ndarray:
    """The blueprint's additive (T, T) mask: 0 where a token may look, -inf above the diagonal."""
    return np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)


@dataclass(frozen=True, eq=False)
class LoadedNumpy:
    """A built NumPy module, its input, and how its forward is called."""

    module: object
    ids: np.ndarray  # (T,) int64
    table: np.ndarray  # (V, C)
    x: np.ndarray  # (T, C)
    args: tuple[np.ndarray, ...]  # forward's positional inputs: (x,) or (x, x, x)
    kwargs: dict[str, np.ndarray | None] = field(default_factory=dict)
    label: str = ""
    construction: str = ""


def build_blueprint(config: Config, *, einsum: bool = False) -> LoadedNumpy:
    """`--model blueprint`: the blueprint's class, embedding and mask for this run."""
    from .examples.blueprint import MultiHeadAttention, MultiHeadAttentionEinsum

    cls = MultiHeadAttentionEinsum if einsum else MultiHeadAttention
    module = cls(config.embed_dim, config.num_heads, seed=config.seed)
    construction = f"{cls.__name__}({config.embed_dim}, {config.num_heads}, seed={config.seed})"
    return _inputs(module, config, label="blueprint-einsum" if einsum else "blueprint",
                   construction=construction)


def _inputs(module: object, config: Config, *, label: str, construction: str) -> LoadedNumpy:
    table = embedding_table(config)
    ids = np.array(config.ids, dtype=np.int64)  # (T,)
    x = table[ids]  # (T, C)
    args, kwargs = forward_inputs(module, x, causal=config.causal)
    return LoadedNumpy(module=module, ids=ids, table=table, x=x, args=args, kwargs=kwargs,
                       label=label, construction=construction)


def forward_inputs(module: object, x: np.ndarray, *, causal: bool
                   ) -> tuple[tuple[np.ndarray, ...], dict[str, np.ndarray | None]]:
    """x (or x three times for forward(query, key, value)); `mask`/`attn_mask` gets the
    additive causal mask, or None with --no-causal."""
    from .tracing.numpy_ops import forward_of

    try:
        params = list(inspect.signature(forward_of(module)).parameters.values())
    except (TypeError, ValueError):
        return (x,), {}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.name not in MASK_NAMES]
    names = tuple(p.name for p in positional[:3])
    args = (x, x, x) if names in (("query", "key", "value"), ("q", "k", "v")) else (x,)
    kwargs: dict[str, np.ndarray | None] = {}
    for p in params:
        if p.name in MASK_NAMES:
            kwargs[p.name] = causal_mask(x.shape[0]) if causal else None
    return args, kwargs


def traced(loaded: LoadedNumpy) -> Callable[[Config], Trace]:
    """The function the CLI and the app call to trace the built module."""

    def run(config: Config) -> Trace:
        from .tracing.numpy_ops import trace

        return trace(loaded.module, loaded.x, config.tokens, args=loaded.args,
                           kwargs=loaded.kwargs, table=loaded.table, ids=loaded.ids,
                           config=config)

    return run

