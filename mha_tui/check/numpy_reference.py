"""The reference computation in NumPy: the blueprint's forward, step by step, in float64.

`mha-tui check` compares a module's output with a reference that has the module's weights
copied in by role. For torch modules the end-to-end row uses the "mygpt" chapter's module
(run by `mha_tui.tracing.rerun`, which needs torch); for NumPy code it is
`reference_output` here, so that checking a NumPy module never imports torch. `steps`
gives every intermediate of the same computation (Q, the heads, the scores, the weights,
...), which `track.py` follows through a recording to find where a module leaves it.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .results import RoleWeights


def _linear(x: np.ndarray, weight_bias: tuple[np.ndarray, np.ndarray | None]) -> np.ndarray:
    weight, bias = weight_bias  # nn.Linear's layout: weight (out, in)
    y = x @ np.asarray(weight, dtype=np.float64).T
    return y if bias is None else y + np.asarray(bias, dtype=np.float64)


@dataclass(frozen=True)
class Step:
    """One intermediate of the reference: its name, values and axis labels.

    Two axes labelled "T" and "T'" are a (query, key) pair: never swapped when matched.
    """

    name: str
    values: np.ndarray
    dims: tuple[str, ...]


ROTARY_BASE = 10000.0


def rotate(t: np.ndarray, layout: str, base: float = ROTARY_BASE) -> np.ndarray:
    """Rotary positions on (B, h, T, d_h), full (every channel pair), base 10000.

    layout "half": Llama's and GPT-NeoX's rotate_half (channel i pairs with i + d_h/2);
    "interleaved": GPT-J's and Meta's Llama's (channel 2i pairs with 2i + 1)."""
    T, d = t.shape[-2], t.shape[-1]
    inv_freq = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)  # (d_h/2,)
    angles = np.outer(np.arange(T, dtype=np.float64), inv_freq)  # (T, d_h/2)
    if layout == "half":
        angles = np.concatenate([angles, angles], axis=-1)  # (T, d_h)
        half = d // 2
        turned = np.concatenate([-t[..., half:], t[..., :half]], axis=-1)
    else:
        angles = np.repeat(angles, 2, axis=-1)  # (T, d_h)
        turned = np.stack([-t[..., 1::2], t[..., 0::2]], axis=-1).reshape(t.shape)
    return t * np.cos(angles) + turned * np.sin(angles)


def steps(x: np.ndarray, weights: RoleWeights, heads: int, causal: bool, *,
          window: int | None = None, rotary: str | None = None) -> list[Step]:
    """Every intermediate of softmax(Q_i K_i^T / sqrt(d_h) + mask) V_i, heads side by side,
    then W_O (the identity when the module has none); x (T, C) or (B, T, C). With
    `rotary` ("half" or "interleaved"), q and k are rotated by position first; with
    `window` w, each query sees only the keys less than w tokens back."""
    x = np.asarray(x, dtype=np.float64)
    batched = x if x.ndim == 3 else x[None]  # (B, T, C)
    B, T, C = batched.shape
    d_h = C // heads

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(B, T, heads, d_h).transpose(0, 2, 1, 3)  # (B, h, T, d_h)

    Q, K, V = (_linear(batched, w) for w in (weights.q, weights.k, weights.v))  # (B, T, C)
    q, k, v = split(Q), split(K), split(V)  # (B, h, T, d_h)
    rotated: list[Step] = []
    if rotary is not None:
        q, k = rotate(q, rotary), rotate(k, rotary)  # (B, h, T, d_h)
        rotated = [Step("q rotated", q, ("B", "h", "T", "d_h")),
                   Step("k rotated", k, ("B", "h", "T", "d_h"))]
    scale = 1.0 / np.sqrt(d_h)
    raw = q @ k.transpose(0, 1, 3, 2)  # (B, h, T, T)
    blocked = np.triu(np.ones((T, T), dtype=bool), k=1) if causal else np.zeros((T, T), bool)
    if window is not None:
        blocked |= np.tril(np.ones((T, T), dtype=bool), k=-window)
    mask = np.where(blocked, -np.inf, 0.0)
    scaled = raw * scale
    masked = scaled + mask
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = masked - masked.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        attention = e / e.sum(axis=-1, keepdims=True)  # (B, h, T, T)
    context = attention @ v  # (B, h, T, d_h)
    merged = context.transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C)
    out = merged if weights.o is None else _linear(merged, weights.o)
    BTC, BHTD, BHTT = ("B", "T", "C"), ("B", "h", "T", "d_h"), ("B", "h", "T", "T'")
    return [
        Step("x", batched, BTC),
        Step("Q", Q, BTC), Step("K", K, BTC), Step("V", V, BTC),
        Step("q", split(Q), BHTD), Step("k", split(K), BHTD), Step("v", v, BHTD),
        *rotated,
        Step("q scaled", q * scale, BHTD),
        Step("raw scores", raw, BHTT), Step("scaled scores", scaled, BHTT),
        Step("masked raw scores", raw + mask, BHTT), Step("masked scores", masked, BHTT),
        Step("weights", attention, BHTT), Step("context", context, BHTD),
        Step("merged", merged, BTC), Step("out", out, BTC),
    ]


def reference_output(x: np.ndarray, weights: RoleWeights, heads: int, causal: bool) -> np.ndarray:
    """The reference's output for x (T, C) or (B, T, C), in x's own layout."""
    out = steps(x, weights, heads, causal)[-1].values
    return out if np.ndim(x) == 3 else out[0]
