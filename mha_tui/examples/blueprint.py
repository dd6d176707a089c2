"""The NumPy blueprint's multi-head attention (seed 002, "03 - Multi-Head Attention").

Plain tutorial code in the blueprint's conventions: `MultiHeadAttention(d_model, n_heads,
seed=0)`, one (d_model, d_model) matrix per role drawn from `np.random.default_rng(seed)`
in the order W_Q, W_K, W_V, W_O, used as `x @ W` (no transpose); inputs (T, d_model) with
no batch axis and an optional additive (T, T) mask; heads by
`reshape(T, H, d_head).transpose(1, 0, 2)`, merged back by
`transpose(1, 0, 2).reshape(T, d_model)`, then `@ W_O`.

The blueprint tests two forms of steps 3a-3d, and so does this file: `MultiHeadAttention`
runs the explicit per-head loop (Phase 15), `MultiHeadAttentionEinsum` one `einsum` over
the head axis (Phase 17). Same constructor, same weights, same numbers.

NumPy only: never import torch, rich, textual, typer or anything of mha-tui here.
"""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Row-wise softmax, numerically stable: subtract the row maximum first."""
    shifted = x - np.max(x, axis=axis, keepdims=True)  # largest entry of each row is 0
    exps = np.exp(shifted)  # -inf (a masked score) becomes exactly 0
    return exps / np.sum(exps, axis=axis, keepdims=True)  # each row sums to 1


class MultiHeadAttention:
    """Multi-head self-attention, heads computed one at a time in a loop."""

    def __init__(self, d_model: int, n_heads: int, seed: int = 0):
        assert d_model % n_heads == 0
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        rng = np.random.default_rng(seed)
        # one big matrix per role, reshape to heads at runtime
        scale = 1.0 / np.sqrt(d_model)
        self.W_Q = rng.standard_normal((d_model, d_model)).astype(np.float32) * scale
        self.W_K = rng.standard_normal((d_model, d_model)).astype(np.float32) * scale
        self.W_V = rng.standard_normal((d_model, d_model)).astype(np.float32) * scale
        self.W_O = rng.standard_normal((d_model, d_model)).astype(np.float32) * scale

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        # x: (T, d_model), mask: (T, T) additive or None
        # returns: (T, d_model)
        T = x.shape[0]  # x: (T, d_model)
        H, d_head = self.n_heads, self.d_head  # H heads of d_head channels (d_model = H * d_head)
        Q = x @ self.W_Q  # (T, d_model)
        K = x @ self.W_K  # (T, d_model)
        V = x @ self.W_V  # (T, d_model)
        Q = Q.reshape(T, H, d_head).transpose(1, 0, 2)  # (H, T, d_head)
        K = K.reshape(T, H, d_head).transpose(1, 0, 2)  # (H, T, d_head)
        V = V.reshape(T, H, d_head).transpose(1, 0, 2)  # (H, T, d_head)
        heads = []  # H arrays of (T, d_head)
        for h in range(H):
            scores_h = Q[h] @ K[h].T / np.sqrt(d_head)  # (T, T)
            if mask is not None:
                scores_h = scores_h + mask  # (T, T)
            attn_h = softmax(scores_h)  # (T, T)
            heads.append(attn_h @ V[h])  # (T, d_head)
        out = np.stack(heads)  # (H, T, d_head)
        out = out.transpose(1, 0, 2).reshape(T, self.d_model)  # (T, d_model)
        return out @ self.W_O  # (T, d_model)


class MultiHeadAttentionEinsum(MultiHeadAttention):
    """The same layer with the per-head loop written as one einsum over the head axis."""

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        # x: (T, d_model), mask: (T, T) additive or None
        # returns: (T, d_model)
        T = x.shape[0]  # x: (T, d_model)
        H, d_head = self.n_heads, self.d_head  # H heads of d_head channels (d_model = H * d_head)
        Q = (x @ self.W_Q).reshape(T, H, d_head).transpose(1, 0, 2)  # (H, T, d_head)
        K = (x @ self.W_K).reshape(T, H, d_head).transpose(1, 0, 2)  # (H, T, d_head)
        V = (x @ self.W_V).reshape(T, H, d_head).transpose(1, 0, 2)  # (H, T, d_head)
        scores = np.einsum("htd,hsd->hts", Q, K) / np.sqrt(d_head)  # (H, T, T)
        if mask is not None:
            scores = scores + mask  # (H, T, T): the (T, T) mask broadcasts over heads
        attn = softmax(scores)  # (H, T, T)
        out = np.einsum("hts,hsd->htd", attn, V)  # (H, T, d_head)
        out = out.transpose(1, 0, 2).reshape(T, self.d_model)  # (T, d_model)
        return out @ self.W_O  # (T, d_model)


def causal_mask(T: int) -> np.ndarray:
    """The additive causal mask: 0 where a token may look, -inf above the diagonal."""
    return np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)  # (T, T)
