"""The end-to-end reference for a NumPy module: the blueprint's computation, in NumPy.

`mha-tui check` compares a module's output with a reference that has the module's weights
copied in by role. For torch modules that is the "mygpt" chapter's module (run by
`mha_tui.tracing.rerun`, which needs torch); for NumPy code it is this function, the NumPy
blueprint's forward (seed 002) written out in float64, so that checking a NumPy module
never imports torch. Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from .results import RoleWeights


def _linear(x: np.ndarray, weight_bias: tuple[np.ndarray, np.ndarray | None]) -> np.ndarray:
    weight, bias = weight_bias  # nn.Linear's layout: weight (out, in)
    y = x @ np.asarray(weight, dtype=np.float64).T
    return y if bias is None else y + np.asarray(bias, dtype=np.float64)


def reference_output(x: np.ndarray, weights: RoleWeights, heads: int, causal: bool) -> np.ndarray:
    """softmax((x W_Q)_i (x W_K)_i^T / sqrt(d_h) + mask) (x W_V)_i per head, heads side by
    side, then W_O (the identity when the module has none); x (T, C) or (B, T, C)."""
    x = np.asarray(x, dtype=np.float64)
    batched = x if x.ndim == 3 else x[None]  # (B, T, C)
    B, T, C = batched.shape
    d_h = C // heads

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(B, T, heads, d_h).transpose(0, 2, 1, 3)  # (B, h, T, d_h)

    q, k, v = (split(_linear(batched, w)) for w in (weights.q, weights.k, weights.v))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_h)  # (B, h, T, T)
    if causal:
        scores = scores + np.triu(np.full((T, T), -np.inf), k=1)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights_ = np.exp(scores)
    weights_ = weights_ / weights_.sum(axis=-1, keepdims=True)
    context = (weights_ @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C)
    out = context if weights.o is None else _linear(context, weights.o)
    return out if x.ndim == 3 else out[0]
