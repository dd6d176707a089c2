"""rotary: rotary position embedding (RoPE), q and k turned pair by pair by an angle that
grows with the token's position, before the scores.

Recognised from the ops and checked on the values, never from names: an add of two products
`x * cos + rot(x) * sin` where rot(x) is x with its channel pairs swapped and one negated
(the half-split `rotate_half` of GPT-NeoX and Llama, or the interleaved `rotate_every_two`
of GPT-J), or a complex product `view_as_complex(x) * freqs_cis` (Meta's Llama reference).
The tables must hold the cosine and sine of one angle (cos^2 + sin^2 = 1), and the recorded
output must equal the recorded input turned by them, pair by pair. A partial rotary (only
the first r of d_h channels turned, the rest passed through and joined back with `cat`) is
one rotation of the slice.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np

from ...records import Check, OpRecord, Ref, Stage, Trace
from ..builder import BHTD, BTHD
from ..cell import Cell, Term, Why, WhyError, maker, reindex, where
from ..graph import Graph
from ..grouping import Unit
from ..maker import StageMaker, synthetic
from ..quizzing import Question, number_text
from ..sizes import Sizes

if TYPE_CHECKING:
    from ...judge.judging import Judge, Row

KIND = "rotary"
TITLE = "Rotary positions: turn Q and K by each token's position"
# Ops a rotation is written with, between the head tensor and the rotated one.
_ELEMENTWISE = {"mul", "add", "sub", "neg", "cat", "stack", "getitem", "flatten", "view",
                "reshape", "unsqueeze", "float", "to", "type_as", "contiguous", "view_as_complex",
                "view_as_real", "repeat_interleave", "mul_", "add_"}
_COMPLEX_WRAP = {"view_as_complex", "reshape", "view", "float", "to", "type_as", "contiguous"}
_COMPLEX_UNWRAP = {"view_as_real", "flatten", "reshape", "view", "type_as", "to", "float"}


@dataclass(frozen=True)
class Rotation:
    """One rotated tensor (q or k): what went in, what came out, and the module's tables."""

    before: Ref  # the head tensor before rotary (all d_h channels)
    rotated_in: Ref  # the part turned: `before`, or its first r channels
    after: Ref  # the tensor that goes on to the scores (the pass-through joined back)
    passed: Ref | None  # the channels passed through unchanged (partial rotary)
    r: int  # channels turned per head
    pairing: str  # "half": (i, i + r/2); "interleaved": (2i, 2i + 1)
    cos: np.ndarray  # (T, r/2): the module's cos per position and pair
    sin: np.ndarray
    ops: frozenset[int]  # every op from rotated_in to after


# Found once per graph and number of projections known: the rules run op by op, and a
# rotation is recognised from the projections its tensors come from.
_FOUND: WeakKeyDictionary[Graph, tuple[int, list[Rotation]]] = WeakKeyDictionary()


def rotations(g: Graph, sizes: Sizes) -> list[Rotation]:
    """Every rotary rotation in the forward whose projection is already classified."""
    known = sum(1 for kind in g.kind.values() if kind == "project")
    cached = _FOUND.get(g)
    if cached is None or cached[0] != known:
        _FOUND[g] = cached = (known, _find(g, sizes))
    return cached[1]


def turns_by_position(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """An op of a rotary rotation: from the head tensor to the rotated q or k."""
    if op.name not in _ELEMENTWISE or not g.op_derives(op, {"project"}):
        return None
    return KIND if any(op.index in rot.ops for rot in rotations(g, sizes)) else None


RULES = (turns_by_position,)


# ---------------------------------------------------------------- finding rotations


def _vector_and_table(g: Graph, op: OpRecord) -> tuple[Ref, Ref] | None:
    """A product of a projected tensor and a table that does not come from a projection."""
    if op.name != "mul" or len(op.inputs) != 2:
        return None
    a, b = op.inputs
    projected = [g.derives(ref, {"project"}) for ref in (a, b)]
    if projected == [True, False]:
        return a, b
    if projected == [False, True]:
        return b, a
    return None


def _reaches(g: Graph, ref: Ref, target: Ref, steps: int = 8) -> bool:
    """ref is target, or is made from it through a few elementwise and shape ops."""
    todo, seen = [ref], set()
    while todo and steps:
        r = todo.pop()
        if _same(r, target):
            return True
        op = g.producer(r)
        if op is None or op.index in seen or op.name not in _ELEMENTWISE:
            continue
        seen.add(op.index)
        steps -= 1
        todo.extend(i for i in op.inputs if g.derives(i, {"project"}) or _same(i, target))
    return False


def _same(a: Ref, b: Ref) -> bool:
    return (a.kind == b.kind == "op" and a.op == b.op and a.output == b.output) or (
        a.kind == b.kind == "input" and a.name == b.name)


def _t_axis(shape: tuple[int, ...], table: tuple[int, ...], T: int) -> int | None:
    """The axis of the tokens: where the table varies with length T (right-aligned)."""
    for axis in range(2, len(shape) + 1):
        size = table[-axis] if axis <= len(table) else 1
        if shape[-axis] == T and size == T:
            return -axis
    return None


def _per_position(table: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """The table broadcast to shape, reduced to (T, last): the first row of every other axis."""
    full = np.broadcast_to(table, shape)
    moved = np.moveaxis(full, axis, -2)
    return moved.reshape(-1, *moved.shape[-2:])[0]


def _pairs(values: np.ndarray, pairing: str) -> tuple[np.ndarray, np.ndarray]:
    r = values.shape[-1]
    if pairing == "half":
        return values[..., : r // 2], values[..., r // 2:]
    return values[..., 0::2], values[..., 1::2]


def _rotate(values: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairing: str) -> np.ndarray:
    """values turned pair by pair by the angles whose cos and sin are given (..., r/2)."""
    a, b = _pairs(values.astype(np.float64), pairing)
    first, second = a * cos - b * sin, b * cos + a * sin
    if pairing == "half":
        return np.concatenate([first, second], axis=-1)
    return np.stack([first, second], axis=-1).reshape(values.shape)


def _real_rotation(g: Graph, op: OpRecord, sizes: Sizes) -> Rotation | None:
    """`x * cos + rot(x) * sin`, checked on the values."""
    if op.name not in {"add", "add_"} or len(op.inputs) != 2:
        return None
    products = [g.producer(ref) for ref in op.inputs]
    if any(p is None for p in products):
        return None
    parts = [_vector_and_table(g, p) for p in products]  # type: ignore[arg-type]
    if parts[0] is None or parts[1] is None:
        return None
    (x_a, table_a), (x_b, table_b) = parts
    if _reaches(g, x_b, x_a) and not _same(x_a, x_b):
        plain, cos_ref, sin_ref = x_a, table_a, table_b
    elif _reaches(g, x_a, x_b) and not _same(x_a, x_b):
        plain, cos_ref, sin_ref = x_b, table_b, table_a
    else:
        return None
    x = g.snap(plain).values
    y = op.out.values
    r = x.shape[-1] if x.ndim else 0
    if x.shape != y.shape or r < 2 or r % 2 or x.dtype.kind != "f":
        return None
    cos_t, sin_t = g.snap(cos_ref).values, g.snap(sin_ref).values
    axis = _t_axis(x.shape, cos_t.shape, sizes.T) if sizes.T > 1 else -2
    if axis is None or cos_t.shape[-1] not in (1, r):
        return None
    cos_full = np.broadcast_to(cos_t, x.shape).astype(np.float64)
    sin_full = np.broadcast_to(sin_t, x.shape).astype(np.float64)
    for pairing in ("half", "interleaved"):
        c, _ = _pairs(cos_full, pairing)
        s, _ = _pairs(sin_full, pairing)
        if np.allclose(c * c + s * s, 1.0, atol=1e-4) and \
                np.allclose(_rotate(x, c, s, pairing), y, rtol=1e-4, atol=1e-5) and \
                np.allclose(*_pairs(cos_full, pairing), rtol=1e-5, atol=1e-6):
            cos = _per_position(c, c.shape, axis)
            sin = _per_position(s, s.shape, axis)
            return _complete(g, plain, Ref("op", op=op.index), r, pairing, cos, sin)
    return None


def _complex_rotation(g: Graph, op: OpRecord, sizes: Sizes) -> Rotation | None:
    """`view_as_real(view_as_complex(x.reshape(..., -1, 2)) * freqs_cis)`, Meta's spelling."""
    if op.name != "mul" or len(op.inputs) != 2:
        return None
    found = _vector_and_table(g, op)
    if found is None:
        return None
    vector, table = found
    if not g.snap(vector).dtype.startswith("complex") or not g.snap(table).dtype.startswith("complex"):
        return None
    ref = vector  # back to the real (..., d_h) tensor it was made from
    for _ in range(6):
        producer = g.producer(ref)
        if producer is None or producer.name not in _COMPLEX_WRAP or not producer.inputs:
            break
        ref = producer.inputs[0]
        if producer.name == "view_as_complex":
            continue
        if g.snap(ref).dtype.startswith("float") and g.snap(ref).ndim == g.snap(vector).ndim:
            break
    before = g.snap(ref)
    if not before.dtype.startswith("float") or before.shape[-1] != 2 * g.snap(vector).shape[-1]:
        return None
    after = Ref("op", op=op.index)  # forward to the real tensor of the same shape again
    for _ in range(6):
        consumers = g.consumers[after.op]  # type: ignore[index]
        if len(consumers) != 1 or g.ops[consumers[0]].name not in _COMPLEX_UNWRAP:
            break
        after = Ref("op", op=consumers[0])
        done = g.snap(after)
        if done.shape == before.shape and done.dtype == before.dtype:
            break
    if g.snap(after).shape != before.shape:
        return None
    values = g.snap(table).values
    axis = _t_axis(g.snap(vector).shape, values.shape, sizes.T) if sizes.T > 1 else -2
    if axis is None:
        return None
    full = np.broadcast_to(values, g.snap(vector).shape)
    cos, sin = full.real.astype(np.float64), full.imag.astype(np.float64)
    turned = _rotate(before.values, cos, sin, "interleaved")
    if not np.allclose(cos * cos + sin * sin, 1.0, atol=1e-4) or \
            not np.allclose(turned, g.snap(after).values, rtol=1e-4, atol=1e-5):
        return None
    return _complete(g, ref, after, before.shape[-1], "interleaved",
                     _per_position(cos, cos.shape, axis), _per_position(sin, sin.shape, axis))


def _slice_of(g: Graph, ref: Ref) -> tuple[Ref, tuple[int | None, int | None]] | None:
    """ref = source[..., start:stop] (a getitem on the last axis): the source and the bounds."""
    op = g.producer(ref)
    if op is None or op.name != "getitem" or not op.inputs or len(op.args) < 2:
        return None
    index = op.args[1]
    parts = index if isinstance(index, tuple) and index and isinstance(index[0], tuple | str) \
        else (index,)
    last = parts[-1] if parts else None
    if not (isinstance(last, tuple) and last and last[0] == "slice") or last[3] not in (None, 1):
        return None
    if any(p not in ("...", Ellipsis) and p != ("slice", None, None, None) for p in parts[:-1]):
        return None
    return op.inputs[0], (last[1], last[2])


def _complete(g: Graph, rotated_in: Ref, site: Ref, r: int, pairing: str, cos: np.ndarray,
              sin: np.ndarray) -> Rotation:
    """The whole rotation: a partial one's slice, pass-through and cat; every op between."""
    before, after, passed = rotated_in, site, None
    extra: set[int] = set()
    sliced = _slice_of(g, rotated_in)
    if sliced is not None and sliced[1][0] in (None, 0):
        source, _ = sliced
        for c in g.consumers[site.op]:  # type: ignore[index]
            joined = g.ops[c]
            if joined.name != "cat" or len(joined.inputs) != 2 or not _same(joined.inputs[0], site):
                continue
            rest = _slice_of(g, joined.inputs[1])
            if rest is not None and _same(rest[0], source) and rest[1][0] == r:
                before, after, passed = source, Ref("op", op=c), joined.inputs[1]
                extra |= {rotated_in.op, joined.inputs[1].op, c}  # type: ignore[arg-type]
                break
    ops = _between(g, rotated_in, after) | {i for i in extra if i is not None}
    return Rotation(before=before, rotated_in=rotated_in, after=after, passed=passed, r=r,
                    pairing=pairing, cos=np.asarray(cos, np.float64),
                    sin=np.asarray(sin, np.float64), ops=frozenset(ops))


def _between(g: Graph, start: Ref, end: Ref) -> set[int]:
    """The ops on some path from start (exclusive) to end (inclusive)."""
    ancestors: set[int] = set()
    todo = [end.op]
    while todo:
        i = todo.pop()
        if i is None or i in ancestors:
            continue
        op = g.ops[i]
        if any(_same(ref, start) for ref in op.inputs) or _reaches(g, Ref("op", op=i), start, 16):
            ancestors.add(i)
            todo.extend(ref.op for ref in op.inputs if ref.kind == "op" and not _same(ref, start))
    return ancestors


def _find(g: Graph, sizes: Sizes) -> list[Rotation]:
    found: list[Rotation] = []
    claimed: set[int] = set()
    for op in g.ops:
        if not g.from_x[op.index] or op.index in claimed:
            continue
        rotation = _real_rotation(g, op, sizes) or _complex_rotation(g, op, sizes)
        if rotation is not None:
            found.append(rotation)
            claimed |= rotation.ops
    return found


# ---------------------------------------------------------------- the stage


def _role(m: StageMaker, rotation: Rotation) -> str:
    """Q or K, from where the rotated tensor goes (the scores' first or second operand)."""
    return m.b.role(m.op(rotation.after.op))  # type: ignore[arg-type]


def _angles(rotation: Rotation) -> np.ndarray:
    return np.arctan2(rotation.sin, rotation.cos)  # (T, r/2)


def _frequencies(angles: np.ndarray) -> tuple[np.ndarray, float | None, bool]:
    """omega_i (radians per position) from angle(1), the base it implies, and whether every
    omega_i is base^(-2i/r)."""
    if angles.shape[0] < 2:
        return np.zeros(angles.shape[-1]), None, False
    omega = angles[1].astype(np.float64)
    n = omega.shape[0]
    if n < 2 or omega[1] <= 0:
        return omega, None, False
    base = float(omega[1] ** (-n))  # omega_1 = base^(-2/r) = base^(-1/n)
    expected = base ** (-np.arange(n) / n)
    return omega, base, bool(np.allclose(omega, expected, rtol=1e-4, atol=1e-6))


def _wrapped(a: np.ndarray) -> np.ndarray:
    return (a + math.pi) % (2 * math.pi) - math.pi


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    rotations_here = [rot for rot in rotations(m.g, m.s) if rot.ops & set(unit.ops)]
    by_role = sorted(((_role(m, rot), rot) for rot in rotations_here), key=lambda p: "QK?".index(
        p[0]) if p[0] in "QK?" else 3)
    first = by_role[0][1]
    T = first.cos.shape[0]
    angles = _angles(first)
    r, d_h = first.r, m.snap(first.before).shape[-1]
    shown = np.unwrap(angles, axis=0).astype(np.float32)  # atan2 gives them modulo 2 pi
    tensors = [m.b.record(
        "angle(t, i)", synthetic(shown), ("T", "pair"),
        caption=f"radians pair i is turned at position t: atan2(sin, cos) of the module's own "
                f"tables, unwrapped along t (computed by mha-tui); {r // 2} pairs of the {r} "
                f"channels turned")]
    checks: list[Check] = []
    for role, rot in by_role:
        label = role if role in "QK" else "?"
        before, after = m.snap(rot.before), m.snap(rot.after)
        dims = m.dims(before.shape, BHTD, BTHD)
        tensors.append(m.b.record(f"{label} before", before, dims,
                                  caption=f"{label} as the heads hold it, before rotary"))
        tensors.append(m.b.record(f"{label} after", after, m.dims(after.shape, BHTD, BTHD),
                                  caption=f"{label} turned: what the scores use",
                                  share=(f"{label} before", before)))
        x = m.snap(rot.rotated_in).values.astype(np.float64)
        y = _rotated_part(m, rot)
        xa, xb = _pairs(x, rot.pairing)
        ya, yb = _pairs(y, rot.pairing)
        norm_gap = float(np.abs(np.hypot(xa, xb) - np.hypot(ya, yb)).max()) if x.size else 0.0
        checks.append(Check(
            f"turning keeps every pair's length: max |‖{label} pair after‖ − ‖before‖| = "
            f"{norm_gap:.1e} over every token, head and pair (computed by mha-tui)",
            norm_gap <= 1e-4 * max(1.0, float(np.abs(x).max(initial=0.0)))))
        if not np.allclose(rot.cos, first.cos, atol=1e-6) or not np.allclose(rot.sin, first.sin,
                                                                                atol=1e-6):
            checks.append(Check(f"{label} is turned by the same angles as {by_role[0][0]}", False))
        if rot.passed is not None:
            kept = np.array_equal(m.snap(rot.passed).values, after.values[..., rot.r:])
            checks.append(Check(f"{label}'s channels {rot.r}..{d_h - 1} of every head pass "
                                f"through unchanged (partial rotary)", kept))
    # Relative positions: angle(t) = t * angle(1), so q_t . k_s depends on t - s only.
    if T >= 2:
        t_index = np.arange(T)[:, None]
        gap = float(np.abs(_wrapped(angles - t_index * angles[1][None, :])).max())
        checks.append(Check(
            f"angle(t) = t × angle(1) for every position and pair (max diff {gap:.1e}): turning "
            f"q at t and k at s leaves q·k depending on t − s only (computed by mha-tui)",
            gap < 1e-3))
    omega, base, fits = _frequencies(angles)
    if base is not None:
        checks.append(Check(
            f"pair i turns by ω_i = base^(−2i/{r}) per position, base = {base:.6g} read from "
            f"ω_1 = {omega[1]:.6g}: every pair fits = {'yes' if fits else 'no'}", None))
    if T >= 3 and len(by_role) >= 2:
        checks.append(_relative_demo(m, by_role, angles))
    style = ("half-split: channel i pairs with channel i + r/2 (GPT-NeoX, Llama: rotate_half)"
             if first.pairing == "half" else
             "interleaved: channel 2i pairs with channel 2i + 1 (GPT-J, Meta's Llama: "
             "rotate_every_two, complex numbers)")
    partial = (f" Only the first r = {r} of each head's d_h = {d_h} channels are turned; "
               f"channels {r}..{d_h - 1} are pass-through channels, joined back unchanged."
               if r < d_h else "")
    explanation = (
        f"Rotary position embedding (RoPE): no position vector is added to x. Instead each "
        f"head's channels are taken in pairs ({style}) and every pair of q and of k is turned, "
        f"like an arrow in a plane, by an angle that grows with the token's position: position "
        f"t turns pair i by t·ω_i, the first pairs fast, the last ones slowly.{partial} A turn "
        f"keeps lengths and changes directions; because q at position t and k at position s are "
        f"turned by t·ω and s·ω, their dot product only sees the difference (t − s)·ω: the "
        f"scores depend on how far apart two tokens are, not on where they are. V is not turned.")
    ops = sorted({i for _, rot in by_role for i in rot.ops})
    before = m.snap(first.before)
    after = m.snap(first.after)
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=before.shape,
                   shape_out=after.shape, dims_in=tensors[1].dims, dims_out=tensors[2].dims,
                   title=TITLE, explanation=explanation, extra_ops=ops)


def _rotated_part(m: StageMaker, rot: Rotation) -> np.ndarray:
    after = m.snap(rot.after).values.astype(np.float64)
    return after[..., : rot.r] if rot.passed is not None else after


def _relative_demo(m: StageMaker, by_role: list[tuple[str, Rotation]], angles: np.ndarray) -> Check:
    """One q and one k vector of the module, turned by its own angles at two pairs of
    positions the same distance apart: the same dot product."""
    q_rot, k_rot = by_role[0][1], by_role[1][1]
    q = np.moveaxis(m.snap(q_rot.rotated_in).values.astype(np.float64), -2, 0).reshape(
        m.snap(q_rot.rotated_in).shape[-2], -1, q_rot.r)
    k = np.moveaxis(m.snap(k_rot.rotated_in).values.astype(np.float64), -2, 0).reshape(
        m.snap(k_rot.rotated_in).shape[-2], -1, k_rot.r)
    # (T, ..., r) when the token axis is -2; otherwise the first vector of any axis is fine
    q_vec, k_vec = q.reshape(-1, q_rot.r)[0], k.reshape(-1, k_rot.r)[0]
    T = angles.shape[0]

    def score(t: int, s: int) -> float:
        qt = _rotate(q_vec, np.cos(angles[t]), np.sin(angles[t]), q_rot.pairing)
        ks = _rotate(k_vec, np.cos(angles[s]), np.sin(angles[s]), k_rot.pairing)
        return float(qt @ ks)

    a, b = score(1, 0), score(T - 1, T - 2)
    return Check(f"the same q and k vectors turned to positions (1, 0) and ({T - 1}, {T - 2}): "
                 f"q·k = {a:.4f} and {b:.4f}, one step apart both times (computed by mha-tui "
                 f"with the module's angles)", bool(abs(a - b) <= 1e-4 * max(1.0, abs(a))))


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    """Each rotary stage: the rotations found again from its ops (the same functions that
    recognised them), judged on what they turn (Q and K, before the scores; never V), by
    which angles (t x angle(1), the same for Q and K) and, when the learner said they meant
    rotary (`--expect rotary`), with which base."""
    stages = [s for s in j.trace.stages if s.kind == KIND]
    if not stages:
        return []
    g = j.classified()
    found = rotations(g, Sizes(j.B, j.T, j.C, j.h, j.d_h))
    roles = j.roles_on_path()
    rows = []
    for stage in stages:
        ops = {op.index for op in stage.ops}
        here = [rot for rot in found if rot.ops & ops]
        if not here:
            rows.append(j.row(stage, KIND, None, None, "not judged: its rotation could not be "
                                                        "found again from the ops"))
            continue
        rows.append(_judged(j, g, stage, [(roles.get(rot.after.op or -1, "?"), rot)
                                          for rot in here]))
    return rows


def _base(base: float) -> str:
    """A base read from float32 tables, as a person writes it: 500, 10000, 500000."""
    return f"{base:.4g}" if base < 1e4 else f"{base:.0f}"


def _judged(j: Judge, g: Graph, stage: Stage, by_role: list[tuple[str, Rotation]]) -> Row:
    by_role.sort(key=lambda p: "QKV?".index(p[0]))
    roles = [role for role, _ in by_role]
    first = by_role[0][1]
    angles = _angles(first)
    T, n = angles.shape
    r = first.r
    _, base, _ = _frequencies(angles)
    pairs = "rotate_half" if first.pairing == "half" else "interleaved pairs"
    extent = "full" if r == j.d_h else f"partial: {r} of {j.d_h} channels"
    expected_base = j.facts.rotary_base if j.facts.rotary else base
    omega = (expected_base ** (-np.arange(n) / n)) if expected_base else np.zeros(n)
    expected = np.arange(T)[:, None] * omega[None, :]  # (T, r/2)
    diff = float(np.abs(_wrapped(angles - expected)).max()) if T else 0.0
    base_text = _base(base) if base is not None else "?"
    measured = f"base {base_text} measured" if base is not None else \
        "one pair, which turns by t radians whatever the base"
    checked = (f"Q and K turned pair by pair by t × {expected_base or 10000:.6g}^(−2i/{r}) "
               f"before the scores, V not ({extent}, {pairs}; {measured})")

    def line_of(rot: Rotation) -> OpRecord:
        return g.ops[rot.after.op]  # type: ignore[index]

    def wrong(rot: Rotation, kind: str, message: str) -> Row:
        return j.row(stage, KIND, False, diff, checked, source=line_of(rot).source,
                     diagnosis=(kind, message))

    for role, rot in by_role:
        if role == "V":
            return wrong(rot, "rotary_v", "V is rotated: rotary applies to Q and K only. "
                                          "Turning q and k by position makes the scores q·k "
                                          "depend on how far apart two tokens are; turning V "
                                          "only changes what each token passes on")
        if role == "?":
            late = g.derives(rot.before, {"scores", "scale", "mask", "softmax", "attend",
                                          "concat", "w_o"})
            where = "the heads' outputs, after the scores" if late else \
                "a tensor the scores never use"
            return wrong(rot, "rotary_after_scores" if late else "rotary_unused",
                         f"rotary turns {where}: positions must turn Q and K before "
                         f"q @ k^T, or the scores never see them")
    if set(roles) != {"Q", "K"}:
        rot = by_role[0][1]
        return wrong(rot, "rotary_one_side",
                     f"only {roles[0]} is turned by position: "
                     f"{'K' if roles[0] == 'Q' else 'Q'} must be turned by the same angles, "
                     f"so that q·k depends on t − s only")
    (_, q_rot), (_, k_rot) = by_role[:2]
    if q_rot.cos.shape != k_rot.cos.shape or not np.allclose(q_rot.cos, k_rot.cos, atol=1e-5) \
            or not np.allclose(q_rot.sin, k_rot.sin, atol=1e-5):
        return wrong(k_rot, "rotary_angles", "Q and K are turned by different angles: q·k then "
                                             "depends on where the tokens are, not only on how "
                                             "far apart they are")
    if T >= 2:
        linear = float(np.abs(_wrapped(angles - np.arange(T)[:, None] * angles[1][None, :])).max())
        if linear > 1e-3:
            return wrong(q_rot, "rotary_positions",
                         f"the angles do not grow as t × angle(1) (off by up to {linear:.3g} "
                         f"rad): position t must turn pair i by t·ω_i, so that q·k depends on "
                         f"t − s only")
    if j.facts.rotary and diff > 1e-3:
        said = f"rotary base {_base(base)}" if base is not None else "rotary angles"
        return wrong(q_rot, "rotary_base",
                     f"{said} where {expected_base:g} was expected: pair i turns by "
                     f"{base_text}^(−2i/{r}) per position instead of {expected_base:g}^(−2i/{r}) "
                     f"(angles off by up to {diff:.3g} rad; --rotary-base {base_text} if that "
                     f"is the exercise)")
    return j.row(stage, KIND, True, diff if j.facts.rotary else None, checked,
                 source=line_of(q_rot).source)


# ---------------------------------------------------------------- why this number


_UNWRAP = {"flatten", "view_as_real", "reshape", "view", "type_as", "to", "float", "contiguous"}


def why(cell: Cell) -> Why:
    """A turned channel: x_c · cos + rot(x)_c · sin with the module's own recorded tables
    (rot(x)_c = −x of its partner for the first channel of a pair, +x for the second), or a
    pass-through channel read unchanged."""
    record, index = cell.record, cell.index
    before = cell.stage.tensors[-2]  # the builder's pairs: (role before, role after)
    if before.values.shape != record.values.shape:
        raise WhyError(f"cannot read {cell.name} against {before.name}: their shapes differ")
    x_full = before.values
    op, at = maker(cell)
    c = index[-1]
    recording = cell.trace.recording
    assert recording is not None  # maker found the op in the recording
    if op.name == "cat":
        r = cell.operand(op, 0).shape[-1]
        if c >= r:
            computed = float(x_full[index])
            return Why(cell.stage.id, KIND, record.name, index, where(cell),
                       f"{cell.name} = {before.name}{_at(index)}",
                       (Term(f"{before.name}{_at(index)}", (), computed),),
                       (f"channel {c} is a pass-through channel: only the first r = {r} channels "
                        "of each head are turned (partial rotary); it is joined back unchanged "
                        "by the cat", "moved, not computed"), computed, cell.recorded)
        ref = op.inputs[0]
        if ref.kind != "op" or ref.op is None:
            raise WhyError(f"cannot follow {cell.name} to its rotation")
        op = recording.ops[ref.op]  # joined on the channel axis: the same index
    while op.name in _UNWRAP and op.inputs and op.inputs[0].kind == "op":
        inner = recording.ops[op.inputs[0].op]  # type: ignore[index]
        if inner.out.values.dtype.kind == "c" and op.name == "view_as_real":
            at = reindex(at, op.out.shape, (*inner.out.shape, 2))
        else:
            at = reindex(at, op.out.shape, inner.out.shape)
        op = inner
    if op.name == "mul" and op.out.values.dtype.kind == "c":
        return _why_complex(cell, op, at, x_full)
    if op.name not in {"add", "add_"}:
        raise WhyError(f"cannot tell how {cell.name} was turned: it comes from {op.name}")
    return _why_real(cell, op, at, x_full)


def _at(index: tuple[int, ...]) -> str:
    return f"[{', '.join(map(str, index))}]"


def _products(cell: Cell, op: OpRecord) -> list[tuple[np.ndarray, np.ndarray]]:
    """The add's two products, each as its two recorded operands broadcast to the output."""
    recording = cell.trace.recording
    assert recording is not None
    pairs = []
    for ref in op.inputs:
        mul = recording.ops[ref.op] if ref.kind == "op" and ref.op is not None else None
        if mul is None or mul.name not in {"mul", "mul_"} or len(mul.inputs) != 2:
            raise WhyError(f"the rotation's add in stage {cell.stage.id} is not of two products")
        pairs.append(tuple(np.broadcast_to(cell.operand(mul, k), op.out.shape) for k in (0, 1)))
    return pairs  # type: ignore[return-value]


def _why_real(cell: Cell, op: OpRecord, at: tuple[int, ...], x_full: np.ndarray) -> Why:
    r = op.out.shape[-1]
    x = x_full[..., :r].reshape(op.out.shape)
    first, second = _products(cell, op)
    # The product with x itself holds cos; the other holds rot(x) and sin.
    plain, turned = (first, second) if any(np.array_equal(v, x) for v in first) else (second, first)
    k = next((k for k in (0, 1) if np.array_equal(plain[k], x)), None)
    if k is None:
        raise WhyError(f"cannot find {cell.name}'s input among the rotation's products")
    cos = plain[1 - k]
    x1, x2 = x[..., : r // 2], x[..., r // 2:]
    half = np.concatenate([-x2, x1], axis=-1)
    interleaved = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    found = next(((pairing, j) for pairing, rot in (("half", half), ("interleaved", interleaved))
                  for j in (0, 1) if np.array_equal(turned[j], rot)), None)
    if found is None:
        raise WhyError(f"cannot tell which channels of {cell.name}'s head form its pairs")
    pairing, j = found
    sin = turned[1 - j]
    c = at[-1]
    if pairing == "half":
        pair, partner, sign = c % (r // 2), (c + r // 2) % r, -1.0 if c < r // 2 else 1.0
    else:
        pair, partner, sign = c // 2, c ^ 1, -1.0 if c % 2 == 0 else 1.0
    xc, xp = float(x[at]), float(x[(*at[:-1], partner)])
    cos_c, sin_c = float(cos[at]), float(sin[at])
    a, b = xc * cos_c, sign * xp * sin_c
    computed = a + b
    name = cell.stage.tensors[-2].name
    t = _position(cell)
    angle = math.atan2(sin_c, cos_c)
    terms = (Term(f"{name}[.., {c}] × cos", (xc, "×", cos_c), a),
             Term(f"rot(x)[{c}] × sin, rot(x)[{c}] = {'−' if sign < 0 else '+'}{name}[.., {partner}]",
                  (sign * xp, "×", sin_c), b),
             Term("sum", (), computed))
    notes = (f"channel {c} is in pair {pair} with channel {partner} ("
             + ("half-split: channel i pairs with i + r/2" if pairing == "half" else
                "interleaved: channel 2i pairs with 2i + 1")
             + f"); the pair is turned by the angle atan2(sin, cos) = {angle:.6g} rad"
             + (f" at position {t}" if t is not None else ""),
             "cos and sin are the module's own recorded tables, read at this cell; rot(x) is "
             "the module's recorded rotate-half of x",)
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = x[{c}] · cos − x[{partner}] · sin" if sign < 0 else
               f"{cell.name} = x[{c}] · cos + x[{partner}] · sin",
               terms, notes, computed, cell.recorded)


def _why_complex(cell: Cell, op: OpRecord, at: tuple[int, ...], x_full: np.ndarray) -> Why:
    """view_as_complex(x) * freqs_cis: (a + ib)(cos + i sin), the real or the imaginary part."""
    *lead, part = at
    z = np.broadcast_to(cell.operand(op, 0), op.out.shape)
    w = np.broadcast_to(cell.operand(op, 1), op.out.shape)
    if z.dtype.kind != "c" or w.dtype.kind != "c":
        raise WhyError(f"cannot tell how {cell.name} was turned")
    zc, wc = complex(z[tuple(lead)]), complex(w[tuple(lead)])
    pair = lead[-1]
    a, b, cos_c, sin_c = zc.real, zc.imag, wc.real, wc.imag
    if part == 0:
        terms = (Term(f"x[{2 * pair}] × cos", (a, "×", cos_c), a * cos_c),
                 Term(f"−x[{2 * pair + 1}] × sin", (-b, "×", sin_c), -b * sin_c))
        computed = a * cos_c - b * sin_c
    else:
        terms = (Term(f"x[{2 * pair + 1}] × cos", (b, "×", cos_c), b * cos_c),
                 Term(f"x[{2 * pair}] × sin", (a, "×", sin_c), a * sin_c))
        computed = b * cos_c + a * sin_c
    t = _position(cell)
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {'Re' if part == 0 else 'Im'}((x[{2 * pair}] + i·x[{2 * pair + 1}])"
               f" × (cos + i·sin))", (*terms, Term("sum", (), computed)),
               (f"channels {2 * pair} and {2 * pair + 1} are pair {pair}, one complex number; "
                f"it is multiplied by the module's recorded freqs_cis, angle "
                f"{math.atan2(sin_c, cos_c):.6g} rad" + (f" at position {t}" if t is not None else ""),),
               computed, cell.recorded)


def _position(cell: Cell) -> int | None:
    dims = cell.record.dims
    return cell.index[dims.index("T")] if "T" in dims else None


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """How far pair 0 is turned at position 1: the angle table, from the module's own cos and
    sin."""
    angles = stage.tensors[0] if stage.tensors else None
    if angles is None or angles.values.ndim != 2 or angles.values.shape[0] < 2:
        return ()
    value = float(angles.values[1, 0])
    return (Question(stage.id, "angle", "By how many radians is pair 0 of Q and K turned at "
                     "position 1?", "number", value, number_text(value),
                     f"{angles.name}[1, 0]: atan2(sin, cos) of the module's own recorded tables "
                     "(computed by mha-tui)"),)
