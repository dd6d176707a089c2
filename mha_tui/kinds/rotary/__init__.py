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

import numpy as np

from ...ops.graph import Graph
from ...ops.numeric import HALF, precision, tolerance
from ...ops.sizes import Sizes
from ...records import Check, OpRecord, Stage
from ...stages import title_of
from .._parts.builder import BHTD, BTHD
from .._parts.maker import StageMaker, synthetic
from .._parts.unit import Unit
from .finding import (
    CLAIMS,
    KIND,
    Rotation,
    angles_of,
    frequencies,
    pairs,
    rotate,
    rotations,
    turned_position,
    wrapped,
)
from .judging import judge, mechanism, scaled
from .why import quiz, why

__all__ = ["KIND", "RULES", "Rotation", "build", "judge", "mechanism", "quiz", "rotations", "scaled",
           "why"]



def turns_by_position(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """An op of a rotary rotation: from the head tensor to the rotated q or k, or one that
    made its cos and sin tables from a tensor the caller passed (whatever the op: found by
    where its output goes, the tables of a rotation checked on the values)."""
    if not g.op_derives(op, {"project"}):
        return KIND if any(op.index in rot.tables for rot in rotations(g, sizes)) else None
    if op.name not in CLAIMS:
        return None
    return KIND if any(op.index in rot.ops for rot in rotations(g, sizes)) else None


RULES = (turns_by_position,)


# ---------------------------------------------------------------- the stage


def _role(m: StageMaker, rotation: Rotation) -> str:
    """Q or K, from where the rotated tensor goes (the scores' first or second operand)."""
    return m.b.role(m.op(rotation.after.op))  # type: ignore[arg-type]


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    rotations_here = [rot for rot in rotations(m.g, m.s) if (rot.ops | rot.tables) & set(unit.ops)]
    by_role = sorted(((_role(m, rot), rot) for rot in rotations_here), key=lambda p: "QK?".index(
        p[0]) if p[0] in "QK?" else 3)
    first = by_role[0][1]
    T = first.cos.shape[0]
    angles = angles_of(first)
    r, d_h = first.r, m.snap(first.before).shape[-1]
    shown = np.unwrap(angles, axis=0).astype(np.float32)  # atan2 gives them modulo 2 pi
    start = m.s.start  # a decode step: the new token stands after the cached ones
    at = (f"; row 0 is position {start}, the new token's (a decode step: the {start} tokens "
          f"before it are in the cache)" if start else "")
    tensors = [m.b.record(
        "angle(t, i)", synthetic(shown), ("T", "pair"),
        caption=f"radians pair i is turned at position t: atan2(sin, cos) of the module's own "
                f"tables, unwrapped along t (computed by mha-tui); {r // 2} pairs of the {r} "
                f"channels turned{at}")]
    checks: list[Check] = []
    if start:
        checks.append(_offset_check(float(angles[0, 0]), start))
    # bfloat16 and float16: the module rounded its cos and sin tables and every turned
    # number; the checks allow that rounding and say so.
    rtol = precision().rtol if precision().dtype in HALF else 0.0
    half = f", {precision().words()}" if rtol else ""
    for role, rot in by_role:
        label = role if role in "QK" else "?"
        before, after = m.snap(rot.before), m.snap(rot.after)
        # K with h_kv heads when the module shares K/V heads (its role: where it goes)
        layouts = (*m.b.kv(BHTD, BTHD), BHTD, BTHD) if label == "K" else (BHTD, BTHD)
        tensors.append(m.b.record(f"{label} before", before, m.dims(before.shape, *layouts),
                                  caption=f"{label} as the heads hold it, before rotary"))
        tensors.append(m.b.record(f"{label} after", after, m.dims(after.shape, *layouts),
                                  caption=f"{label} turned: what the scores use",
                                  share=(f"{label} before", before)))
        x = m.snap(rot.rotated_in).values.astype(np.float64)
        y = _rotated_part(m, rot)
        xa, xb = pairs(x, rot.pairing)
        ya, yb = pairs(y, rot.pairing)
        norm_gap = float(np.abs(np.hypot(xa, xb) - np.hypot(ya, yb)).max()) if x.size else 0.0
        checks.append(Check(
            f"turning keeps every pair's length: max |‖{label} pair after‖ − ‖before‖| = "
            f"{norm_gap:.1e} over every token, head and pair (computed by mha-tui)" + half,
            norm_gap <= max(1e-4, rtol) * max(1.0, float(np.abs(x).max(initial=0.0)))))
        if not np.allclose(rot.cos, first.cos, **tolerance(atol=1e-6, rtol=1e-5)) or \
                not np.allclose(rot.sin, first.sin, **tolerance(atol=1e-6, rtol=1e-5)):
            checks.append(Check(f"{label} is turned by the same angles as {by_role[0][0]}", False))
        if rot.passed is not None:
            kept = np.array_equal(m.snap(rot.passed).values, after.values[..., rot.r:])
            checks.append(Check(f"{label}'s channels {rot.r}..{d_h - 1} of every head pass "
                                f"through unchanged (partial rotary)", kept))
    # Relative positions: angle(t) = t * angle(1), so q_t . k_s depends on t - s only.
    if T >= 2 and rtol:  # angle(1) off by the tables' rounding, t × angle(1) by t times it
        t_index = np.arange(T)[:, None]
        step = np.unwrap(angles, axis=0)[-1] / (T - 1)  # the last position: the most precise
        gap = float(np.abs(wrapped(angles - t_index * step[None, :])).max())
        checks.append(Check(
            f"angle(t) = t × ω for every position and pair, ω read from the last position "
            f"(max diff {gap:.1e}): turning q at t and k at s leaves q·k depending on t − s "
            f"only (computed by mha-tui){half}", gap < max(1e-3, 2 * rtol)))
    elif T >= 2:
        t_index = np.arange(T)[:, None]
        gap = float(np.abs(wrapped(angles - t_index * angles[1][None, :])).max())
        checks.append(Check(
            f"angle(t) = t × angle(1) for every position and pair (max diff {gap:.1e}): turning "
            f"q at t and k at s leaves q·k depending on t − s only (computed by mha-tui)",
            gap < 1e-3))
    omega, base, fits = frequencies(angles)
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
    ops = sorted({i for _, rot in by_role for i in rot.ops | rot.tables})
    before = m.snap(first.before)
    after = m.snap(first.after)
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=before.shape,
                   shape_out=after.shape, dims_in=tensors[1].dims, dims_out=tensors[2].dims,
                   title=title_of(KIND), explanation=explanation, extra_ops=ops)


def _offset_check(angle: float, start: int) -> Check:
    """A decode step: the new token must be turned for its own position, after the cache's
    tokens; pair 0 turns by exactly the position in radians (ω_0 = 1 in every base)."""
    expected = float(wrapped(np.float64(start)))
    if abs(float(wrapped(np.float64(angle - start)))) < 1e-3:
        return Check(f"the new token is turned for its position {start}: pair 0 by {angle:.4f} "
                     f"rad = {start} rad modulo 2π (pair 0 turns by one radian per position in "
                     f"every base; computed by mha-tui)", True)
    used = turned_position(angle, 4 * start + 64)
    said = f"position {used}'s turn" if used is not None else "no position's turn"
    return Check(f"the new token is NOT turned for its position {start}: pair 0 by {angle:.4f} "
                 f"rad, {said}; position {start} turns it by {start} rad = {expected:.4f} modulo "
                 f"2π (computed by mha-tui)", False)


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
        qt = rotate(q_vec, np.cos(angles[t]), np.sin(angles[t]), q_rot.pairing)
        ks = rotate(k_vec, np.cos(angles[s]), np.sin(angles[s]), k_rot.pairing)
        return float(qt @ ks)

    a, b = score(1, 0), score(T - 1, T - 2)
    p = precision()
    rtol = max(1e-4, p.rtol) if p.dtype in HALF else 1e-4
    return Check(f"the same q and k vectors turned to positions (1, 0) and ({T - 1}, {T - 2}): "
                 f"q·k = {a:.4f} and {b:.4f}, one step apart both times (computed by mha-tui "
                 f"with the module's angles" + (f", {p.words()})" if p.dtype in HALF else ")"),
                 bool(abs(a - b) <= rtol * max(1.0, abs(a))))


