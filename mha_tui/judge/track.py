"""Follow the reference computation through a recorded forward: where does the module leave it?

Every stage judge looks at one stage from its own input, so a line no rule places (a
`torch.roll` on K, a `relu` on V, a transpose of the scores) passes unseen between judged
stages: each stage is right for what it was given, and only the output is wrong. This
module finds that line.

Each tensor the forward made is matched against the reference's intermediates (numpy_reference
`steps`: x, Q, the heads, raw / scaled / masked scores, weights, context, merged, out) in
any layout a correct module uses: axes permuted (but never a query axis for a key axis),
axes merged or split (`(B * h, T, d_h)`, `(T, B, C)`), one head's slice. A tensor that
matches is *on track*. The module leaves the computation at the first op whose output is
off track and from which nothing on track is ever reached again: a fused (C, 3C)
projection or the pieces of a hand-written softmax are off track too, but their results
(q, k, v; the weights) come back on it.

Reads only records; never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..kinds._parts.maker import api_name
from ..ops.graph import reaching_output, value_inputs
from ..ops.vocab import LARGE_NEGATIVE
from ..records import OpRecord, Recording
from .numpy_reference import Step

ATOL = 1e-5
RTOL = 1e-4


@dataclass(frozen=True)
class Match:
    """A recorded tensor found to be a reference step; dims: the step's label of each of the
    tensor's axes (None where axes were merged or split)."""

    step: str
    dims: tuple[str, ...] | None


@dataclass(frozen=True)
class Departure:
    """Where the module leaves the reference: the op, what its input was, what it made."""

    op: OpRecord
    before: Match | None  # what the op's x-dependent input was on the reference
    constants: tuple[np.ndarray, ...] = ()  # its inputs that do not depend on x


# ---------------------------------------------------------------------------- layouts


def _squeezed(shape: tuple[int, ...]) -> list[int]:
    return [n for n in shape if n != 1]


def regroups(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[bool, bool]:
    """(dst is src with neighbouring axes merged or split, every axis kept whole; dst is src
    up to size-1 axes). A group of src axes may become one dst axis or one src axis several
    dst axes, never several for several (that would cut across an axis)."""
    a, b = _squeezed(src), _squeezed(dst)
    if int(np.prod(a, dtype=np.int64)) != int(np.prod(b, dtype=np.int64)):
        return False, False
    i = j = 0
    while i < len(a) and j < len(b):
        pa, pb, na, nb = a[i], b[j], 1, 1
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa, i, na = pa * a[i], i + 1, na + 1
            else:
                pb, j, nb = pb * b[j], j + 1, nb + 1
        if na > 1 and nb > 1:
            return False, False
    return i == len(a) and j == len(b), a == b


def _labels(dims: tuple[str, ...], perm: tuple[int, ...], shape: tuple[int, ...],
            dst: tuple[int, ...]) -> tuple[str, ...] | None:
    """The step's axis labels in dst's axes when dst is the permuted step with size-1 axes
    added or removed only (else None: axes were merged or split)."""
    permuted = [(dims[p], shape[p]) for p in perm if shape[p] != 1]
    if [n for _, n in permuted] != _squeezed(dst):
        return None
    labels, it = [], iter(permuted)
    for n in dst:
        labels.append("1" if n == 1 else next(it)[0])
    return tuple(labels)


def layouts(step: Step, shape: tuple[int, ...]) -> Iterator[tuple[np.ndarray, tuple[str, ...] | None]]:
    """The step's values laid out as `shape` the ways a correct module lays them out."""
    values, dims = step.values, step.dims
    if int(np.prod(shape, dtype=np.int64)) == values.size:
        yield from _permuted(values, dims, shape)
    if "h" in dims:
        axis = dims.index("h")
        per_head = values.shape[axis]
        if per_head > 1 and values.size // per_head == int(np.prod(shape, dtype=np.int64)):
            rest = dims[:axis] + dims[axis + 1:]
            for head in range(per_head):
                yield from _permuted(np.take(values, head, axis=axis), rest, shape)


def _permuted(values: np.ndarray, dims: tuple[str, ...], shape: tuple[int, ...]
              ) -> Iterator[tuple[np.ndarray, tuple[str, ...] | None]]:
    seen: set[tuple[int, ...]] = set()
    for perm in itertools.permutations(range(values.ndim)):
        if "T'" in dims and perm.index(dims.index("T")) > perm.index(dims.index("T'")):
            continue  # a query axis never stands for a key axis
        moved = values.transpose(perm)
        fits, _ = regroups(moved.shape, shape)
        if not fits or perm in seen:
            continue
        seen.add(perm)
        yield moved.reshape(shape), _labels(dims, perm, values.shape, shape)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal within float32 tolerance; both blocked (-inf, -1e9, finfo.min) or both NaN
    counts as equal."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        finite = b[np.isfinite(b) & (b > LARGE_NEGATIVE)]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
        equal = np.abs(a - b) <= ATOL + RTOL * scale
        equal |= (a <= LARGE_NEGATIVE) & (b <= LARGE_NEGATIVE)
        equal |= np.isnan(a) & np.isnan(b)
    return bool(equal.all())


def match(values: np.ndarray, steps: list[Step]) -> Match | None:
    """The reference step these values are, in some correct layout, or None."""
    values = np.asarray(values)
    if values.dtype.kind != "f" or values.size == 0:  # the reference's steps are real
        return None
    shape = tuple(values.shape)
    flat = values.reshape(-1)
    probe = min(flat.size, 16)
    for step in reversed(steps):  # the latest step first: x @ I is "merged", not "out"
        for laid, dims in layouts(step, shape):
            if not same(flat[:probe], laid.reshape(-1)[:probe]):
                continue
            if same(values, laid):
                return Match(step.name, dims)
    return None


# ---------------------------------------------------------------------------- the graph


def departure(rec: Recording, x_names: set[str], steps: list[Step]) -> Departure | None:
    """The first op that leaves the reference for good (see the module docstring), or None
    when every tensor that reaches the output is on track or comes back on it."""
    ops = rec.ops
    if rec.output is None or rec.output.kind != "op" or rec.output.op is None:
        return None
    from_x = [False] * len(ops)
    consumers: dict[int, list[int]] = {i: [] for i in range(len(ops))}
    for op in ops:
        for ref in value_inputs(op):
            if ref.kind == "input" and ref.name in x_names:
                from_x[op.index] = True
            elif ref.kind == "op" and ref.op is not None:
                consumers[ref.op].append(op.index)
                from_x[op.index] |= from_x[ref.op]
    reaches = reaching_output(rec)
    matched: dict[int, Match | None] = {}
    for op in ops:
        if from_x[op.index] and reaches[op.index]:
            matched[op.index] = next((m for m in (match(o.values, steps) for o in op.outputs)
                                      if m is not None), None)
    comes_back = [False] * len(ops)
    for op in reversed(ops):
        comes_back[op.index] = any(matched.get(c) is not None or comes_back[c]
                                   for c in consumers[op.index])
    for op in ops:
        if op.index not in matched or matched[op.index] is not None or comes_back[op.index]:
            continue
        before = None
        for ref in op.inputs:
            if ref.kind == "input" and ref.name in x_names:
                before = Match("x", ("B", "T", "C")[-rec.snapshot(ref).ndim:])
            elif ref.kind == "op" and ref.op is not None and matched.get(ref.op) is not None:
                before = matched[ref.op]
            if before is not None:
                break
        constants = tuple(np.asarray(rec.snapshot(ref).values) for ref in op.inputs
                          if not (ref.kind == "input" and ref.name in x_names)
                          and not (ref.kind == "op" and ref.op is not None and from_x[ref.op]))
        return Departure(op, before, constants)
    return None


# ---------------------------------------------------------------------------- words

ROLES = {"x": "x", "Q": "Q", "K": "K", "V": "V", "q": "Q", "k": "K", "v": "V",
         "q rotated": "Q", "k rotated": "K", "k shared": "K", "v shared": "V",
         "biased scores": "the scores", "q scaled": "Q", "raw scores": "the scores",
         "scaled scores": "the scores",
         "masked raw scores": "the scores", "masked scores": "the scores",
         "Q normed": "Q", "K normed": "K", "q normed": "Q", "k normed": "K", "q unit": "Q",
         "k unit": "K", "capped scores": "the scores", "scores with sinks": "the scores",
         "weights with sinks": "the attention weights", "difference": "the attention weights",
         "differential context": "the heads' outputs",
         "weights": "the attention weights", "context": "the heads' outputs",
         "merged": "the merged heads", "out": "the output"}
AXES = {"T": "T", "T'": "the keys", "h": "the heads", "d_h": "d_h", "C": "C", "B": "B"}


def _axis(op: OpRecord, before: Match | None, ndim: int) -> tuple[str, int | None]:
    dims = op.kwarg("dims", op.kwarg("dim"))
    scalars = op.scalars()
    if dims is None and op.name == "roll" and len(scalars) > 1:
        dims = scalars[1]
    if dims is None and op.name == "flip" and scalars:
        dims = scalars[0]
    if isinstance(dims, list | tuple):
        dims = dims[0] if len(dims) == 1 else None
    if not isinstance(dims, int):
        return "", None
    axis = dims % ndim if ndim else dims
    if before is None or before.dims is None or axis >= len(before.dims):
        return f"axis {dims}", axis
    return AXES.get(before.dims[axis], before.dims[axis]), axis


def _shift(op: OpRecord) -> int | None:
    shift = op.kwarg("shifts")
    scalars = op.scalars()
    if shift is None and scalars:
        shift = scalars[0]
    if isinstance(shift, list | tuple):
        shift = shift[0] if len(shift) == 1 else None
    return shift if isinstance(shift, int) else None


def _seen_later(shift: int, T: int) -> tuple[int, int] | None:
    """K or V rolled by `shift` along T under a causal mask: the first (query, token) where
    a query now sees a later token."""
    for i in range(T):
        for j in range(i + 1):
            token = (j - shift) % T
            if token > i:
                return i, token
    return None


def describe(found: Departure, T: int) -> str:
    """What the op did, in words, from its name, its arguments and the step it changed."""
    op, before = found.op, found.before
    role = ROLES.get(before.step, before.step) if before is not None else "its input"
    ndim = len(op.inputs[0].snapshot.shape) if op.inputs and op.inputs[0].snapshot else \
        len(before.dims) if before is not None and before.dims else 0
    name = op.name.rstrip("_")
    if name == "roll":
        axis, _ = _axis(op, before, ndim or 4)
        shift = _shift(op)
        words = {1: "one position", 2: "two positions", 3: "three positions"}
        amount = words.get(abs(shift), f"{abs(shift)} positions") if shift else "some positions"
        if shift and shift < 0:
            amount += " back"
        text = f"torch.roll shifted {role} by {amount} along {axis or 'an axis'}"
        if shift and role in ("K", "V") and axis == "T":
            seen = _seen_later(shift, T)
            if seen is not None:
                text += f": token {seen[0]} now sees token {seen[1]}"
        return text
    if name == "flip":
        axis, _ = _axis(op, before, ndim or 4)
        return f"torch.flip reversed {role} along {axis or 'an axis'}"
    if name == "relu":
        return f"torch.relu set the negative entries of {role} to 0"
    if name == "masked_fill" and role == "the scores" and op.outputs:
        fill = next((s for s in op.scalars() if isinstance(s, int | float)), None)
        if fill is not None and math.isfinite(fill) and fill > LARGE_NEGATIVE:
            out = np.asarray(op.outputs[0].values)
            mask = op.inputs[1].snapshot if len(op.inputs) > 1 else None
            where = np.asarray(mask.values) if mask is not None else None
            changed = int(np.count_nonzero(np.broadcast_to(where, out.shape)
                                           if where is not None and where.dtype == bool
                                           else out == fill))
            return (f"Tensor.masked_fill wrote {fill:g} into {changed} entries of the scores, not "
                    f"-inf: softmax still gives each blocked entry a weight (exp({fill:g} - max) / "
                    f"the row's sum), so the tokens it should hide are still seen")
    if name in ("add", "sub") and len(op.inputs) == 2 and before is not None \
            and before.dims is not None and "T'" in before.dims:
        bias = _added(found)
        if bias is not None:
            return _bias_words(bias, role)
    if name == "baddbmm":  # bias + alpha * (q @ k^T): the bias is what changed the scores
        bias = _added(found)
        if bias is not None and bias.size and op.outputs:
            full = np.broadcast_to(bias, op.outputs[0].values.shape)
            return _bias_words(full, "the scores")
    if name in ("add", "sub", "mul", "div", "true_divide") and len(op.inputs) == 1:
        scalar = next((s for s in op.scalars() if isinstance(s, int | float)), None)
        verb = {"add": "added", "sub": "subtracted", "mul": "multiplied", "div": "divided",
                "true_divide": "divided"}[name]
        what = f" {scalar}" if scalar is not None else ""
        joint = {"added": " to", "subtracted": " from"}.get(verb, " by" if verb != "multiplied" else "")
        if verb == "multiplied":
            return f"multiplied every entry of {role} by{what}"
        if verb == "divided":
            return f"divided every entry of {role} by{what}"
        return f"{verb}{what}{joint} every entry of {role}"
    if name in ("transpose", "t", "swapaxes", "swapdims", "permute", "mT"):
        if before is not None and before.dims is not None and "T'" in before.dims:
            return f"{op.name} swapped the query and key axes of {role}: each row now holds " \
                   "what a key received instead of what a query gives"
        return f"{op.name} moved the axes of {role} so that later lines read them as others"
    if name == "getitem":
        index = op.args[1] if len(op.args) > 1 else None
        parts = index if isinstance(index, tuple) and index and index[0] != "slice" else (index,)
        for axis, part in enumerate(parts):
            if isinstance(part, tuple | list) and part and part[0] != "slice" and \
                    all(isinstance(i, int) for i in part):
                label = before.dims[axis] if before is not None and before.dims is not None \
                    and axis < len(before.dims) else f"axis {axis}"
                what = {"h": "heads", "T": "tokens", "T'": "keys"}.get(label, f"{label} entries")
                moved = next((f"{what[:-1]} {i} now holds {what[:-1]} {p}'s"
                              for i, p in enumerate(part) if i != p), "")
                return f"indexing reordered the {what} of {role}" + (f": {moved}" if moved else "")
        return f"indexing reordered or cut {role}"
    if name == "layer_norm":
        return f"a LayerNorm on {role}"
    return f"{api_name(op)} changed the values of {role}"


def _added(found: Departure) -> np.ndarray | None:
    """The tensor an add put on the scores: its one input that does not depend on x."""
    floats = [c for c in found.constants if c.dtype.kind == "f" and c.ndim >= 2]
    return np.asarray(floats[0], dtype=np.float64) if len(floats) == 1 else None


def _bias_words(bias: np.ndarray, role: str) -> str:
    """ALiBi (a per-head slope times the distance j - i), or another bias on the scores."""
    if bias.ndim >= 2 and bias.shape[-1] == bias.shape[-2]:
        T = bias.shape[-1]
        per_head = bias.reshape(-1, T, T)
        distance = np.arange(T)[None, :] - np.arange(T)[:, None]  # j - i
        seen = np.tril(np.ones((T, T), dtype=bool))  # the causal part: what softmax sees
        slopes = []
        for head in per_head:
            usable = seen & (distance != 0)
            if not usable.any():
                break
            # a constant per row changes nothing after softmax: each row from its diagonal
            relative = head - np.diag(head)[:, None]  # (T, T): bias[i, j] - bias[i, i]
            slope = float(np.median(relative[usable] / distance[usable]))
            if not np.allclose(relative[seen], slope * distance[seen], atol=1e-5, rtol=1e-4):
                break
            slopes.append(slope)
        else:
            if slopes:
                text = ", ".join(f"{abs(m):.4g}" for m in slopes[:4])
                more = ", ..." if len(slopes) > 4 else ""
                return (f"ALiBi bias added to the scores: each head's scores fall linearly "
                        f"with the distance to the key (slopes {text}{more})")
    return f"a bias (not a mask) added to {role}"


__all__ = ["Departure", "Match", "departure", "describe", "layouts", "match", "regroups", "same"]
