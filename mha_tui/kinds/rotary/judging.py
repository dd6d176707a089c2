"""How `check` judges a rotary stage: what is turned, by which angles, with which base."""


from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...ops.graph import Graph
from ...ops.numeric import tolerance
from ...records import OpRecord, Stage

if TYPE_CHECKING:
    from .._parts.judging import Judge, Row
from .finding import KIND, Rotation, Scaling, angles_of, frequencies, rotations, scaling, wrapped

# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    """Each rotary stage: the rotations found again from its ops (the same functions that
    recognised them), judged on what they turn (Q and K, before the scores; never V), by
    which angles (t x angle(1), the same for Q and K) and, when the learner said they meant
    rotary (`--expect rotary`), with which base."""
    from .._parts.judging import judge_found

    found: list[Rotation] = []

    def find(g: Graph, stage: Stage) -> list[Rotation]:
        if not found:  # once, on the classified graph
            found.extend(rotations(g, j.sizes))
        ops = {op.index for op in stage.ops}
        return [rot for rot in found if (rot.ops | rot.tables) & ops]

    return judge_found(j, KIND, find, _judged, "its rotation")


def _turns_back(rot: Rotation) -> bool:
    angles = angles_of(rot)
    return angles.shape[0] >= 2 and bool(angles[1, 0] < 0)


def forward(angles: np.ndarray) -> np.ndarray:
    """The angles as a turn the usual way: a module that turns the other way (nanochat's
    `x1 * (-sin) + x2 * cos`) has every angle negated, and q·k depends on t - s all the same."""
    return -angles if angles.shape[0] >= 2 and angles[1, 0] < 0 else angles


def _base(base: float) -> str:
    """A base read from float32 tables, as a person writes it: 500, 10000, 500000 (the
    fewest significant digits within 1e-4 of it: angles measured in float32 give 500021)."""
    for digits in range(1, 7):
        rounded = float(f"{base:.{digits}g}")
        if abs(rounded - base) <= 1e-4 * base:
            base = rounded
            break
    return f"{base:.4g}" if base < 1e4 else f"{base:.0f}"


def _judged(j: Judge, g: Graph, stage: Stage, by_role: list[tuple[str, Rotation]]) -> Row:
    by_role.sort(key=lambda p: "QKV?".index(p[0]))
    roles = [role for role, _ in by_role]
    first = by_role[0][1]
    angles = forward(angles_of(first))
    T, n = angles.shape
    r = first.r
    _, base, _ = frequencies(angles)
    pairs = "rotate_half" if first.pairing == "half" else "interleaved pairs"
    extent = "full" if r == j.d_h else f"partial: {r} of {j.d_h} channels"
    expected_base = j.facts.rotary_base if j.facts.rotary else base
    omega = (expected_base ** (-np.arange(n) / n)) if expected_base else np.zeros(n)
    expected = np.arange(T)[:, None] * omega[None, :]  # (T, r/2)
    diff = float(np.abs(wrapped(angles - expected)).max()) if T else 0.0
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
    if q_rot.cos.shape != k_rot.cos.shape \
            or not np.allclose(q_rot.cos, k_rot.cos, **tolerance(atol=1e-5, rtol=1e-5)) \
            or not np.allclose(q_rot.sin, k_rot.sin, **tolerance(atol=1e-5, rtol=1e-5)):
        # the one turning against the usual direction (a sign flipped on sin) is the odd one
        odd = q_rot if _turns_back(q_rot) and not _turns_back(k_rot) else k_rot
        return wrong(odd, "rotary_angles", "Q and K are turned by different angles: q·k then "
                                             "depends on where the tokens are, not only on how "
                                             "far apart they are")
    if T >= 2:
        linear = float(np.abs(wrapped(angles - np.arange(T)[:, None] * angles[1][None, :])).max())
        if linear > 1e-3:
            return wrong(q_rot, "rotary_positions",
                         f"the angles do not grow as t × angle(1) (off by up to {linear:.3g} "
                         f"rad): position t must turn pair i by t·ω_i, so that q·k depends on "
                         f"t − s only")
    scaled = scaling(q_rot, expected_base) if j.facts.rotary and diff > 1e-3 else None
    if scaled is not None:  # Llama 3's or YaRN's rope_scaling of the expected base
        return j.row(stage, KIND, True, None, f"Q and K turned pair by pair from base "
                     f"{expected_base:g} with {scaled.words()} ({extent}, {pairs})",
                     source=line_of(q_rot).source)
    if j.facts.rotary and diff > 1e-3:
        said = f"rotary base {_base(base)}" if base is not None else "rotary angles"
        return wrong(q_rot, "rotary_base",
                     f"{said} where {expected_base:g} was expected: pair i turns by "
                     f"{base_text}^(−2i/{r}) per position instead of {expected_base:g}^(−2i/{r}) "
                     f"(angles off by up to {diff:.3g} rad; --rotary-base {base_text} if that "
                     f"is the exercise)")
    return j.row(stage, KIND, True, diff if j.facts.rotary else None, checked,
                 source=line_of(q_rot).source)




def mechanism(j: Judge, stage: Stage) -> str | None:
    """What this rotary stage does, with the parameters read from its own tables, and the
    option that makes it the exercise: the words `check` gives when the module leaves plain
    attention here."""
    ops = {op.index for op in stage.ops}
    here = [rot for rot in rotations(j.classified(), j.sizes)
            if rot.ops & ops]
    if not here:
        return None
    rot = here[0]
    _, base, _ = frequencies(forward(angles_of(rot)))
    pairs = "rotate_half" if rot.pairing == "half" else "interleaved pairs"
    extent = "full" if rot.r == j.d_h else f"partial: {rot.r} of {j.d_h} channels"
    option = "--expect rotary"
    if base is not None and abs(base - 10000) > 1:
        option += f" --rotary-base {_base(base)}"
    said = f"base {_base(base)}" if base is not None else "its own angles"
    return (f"rotary positions on Q and K ({pairs}, {extent}, {said}): pass `{option}` if "
            f"that is the exercise; plain multi-head attention has no positions")


def scaled(j: Judge) -> Scaling | None:
    """The rope scaling of the module's rotary, from the base the learner expects
    (`--rotary-base`), for the reference to grow it; None when there is none."""
    found = rotations(j.classified(), j.sizes)
    return scaling(found[0], j.facts.rotary_base) if found else None
