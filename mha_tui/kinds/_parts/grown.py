"""What `check --expect MECHANISM` grows the reference by, read from the module's own stage
of that kind: the parameters a named mechanism needs beyond the role weights (a cap, a
learned scale per head, a norm's weight, a sink logit per head, a position bias), each
with the words the verdict says it in.

Each mechanism's kind module gives one `Part` (its `reference(j)`); the judge hands the
parts to the NumPy reference (judge/numpy_reference.steps), which applies each where the
mechanism acts in the forward. Plain frozen data; never import torch, rich, textual or
typer here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np


@dataclass(frozen=True)
class QKNorm:
    """A LayerNorm or RMSNorm on q or k: over each head's d_h channels (`per_head`, Qwen3)
    or over the whole projection (OLMo 2), with the module's weight (and bias) and eps;
    `after_rotary`: applied to the rotated q and k (nanochat) instead of before."""

    rms: bool
    eps: float
    weight: np.ndarray | None
    bias: np.ndarray | None
    per_head: bool
    after_rotary: bool = False

    def apply(self, t: np.ndarray) -> np.ndarray:
        """t normalised over its last axis (float64), times the weight, plus the bias."""
        t = np.asarray(t, dtype=np.float64)
        centred = t if self.rms else t - t.mean(axis=-1, keepdims=True)
        normed = centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + self.eps)
        if self.weight is not None:
            normed = normed * np.asarray(self.weight, dtype=np.float64)
        return normed if self.bias is None else normed + np.asarray(self.bias, dtype=np.float64)

    @property
    def name(self) -> str:
        return "RMSNorm" if self.rms else "LayerNorm"


@dataclass(frozen=True)
class Differential:
    """Differential attention (Diff Transformer, DiffLlama): head i's two softmax maps are
    those of query/key heads `pairs`' (a_i, b_i) (d_h = C / h each); the second, times `lam`,
    is subtracted from the first; the difference times [v_a | v_b] (2 d_h channels), an
    RMSNorm over them (`weight`, `eps`), times `factor` (1 − λ_init). pairs "adjacent":
    (2i, 2i + 1), unilm's view of 2h heads; "halves": (i, i + h/2), DiffLlama's chunks."""

    lam: float
    factor: float
    weight: np.ndarray | None
    eps: float
    pairs: str = "adjacent"

    def heads(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        """(a, b): each output head's first and second map's head."""
        half = np.arange(h // 2)
        return (2 * half, 2 * half + 1) if self.pairs == "adjacent" else (half, half + h // 2)


@dataclass(frozen=True)
class Part:
    """One mechanism's share of the reference: the fields of `Grown` it sets, and its words
    ("logit soft-capping (cap 50)")."""

    words: str
    softcap: float | None = None
    cosine: np.ndarray | None = None
    q_norm: QKNorm | None = None
    k_norm: QKNorm | None = None
    sinks: np.ndarray | None = None
    bias: np.ndarray | None = None
    score_scale: float | None = None
    differential: Differential | None = None

    def parameters(self) -> tuple[tuple[str, object], ...]:
        """Its parameters as JSON values, for a grader's script (the verdict's reference)."""
        said: list[tuple[str, object]] = []
        if self.softcap is not None:
            said.append(("cap", float(self.softcap)))
        if self.cosine is not None:
            said.append(("scale", _numbers(self.cosine)))
        for role, norm in (("q_norm", self.q_norm), ("k_norm", self.k_norm)):
            if norm is not None:
                said.append((role, {"norm": norm.name, "over": "head" if norm.per_head
                                    else "projection", "after_rotary": norm.after_rotary,
                                    "eps": float(norm.eps)}))
        if self.sinks is not None:
            said.append(("sink_logits", _numbers(self.sinks)))
        if self.bias is not None:  # the module's own terms: their shape, not every number
            said.append(("bias_shape", [int(n) for n in np.shape(self.bias)]))
        if self.score_scale is not None:
            said.append(("score_scale", float(self.score_scale)))
        if self.differential is not None:
            d = self.differential
            said += [("lambda", float(d.lam)), ("factor", float(d.factor)), ("pairs", d.pairs)]
        return tuple(said)


def _numbers(values: np.ndarray) -> list[float]:
    return [float(f"{v:.6g}") for v in np.asarray(values, dtype=np.float64).reshape(-1)]


@dataclass(frozen=True)
class Grown:
    """Every mechanism's parts merged: what numpy_reference.steps applies."""

    softcap: float | None = None  # cap · tanh(scores / cap), before the mask
    cosine: np.ndarray | None = None  # unit-length q and k, the cosines times this (per head)
    q_norm: QKNorm | None = None
    k_norm: QKNorm | None = None
    sinks: np.ndarray | None = None  # (h, n): n learned logits per head appended, dropped after
    bias: np.ndarray | None = None  # added to the scaled scores: (h, T, T) or (B, h, T, T)
    score_scale: float | None = None  # instead of 1/sqrt(d_h) (DeBERTa's 1/sqrt(3 d_h))
    differential: Differential | None = None
    words: tuple[str, ...] = field(default=())
    parts: tuple[tuple[str, Part], ...] = field(default=())  # (--expect name, its part)

    @classmethod
    def of(cls, parts: list[tuple[str, Part]]) -> Grown:
        grown = cls()
        for name, part in parts:
            changes = {f.name: getattr(part, f.name) for f in fields(part)
                       if f.name != "words" and getattr(part, f.name) is not None}
            grown = replace(grown, **changes, words=(*grown.words, part.words),
                            parts=(*grown.parts, (name, part)))
        return grown
