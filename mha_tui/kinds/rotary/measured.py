"""Rotary found from the values, whatever ops spell it: the ops between one head tensor
and a tensor of the same shape, made only of elementwise and shape ops with tables that do
not come from x, turn every channel pair by one angle per position. torchtune and gpt-fast
(interleaved pairs through `reshape(..., -1, 2)`, `stack` and `flatten`), gpt-oss
(`torch.chunk` halves and `cat`), nanochat (`x1 * (-sin) + x2 * cos`), ESM-2 (`chunk`/`cat`
after the heads are folded into the batch axis), a YaRN table scaled by its attention factor.

The angles are measured: per position t and pair i, the (cos, sin) that carry the pair of
the tensor before to the pair after, fitted over every other axis (heads, batch); the turn
must be the same for all of them and leave position 0 where it is.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from ...ops.numeric import tolerance
from ...records import Ref
from .._parts.chains import region, same, walk

# What the ops between the head tensor and the turned one may be.
WALK = frozenset({
    "mul", "add", "sub", "neg", "cat", "stack", "getitem", "flatten", "view", "reshape",
    "unsqueeze", "squeeze", "float", "to", "type_as", "contiguous", "chunk", "split", "unbind",
    "mul_", "add_", "sub_", "rsub", "repeat_interleave", "unflatten", "concat", "concatenate",
    "__getitem__", "select", "narrow", "clone", "expand", "expand_as", "broadcast_to",
})


def _halves(values: np.ndarray, pairing: str) -> tuple[np.ndarray, np.ndarray]:
    r = values.shape[-1]
    if pairing == "half":
        return values[..., : r // 2], values[..., r // 2:]
    return values[..., 0::2], values[..., 1::2]


def fit(before: np.ndarray, after: np.ndarray, T: int, start: int = 0
        ) -> tuple[str, int, np.ndarray, np.ndarray, float] | None:
    """(pairing, token axis, cos (T, r/2), sin (T, r/2), scale) when `after` is `before` turned
    pair by pair by one angle per position (and scaled by one number: YaRN's attention
    factor, 1 for plain rotary); None otherwise. start: the first token's position (a decode
    step's new token comes after the cached ones)."""
    x, y = before.astype(np.float64), after.astype(np.float64)
    if x.shape != y.shape or x.ndim < 2 or x.shape[-1] < 2 or x.shape[-1] % 2:
        return None
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return None
    if np.allclose(x, y):
        return None
    size = max(1.0, float(np.abs(x).max(initial=0.0)))
    # one token (a decode step): every axis but the channels is read as one position
    axes = [a for a in range(x.ndim - 1) if x.shape[a] == T] if T > 1 else \
        [a for a in range(x.ndim - 1) if x.shape[a] == 1][-1:] or [x.ndim - 2]
    for pairing in ("half", "interleaved"):
        a, b = _halves(x, pairing)
        a2, b2 = _halves(y, pairing)
        for axis in axes:
            def flat(v: np.ndarray, axis: int = axis) -> np.ndarray:
                moved = np.moveaxis(v, axis, 0)
                return moved.reshape(moved.shape[0], -1, moved.shape[-1])  # (T, rest, r/2)

            fa, fb, fa2, fb2 = flat(a), flat(b), flat(a2), flat(b2)
            norm = (fa * fa + fb * fb).sum(axis=1)
            if (norm <= 1e-12).any():
                continue
            cos = (fa * fa2 + fb * fb2).sum(axis=1) / norm  # (T, r/2), scaled
            sin = (fa * fb2 - fb * fa2).sum(axis=1) / norm
            turned_a = fa * cos[:, None] - fb * sin[:, None]
            turned_b = fb * cos[:, None] + fa * sin[:, None]
            if not (np.allclose(turned_a, fa2, **tolerance(atol=1e-5 * size, rtol=1e-4))
                    and np.allclose(turned_b, fb2, **tolerance(atol=1e-5 * size, rtol=1e-4))):
                continue
            scale = np.hypot(cos, sin)
            m = float(scale.mean())
            if m <= 1e-6 or not np.allclose(scale, m, **tolerance(atol=1e-8, rtol=1e-4)):
                continue
            cos, sin = cos / m, sin / m
            if start == 0 and not (np.allclose(cos[0], 1.0, **tolerance(atol=1e-4, rtol=1e-5))
                                   and np.allclose(sin[0], 0.0, **tolerance(atol=1e-4, rtol=1e-5))):
                continue  # position 0 is not turned (a swap of halves is not rotary)
            if start and _quarter_turns(cos[0], sin[0]):
                continue  # from position start on: a swap or negation of halves is no rotary
            if np.abs(sin).max() <= max(1e-6, 4 * tolerance(atol=0.0)["atol"]):
                continue  # nothing turned (in bfloat16, a scaling's rounding is no turn)
            return pairing, axis, cos, sin, m
    return None


def _quarter_turns(cos: np.ndarray, sin: np.ndarray) -> bool:
    """Every pair turned by a multiple of a quarter turn: channels swapped or negated, what no
    rotary does at a position t >= 1 (pair 0 turns by t·ω_0 radians, ω_0 = 1 in every base)."""
    quarters = np.arctan2(sin, cos) / (np.pi / 2)
    return bool(np.allclose(quarters, np.round(quarters), atol=1e-4))


def pass_through(before: np.ndarray, after: np.ndarray) -> int:
    """How many of the last channels come through unchanged (a partial rotary's rest)."""
    d = before.shape[-1]
    kept = 0
    while kept < d and np.array_equal(before[..., d - 1 - kept], after[..., d - 1 - kept]):
        kept += 1
    return kept


def _slice_ref(g, ops: set[int], source: Ref, start: int | None, stop: int | None) -> Ref | None:
    """A getitem among `ops` that takes source[..., start:stop]."""
    for i in sorted(ops):
        op = g.ops[i]
        if op.name != "getitem" or not op.inputs or not same(op.inputs[0], source):
            continue
        index = op.args[1] if len(op.args) > 1 else None
        parts = index if isinstance(index, tuple) and index and isinstance(index[0], tuple | str) \
            else (index,)
        last = parts[-1] if parts else None
        if isinstance(last, tuple) and last and last[0] == "slice" and \
                (last[1] or 0) == (start or 0) and last[2] == stop:
            return Ref("op", op=i)
    return None


def measured(g, sizes) -> list[tuple]:
    """Every rotation found from the values: (before, rotated_in, after, passed, r, pairing,
    cos, sin, scale, ops), the latest end of each chain (a `type_as` after the `flatten` joins
    it)."""
    found: dict[tuple, tuple] = {}
    for end in g.ops:
        if not g.from_x[end.index] or end.name not in WALK or g.kind.get(end.index) == "project":
            continue
        out = end.out.values
        if out.dtype.kind != "f" or out.ndim < 2 or out.shape[-1] < 2:
            continue
        for source in walk(g, end, WALK):
            before = g.snap(source).values
            if before.shape != out.shape or before.dtype.kind != "f":
                continue
            ops = region(g, end, source, WALK)
            if ops is None:
                continue
            d = out.shape[-1]
            kept = pass_through(before, out)
            r = d - kept
            rotated_in, passed = source, None
            if kept:
                if r < 2 or r % 2:
                    continue
                rotated_in = _slice_ref(g, ops, source, None, r)
                passed = _slice_ref(g, ops, source, r, None)
                if rotated_in is None or passed is None:
                    continue
            turned = fit(before[..., :r], out[..., :r], sizes.T, sizes.start)
            if turned is None:
                continue
            pairing, _, cos, sin, scale = turned
            key = (source.kind, source.op, source.output, source.name)
            if key in found and not np.isclose(found[key][8], scale, **tolerance(atol=1e-8, rtol=1e-4)):
                break  # a scale after the turn (q * d_h ** -0.5) is not part of it
            for other in [k for k, v in found.items() if k != key and v[9] < frozenset(ops)]:
                del found[other]  # the same turn seen on the pairs' own shape, inside this one
            found[key] = (source, rotated_in, Ref("op", op=end.index), passed, r, pairing, cos,
                          sin, scale, frozenset(ops))
            break
    return list(found.values())
