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

from ..kinds._parts.grown import Grown
from ..kinds.position_bias import alibi_slopes
from ..records.verdict import RoleWeights


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


def rotate(t: np.ndarray, layout: str, base: float = ROTARY_BASE, dims: int | None = None,
           sign: int = 1, inv_freq: np.ndarray | None = None, factor: float = 1.0) -> np.ndarray:
    """Rotary positions on (B, h, T, d_h): the first `dims` channels of each head (all of
    them, or the largest even number, by default) turned, the rest passed through.

    layout "half": Llama's and GPT-NeoX's rotate_half (channel i pairs with i + r/2);
    "interleaved": GPT-J's and Meta's Llama's (channel 2i pairs with 2i + 1). sign -1 turns
    the other way (nanochat's `x1 * cos + x2 * sin`, `x1 * (-sin) + x2 * cos`): q·k still
    depends on t - s only. inv_freq: the module's own frequencies when they are a rope
    scaling of base's (Llama 3, YaRN), and factor YaRN's attention factor on cos and sin."""
    T, d = t.shape[-2], t.shape[-1]
    r = dims if dims is not None else d - d % 2
    turned_part, passed = t[..., :r], t[..., r:]
    if inv_freq is None:
        inv_freq = 1.0 / base ** (np.arange(0, r, 2, dtype=np.float64) / r)  # (r/2,)
    angles = sign * np.outer(np.arange(T, dtype=np.float64), inv_freq)  # (T, r/2)
    if layout == "half":
        angles = np.concatenate([angles, angles], axis=-1)  # (T, r)
        half = r // 2
        turned = np.concatenate([-turned_part[..., half:], turned_part[..., :half]], axis=-1)
    else:
        angles = np.repeat(angles, 2, axis=-1)  # (T, r)
        turned = np.stack([-turned_part[..., 1::2], turned_part[..., 0::2]],
                          axis=-1).reshape(turned_part.shape)
    rotated = (turned_part * np.cos(angles) + turned * np.sin(angles)) * factor
    return np.concatenate([rotated, passed], axis=-1)


def alibi_bias(heads: int, T: int) -> np.ndarray:
    """(h, T, T): head h adds m_h (j - i) to the score of query i for key j (0 on the
    diagonal, more negative the further back the key)."""
    distance = np.arange(T)[None, :] - np.arange(T)[:, None]  # (T, T): j - i
    return alibi_slopes(heads)[:, None, None] * distance  # (h, T, T)


def kv_heads(weights: RoleWeights, heads: int) -> int:
    """How many K/V heads the role weights make: h, or fewer shared ones (GQA, MQA)."""
    C = np.shape(weights.q[0])[0]
    d_h = C // heads
    return max(1, np.shape(weights.k[0])[0] // d_h) if d_h else heads


def steps(x: np.ndarray, weights: RoleWeights, heads: int, causal: bool, *,
          window: int | None = None, rotary: str | None = None, rotary_dims: int | None = None,
          base: float = ROTARY_BASE, alibi: bool = False, rotary_sign: int = 1,
          rotary_freq: np.ndarray | None = None, rotary_factor: float = 1.0,
          grown: Grown | None = None, padding: np.ndarray | None = None) -> list[Step]:
    """Every intermediate of softmax(Q_i K_i^T / sqrt(d_h) + mask) V_i, heads side by side,
    then W_O (the identity when the module has none); x (T, C) or (B, T, C).

    Grown by what the weights show and what the learner meant to build: K and V weights of
    h_kv * d_h rows (h_kv < h) are shared K/V heads, query head j reading K/V head
    j // (h / h_kv) (Llama's repeat_kv); with `rotary` ("half" or "interleaved"), q and k
    are rotated by position first (`rotary_dims` channels of each head, `base`); with
    `alibi`, each head's scaled scores get ALiBi's bias m_h (j - i); with `window` w, each
    query sees only the keys less than w tokens back; `causal` False blocks nothing.

    `grown`: the named mechanisms `check --expect` asked for, with the module's own
    parameters (kinds/_parts/grown.py), each where it acts: a q/k norm over the whole
    projection before the head split, per head before (or after) the rotary; cosine
    attention's unit-length q and k and learned scale in place of 1/sqrt(d_h); a position
    bias on the scaled scores; soft-capping before the mask; sinks appended before softmax
    and dropped after. `padding` (B, T), True where a padded batch's row is padding
    (`--batch`): those keys are blocked for every query of their row."""
    g = grown or Grown()
    x = np.asarray(x, dtype=np.float64)
    batched = x if x.ndim == 3 else x[None]  # (B, T, C)
    B, T, C = batched.shape
    d_h = C // heads
    h_kv = kv_heads(weights, heads)

    def split(t: np.ndarray, n: int = heads) -> np.ndarray:
        return t.reshape(B, T, n, d_h).transpose(0, 2, 1, 3)  # (B, n, T, d_h)

    Q, K, V = (_linear(batched, w) for w in (weights.q, weights.k, weights.v))  # K, V (B, T, h_kv d_h)
    BTC, BHTD, BHTT = ("B", "T", "C"), ("B", "h", "T", "d_h"), ("B", "h", "T", "T'")
    grown: list[Step] = []
    Qn, Kn = Q, K
    if g.q_norm is not None and not g.q_norm.per_head:  # OLMo 2: the whole projection
        Qn = g.q_norm.apply(Q)
        grown.append(Step("Q normed", Qn, BTC))
    if g.k_norm is not None and not g.k_norm.per_head:
        Kn = g.k_norm.apply(K)
        grown.append(Step("K normed", Kn, BTC))
    q, k, v = split(Qn), split(Kn, h_kv), split(V, h_kv)  # (B, h, T, d_h); K, V (B, h_kv, T, d_h)

    def per_head_norms(after_rotary: bool) -> None:
        nonlocal q, k
        for role, norm in (("q", g.q_norm), ("k", g.k_norm)):
            if norm is None or not norm.per_head or norm.after_rotary is not after_rotary:
                continue
            if role == "q":
                q = norm.apply(q)
            else:
                k = norm.apply(k)
            grown.append(Step(f"{role} normed", q if role == "q" else k, BHTD))

    per_head_norms(False)
    if rotary is not None:
        q = rotate(q, rotary, base, rotary_dims, rotary_sign, rotary_freq, rotary_factor)
        k = rotate(k, rotary, base, rotary_dims, rotary_sign, rotary_freq, rotary_factor)
        grown += [Step("q rotated", q, ("B", "h", "T", "d_h")),
                  Step("k rotated", k, ("B", "h", "T", "d_h"))]
    per_head_norms(True)
    if g.cosine is not None:  # unit length over each head's channels
        q = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
        k = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-12)
        grown += [Step("q unit", q, BHTD), Step("k unit", k, BHTD)]
    if h_kv != heads:
        k = np.repeat(k, heads // h_kv, axis=1)  # (B, h, T, d_h): head j is K/V head j // n
        v = np.repeat(v, heads // h_kv, axis=1)
        grown += [Step("k shared", k, ("B", "h", "T", "d_h")),
                  Step("v shared", v, ("B", "h", "T", "d_h"))]
    scale = 1.0 / np.sqrt(d_h) if g.score_scale is None else g.score_scale
    raw = q @ k.transpose(0, 1, 3, 2)  # (B, h, T, T)
    blocked = np.triu(np.ones((T, T), dtype=bool), k=1) if causal else np.zeros((T, T), bool)
    if window is not None:
        blocked |= np.tril(np.ones((T, T), dtype=bool), k=-window)
    if padding is not None:  # (B, 1, T, T): each row's padded keys, for every query
        blocked = blocked[None, None] | np.asarray(padding, dtype=bool)[:, None, None, :]
    mask = np.where(blocked, -np.inf, 0.0)
    if g.cosine is not None:  # the cosines times the learned scale per head
        per_head = np.broadcast_to(np.asarray(g.cosine, dtype=np.float64).reshape(-1),
                                   (heads,)) if np.size(g.cosine) in (1, heads) else None
        if per_head is None:
            raise ValueError(f"a cosine scale of {np.size(g.cosine)} numbers for {heads} heads")
        scaled = raw * per_head[None, :, None, None]
    else:
        scaled = raw * scale
    biased = scaled + alibi_bias(heads, T) if alibi else scaled  # (B, h, T, T)
    extra: list[Step] = [Step("biased scores", biased, BHTT)] if alibi else []
    if g.bias is not None:  # a position bias the module adds, as it adds it
        biased = biased + np.asarray(g.bias, dtype=np.float64).reshape(
            (-1, heads, T, T) if np.size(g.bias) % (heads * T * T) == 0 else np.shape(g.bias))
        extra.append(Step("biased scores", biased, BHTT))
    if g.softcap is not None:
        biased = g.softcap * np.tanh(biased / g.softcap)
        extra.append(Step("capped scores", biased, BHTT))
    masked = biased + mask
    with np.errstate(invalid="ignore", over="ignore"):
        if g.sinks is not None:  # one column per sink logit, per head, dropped after softmax
            sinks = np.asarray(g.sinks, dtype=np.float64).reshape(heads, -1)
            column = np.broadcast_to(sinks[None, :, None, :], (B, heads, T, sinks.shape[-1]))
            with_sinks = np.concatenate([masked, column], axis=-1)  # (B, h, T, T + n)
            extra.append(Step("scores with sinks", with_sinks, ("B", "h", "T", "T+")))
        else:
            with_sinks = masked
        shifted = with_sinks - with_sinks.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        attention = e / e.sum(axis=-1, keepdims=True)  # (B, h, T, T)
        if g.sinks is not None:
            extra.append(Step("weights with sinks", attention, ("B", "h", "T", "T+")))
            attention = attention[..., :T]
    context = attention @ v  # (B, h, T, d_h)
    if g.differential is not None:  # two maps per head, their difference times [v_a | v_b]
        dif = g.differential
        a, b = dif.heads(heads)
        difference = attention[:, a] - dif.lam * attention[:, b]  # (B, h/2, T, T)
        both = np.concatenate([v[:, a], v[:, b]], axis=-1)  # (B, h/2, T, 2 d_h)
        raw_context = difference @ both
        normed = raw_context / np.sqrt((raw_context ** 2).mean(axis=-1, keepdims=True) + dif.eps)
        if dif.weight is not None:
            normed = normed * np.asarray(dif.weight, dtype=np.float64)
        context = normed * dif.factor  # (B, h/2, T, 2 d_h)
        extra += [Step("difference", difference, ("B", "h/2", "T", "T'")),
                  Step("differential context", raw_context, ("B", "h/2", "T", "2d_h"))]
    merged = context.transpose(0, 2, 1, 3).reshape(B, T, C)  # (B, T, C)
    out = merged if weights.o is None else _linear(merged, weights.o)
    return [
        Step("x", batched, BTC),
        Step("Q", Q, BTC), Step("K", K, BTC), Step("V", V, BTC),
        Step("q", split(Q), BHTD), Step("k", split(K, h_kv), BHTD),
        Step("v", split(V, h_kv), BHTD),
        *grown,
        Step("q scaled", q * scale, BHTD),
        Step("raw scores", raw, BHTT), Step("scaled scores", scaled, BHTT),
        *extra,
        Step("masked raw scores", raw + mask, BHTT), Step("masked scores", masked, BHTT),
        Step("weights", attention, BHTT), Step("context", context, BHTD),
        Step("merged", merged, BTC), Step("out", out, BTC),
    ]


def reference_output(x: np.ndarray, weights: RoleWeights, heads: int, causal: bool) -> np.ndarray:
    """The reference's output for x (T, C) or (B, T, C), in x's own layout."""
    out = steps(x, weights, heads, causal)[-1].values
    return out if np.ndim(x) == 3 else out[0]
