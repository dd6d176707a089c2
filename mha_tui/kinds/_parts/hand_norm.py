"""A LayerNorm or RMSNorm written out op by op (Hugging Face's `LlamaRMSNorm`, Qwen3's and
OLMo 2's q/k norms: `pow`, `mean`, `rsqrt`, `mul`; Cohere's LayerNorm: `mean`, `sub`, ...),
found from the values: the ops between one x-derived tensor and one of the same shape,
elementwise ops and reductions over the last axis only, make that tensor normalised over its
last axis (centred first for a LayerNorm), times one weight per channel (plus a bias).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

import numpy as np

from ...ops.graph import Graph
from ...ops.numeric import tolerance
from ...records import Ref
from .chains import region, walk

BY_HAND = frozenset({
    "pow", "mean", "add", "rsqrt", "sqrt", "mul", "div", "true_divide", "sub", "float", "to",
    "type_as", "var", "square", "reciprocal", "mul_", "add_", "sub_", "div_", "rsub", "neg",
    "contiguous", "std", "__rtruediv__", "__rdiv__",
})
_REDUCTIONS = {"mean", "var", "std"}


@dataclass(frozen=True)
class HandNorm:
    """One norm written by hand: what went in, what came out, and what it is."""

    before: Ref
    after: Ref
    rms: bool  # RMSNorm (no centring) or LayerNorm
    eps: float
    weight: np.ndarray  # per channel (ones when the module has none)
    bias: np.ndarray | None
    ops: frozenset[int]

    @property
    def name(self) -> str:
        return "RMSNorm" if self.rms else "LayerNorm"


def recompute(x: np.ndarray, rms: bool, eps: float) -> np.ndarray:
    """x normalised over its last axis (float64), before the weight."""
    x = x.astype(np.float64)
    centred = x if rms else x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps)


def _eps_candidates(g: Graph, ops: set[int]) -> list[float]:
    found = [float(a) for i in sorted(ops) for a in g.ops[i].scalars()
             if g.ops[i].name in ("add", "add_") and isinstance(a, float) and 0 < a < 1e-2]
    return found or [1e-6, 1e-5]


def _fit(x: np.ndarray, y: np.ndarray, rms: bool, eps: float
         ) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The per-channel weight (and a LayerNorm's bias) that make y from x normalised."""
    n = recompute(x, rms, eps).reshape(-1, x.shape[-1])
    target = y.astype(np.float64).reshape(-1, x.shape[-1])
    if rms:
        denominator = (n * n).sum(axis=0)
        if (denominator <= 1e-12).any():
            return None
        weight, bias = (n * target).sum(axis=0) / denominator, None
        made = n * weight
    else:
        weight = np.empty(x.shape[-1])
        bias = np.empty(x.shape[-1])
        for c in range(x.shape[-1]):
            design = np.stack([n[:, c], np.ones(n.shape[0])], axis=1)
            (weight[c], bias[c]), *_ = np.linalg.lstsq(design, target[:, c], rcond=None)
        made = n * weight + bias
        if np.allclose(bias, 0.0, **tolerance(atol=1e-6, rtol=1e-5)):
            bias = None
    size = max(1.0, float(np.abs(target).max(initial=0.0)))
    if not np.allclose(made, target, **tolerance(atol=1e-4 * size, rtol=1e-3)):
        return None
    return weight, bias


def _found_at(g: Graph, end_index: int) -> HandNorm | None:
    end = g.ops[end_index]
    out = end.out.values
    if out.dtype.kind != "f" or out.ndim < 2 or out.shape[-1] < 2:
        return None
    for source in walk(g, end, BY_HAND):
        x = g.snap(source).values
        if x.shape != out.shape or x.dtype.kind != "f":
            continue
        ops = region(g, end, source, BY_HAND)
        if ops is None or not any(g.ops[i].name in _REDUCTIONS for i in ops):
            continue
        if not (np.isfinite(x).all() and np.isfinite(out).all()):
            return None
        for rms in (True, False):
            for eps in _eps_candidates(g, ops):
                fitted = _fit(x, out, rms, eps)
                if fitted is not None:
                    return HandNorm(source, Ref("op", op=end_index), rms, eps, fitted[0],
                                    fitted[1], frozenset(ops))
    return None


_CASTS = {"to", "type_as", "float", "contiguous"}


def _continues(g: Graph, op, earlier: HandNorm) -> bool:
    """A later op still belongs to the norm: a dtype cast, or the multiplication by the
    norm's own weight (a 1-D tensor of one number per channel); a scale after the norm
    (q * d_h ** -0.5) does not."""
    if op.name in _CASTS:
        return True
    tables = [g.snap(r).values for r in g.other_inputs(op)]
    return op.name in ("mul", "mul_") and np.allclose(earlier.weight, 1.0) and \
        any(t.ndim == 1 and t.shape[0] == op.out.values.shape[-1] for t in tables)


_FOUND: WeakKeyDictionary[Graph, tuple[int, list[HandNorm]]] = WeakKeyDictionary()


def hand_norms(g: Graph) -> list[HandNorm]:
    """Every norm written by hand in the forward (the latest end of each: the `.to(dtype)`
    after the weight joins it), found once per number of projections classified."""
    known = sum(1 for kind in g.kind.values() if kind == "project")
    cached = _FOUND.get(g)
    if cached is None or cached[0] != known:
        found: dict[tuple, HandNorm] = {}
        for op in g.ops:
            if not g.from_x[op.index] or op.name not in BY_HAND or g.kind.get(op.index) == "project":
                continue
            norm = _found_at(g, op.index)
            if norm is not None:
                key = (norm.before.kind, norm.before.op, norm.before.output, norm.before.name)
                if key not in found or _continues(g, op, found[key]):
                    found[key] = norm
        _FOUND[g] = cached = (known, list(found.values()))
    return cached[1]
