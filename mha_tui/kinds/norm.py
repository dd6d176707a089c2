"""norm: a LayerNorm or RMSNorm inside the attention module, applied to x before the
projections (pre-norm written into the module) or to q and k (QK-norm).

Recognised from the op (torch's layer_norm / rms_norm) and checked on the values: every
token's numbers normalised over the last axis, then the module's own weight and bias.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import tolerance
from ..ops.sizes import Sizes
from ..records import Check, OpRecord, Stage, TensorArg
from ._parts.builder import BTC
from ._parts.cell import Cell, Term, Why, WhyError, where
from ._parts.grown import Part, QKNorm
from ._parts.hand_norm import BY_HAND, HandNorm, hand_norms, recompute
from ._parts.maker import StageMaker
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "norm"
EXPECTED = "qk_norm"  # check --expect qk_norm grows the reference by reference(j)
_NORMS = {"layer_norm", "rms_norm"}


def normalises(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """layer_norm or rms_norm of an x-derived tensor before the scores."""
    if op.name not in _NORMS or not g.x_inputs(op) or g.op_derives(op, {"scores", "attend"}):
        return None
    return KIND


def normalises_by_hand(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """An op of a LayerNorm or RMSNorm written out (pow, mean, rsqrt, mul), before the scores."""
    if op.name not in BY_HAND or g.op_derives(op, {"scores", "attend"}):
        return None
    return KIND if any(op.index in norm.ops for norm in hand_norms(g)) else None


RULES = (normalises, normalises_by_hand)


# torch.finfo(dtype).eps: what F.rms_norm uses when called without eps (nanochat's
# `F.rms_norm(x, (x.size(-1),))`)
_MACHINE_EPS = {"float64": 2.0 ** -52, "float32": 2.0 ** -23, "float16": 2.0 ** -10,
                "bfloat16": 2.0 ** -7}


def eps_of(op: OpRecord) -> float:
    """The eps a layer_norm / rms_norm op was called with; if none, torch's default: 1e-5
    for layer_norm, the input dtype's machine epsilon for rms_norm."""
    eps_kwarg = op.kwarg("eps")  # nn.LayerNorm passes eps by keyword
    if isinstance(eps_kwarg, float):
        return float(eps_kwarg)
    given = next((float(a) for a in op.scalars() if isinstance(a, float)), None)
    if given is not None:
        return given
    return _MACHINE_EPS.get(op.out.dtype, 2.0 ** -23) if op.name == "rms_norm" else 1e-5


def affine(g: Graph, op: OpRecord) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A layer_norm / rms_norm op's own weight and bias (None where it has none)."""
    params = [r for r in g.other_inputs(op) if r.kind in ("param", "buffer")]
    weight = next((g.snap(r).values for r in params if g.snap(r).ndim == 1), None)
    bias = next((g.snap(r).values for r in params[1:] if g.snap(r).ndim == 1), None)
    return weight, bias


def normalised(g: Graph, op: OpRecord) -> tuple[np.ndarray, np.ndarray, float]:
    """What a layer_norm / rms_norm op should make from its recorded input and the module's
    own weight and bias (NumPy, float64): (its input, the expected output, eps)."""
    before = g.snap(g.x_inputs(op)[0])
    weight, bias = affine(g, op)
    x = before.values.astype(np.float64)
    eps = eps_of(op)
    centred = x if op.name == "rms_norm" else x - x.mean(axis=-1, keepdims=True)
    normed = centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps)
    expected = normed * (weight if weight is not None else 1.0) + (bias if bias is not None else 0.0)
    return x, expected, eps


def recomputed(m: StageMaker, op: OpRecord) -> tuple[bool, float]:
    """Whether a layer_norm / rms_norm op's output is its input normalised over the last
    axis, times its weight, plus its bias (recomputed in float64), and the eps it used."""
    _, expected, eps = normalised(m.g, op)
    return bool(np.allclose(expected, op.out.values, **tolerance(atol=1e-5, rtol=1e-4))), eps


def _by_hand(g: Graph, ops: set[int]) -> HandNorm | None:
    return next((norm for norm in hand_norms(g) if norm.ops & ops), None)


def _axis_words(norm_width: int, sizes: Sizes) -> str:
    """Per head (over d_h channels, Qwen3) or over the whole projection (OLMo 2)."""
    if norm_width == sizes.d_h and sizes.d_h != sizes.C:
        return f"each head's {norm_width} channels (per head)"
    return f"all {norm_width} channels of the projection, before the head split"


def _build_by_hand(m: StageMaker, unit: Unit, stage_id: str, norm: HandNorm) -> Stage:
    before, after = m.snap(norm.before), m.snap(norm.after)
    x = before.values.astype(np.float64)
    expected = recompute(x, norm.rms, norm.eps) * norm.weight + (
        norm.bias if norm.bias is not None else 0.0)
    same = bool(np.allclose(expected, after.values, **tolerance(atol=1e-4, rtol=1e-3)))
    role = m.b.role(m.op(norm.after.op)) if norm.after.op is not None else "?"  # type: ignore[arg-type]
    who = {"Q": "q", "K": "k", "V": "v"}.get(role, "the tensor")
    dims_in = m.dims(before.shape, BTC)
    tensors = [m.b.record(f"{who} before {norm.name}", before, dims_in,
                          caption="as the projection made it"),
               m.b.record(f"{who} after {norm.name}", after, m.dims(after.shape, BTC),
                          caption="normalised over its last axis: what goes on to the scores")]
    how = ("divided by their root mean square" if norm.rms
           else "minus their mean, divided by their standard deviation")
    over = _axis_words(x.shape[-1], m.s)
    checks = [Check(f"{over}: numbers {how}, then times the module's weight"
                    f"{'' if norm.bias is None else ' plus its bias'} (recomputed by mha-tui, "
                    f"eps = {norm.eps:g}; the norm is written out op by op)", same)]
    title = f"{norm.name} on {who} before the scores (QK-norm, written out op by op)"
    explanation = (
        f"The module normalises {who} itself before the scores: over {over}, each vector's "
        f"numbers are {how}, then multiplied by a learned weight. The ops spell the "
        f"{norm.name} out ({', '.join(sorted({m.op(i).name for i in norm.ops}))}); mha-tui "
        f"recognises it from the values, not the names. Normalising q and k keeps the scores "
        f"from growing with the vectors' lengths (Qwen3, OLMo 2, Gemma 3 do this).")
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=before.shape,
                   shape_out=after.shape, dims_in=dims_in, dims_out=tensors[-1].dims,
                   title=title, explanation=explanation, extra_ops=sorted(norm.ops))


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    hand = _by_hand(m.g, set(unit.ops)) if not any(
        m.op(i).name in _NORMS for i in unit.ops) else None
    if hand is not None:
        return _build_by_hand(m, unit, stage_id, hand)
    op = m.op(unit.ops[0])
    before_ref = m.x_in(op)
    before, after = m.snap(before_ref), op.out
    x = before.values.astype(np.float64)
    rms = op.name == "rms_norm"
    same, eps = recomputed(m, op)
    what = "RMSNorm" if rms else "LayerNorm"
    dims = m.dims(before.shape, BTC)
    name = (m.origin_name(before_ref).split("'s ")[-1] if m.g.producer(before_ref)
            else before_ref.name or "x")
    tensors = [m.b.record(f"{name} before {what}", before, dims, caption="what the module received"),
               m.b.record(f"{m.tensor_name(op, fallback='x')} after {what}", after,
                          m.dims(after.shape, BTC),
                          caption="each token's numbers normalised: what the projections see")]
    how = ("divided by their root mean square" if rms
           else "minus their mean, divided by their standard deviation")
    checks = [Check(f"each token's {x.shape[-1]} numbers {how}, then times the module's weight"
                    f"{'' if rms else ' plus its bias'} (recomputed by mha-tui, eps = {eps:g})",
                    same)]
    if not rms:
        checks.append(Check(f"before: each token's mean within ±{np.abs(x.mean(axis=-1)).max():.4f}, "
                            f"its std {x.std(axis=-1).min():.4f} to {x.std(axis=-1).max():.4f}",
                            None))
    title = f"{what} inside the module: each token's numbers normalised first"
    explanation = (
        f"This attention module normalises its input itself ({what} over the last axis, "
        f"{x.shape[-1]} numbers per token) before anything else: "
        + ("each token's numbers are divided by their root mean square"
           if rms else "each token's numbers have their mean subtracted and are divided by "
                       "their standard deviation")
        + ", then multiplied by a learned weight" + ("" if rms else " and shifted by a learned bias")
        + ". Many models do this in the block, outside attention (pre-norm); here it is part of "
          "the module, so the projections see the normalised x, not x itself.")
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=before.shape,
                   shape_out=after.shape, dims_in=dims, dims_out=tensors[-1].dims, title=title,
                   explanation=explanation)


# ---------------------------------------------------------------- why this number


def param_at(cell: Cell, op: OpRecord, position: int, name: str, c: int, default: float) -> float:
    """A norm's weight or bias at channel c: torch's `layer_norm(input, normalized_shape,
    weight, bias, eps)` / `rms_norm(input, normalized_shape, weight, eps)`, positional or by
    keyword; None (no affine) is the default."""
    arg = op.args[position] if len(op.args) > position else op.kwarg(name)
    if not isinstance(arg, TensorArg):
        return default
    return float(cell.operand(op, arg.index)[c])


def norm_terms(cell: Cell, op: OpRecord, row: np.ndarray, c: int, word: str
               ) -> tuple[list[Term], float]:
    """Channel c of one token's row (float64) through a layer_norm / rms_norm op, step by
    step, with the module's own weight and bias and eps: the terms and the result."""
    rms = op.name == "rms_norm"
    size = row.shape[-1]
    gamma = param_at(cell, op, 2, "weight", c, 1.0)
    beta = 0.0 if rms else param_at(cell, op, 3, "bias", c, 0.0)
    eps = eps_of(op)
    s = float(row[c])
    terms = []
    if rms:
        mean = 0.0
        var = float((row ** 2).mean())
        terms.append(Term(f"mean of the token's {size} {word} squared", (), var))
    else:
        mean = float(row.mean())
        var = float(((row - mean) ** 2).mean())
        terms += [Term(f"mean of the token's {size} {word}", (), mean),
                  Term(f"variance: mean of ({word[:-1]} - mean)^2 over the {size}", (), var)]
    std = float(np.sqrt(var + eps))
    normed = (s - mean) / std
    computed = normed * gamma + beta
    one = word[:-1]
    terms += [Term(f"√({'mean square' if rms else 'variance'} + eps), eps = {eps:g}", (), std),
              *(() if rms else (Term(f"{one} - mean", (s, "-", mean), s - mean),)),
              Term(f"{one} / √(...)" if rms else f"({one} - mean) / √(...)",
                   (s if rms else s - mean, "/", std), normed),
              Term(f"× gamma[{c}]" + ("" if rms else f" + beta[{c}]"),
                   (normed, "×", gamma) if rms else (normed, "×", gamma, "+", beta), computed)]
    return terms, computed


def why(cell: Cell) -> Why:
    """A normalised number: its token's row as the module received it (recorded), minus the
    row's mean, divided by √(variance + eps), times the module's weight plus its bias (or, for
    RMSNorm, divided by the row's root mean square, times the weight)."""
    op = next((o for o in cell.stage.ops if o.name in _NORMS), None)
    if op is None:
        raise WhyError(f"stage {cell.stage.id} holds no layer_norm or rms_norm to explain "
                       f"{cell.name} by")
    *lead, t, c = cell.index
    row = cell.operand(op, 0)[(*lead, t)].astype(np.float64)
    rms = op.name == "rms_norm"
    what = "RMSNorm" if rms else "LayerNorm"
    terms, computed = norm_terms(cell, op, row, c, "numbers")
    spot = ", ".join(map(str, (*lead, t)))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {what}(the token's row [{spot}, :])[{c}] = "
               + ("number / √(mean square + eps) × gamma" if rms else
                  "(number - mean) / √(variance + eps) × gamma + beta"),
               tuple(terms),
               (f"the row: the {row.shape[-1]} numbers the module's {what} received for this "
                "token (recorded)" + ("" if rms else "; variance without Bessel's correction, "
                                                     f"as {what} does"),
                f"gamma{'' if rms else ' and beta'}: the {what}'s own weight"
                + ("" if rms else " and bias") + f", at channel {c}"),
               computed, cell.recorded)


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    """Each LayerNorm / RMSNorm stage, recomputed from its own recorded input with the
    module's weight and bias. Judged as itself; a norm is not part of plain attention, so
    the end-to-end row and the diagnosis say that it differs ("a LayerNorm on x"). With
    `--expect qk_norm`, a norm on one side only, or over the wrong axis, or none."""
    rows = _expected(j) if EXPECTED in j.facts.mechanisms else []
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        op = next((o for o in stage.ops if o.name in _NORMS and j.g.x_inputs(o)), None)
        hand = _by_hand(j.classified(), {o.index for o in stage.ops}) if op is None else None
        if hand is not None:
            x = j.g.snap(hand.before).values
            got = j.g.snap(hand.after).values.astype(np.float64)
            expected = recompute(x, hand.rms, hand.eps) * hand.weight + (
                hand.bias if hand.bias is not None else 0.0)
            diff = float(np.abs(got - expected).max()) if got.size else 0.0
            rows.append(j.row(stage, KIND, bool(np.allclose(expected, got,
                    **tolerance(atol=1e-4, rtol=1e-3))),
                              diff, f"{hand.name} written out op by op: normalised over the last "
                              f"axis, times the module's weight (eps {hand.eps:g}; not part of "
                              f"plain attention)", source=j.g.ops[hand.after.op].source))  # type: ignore[index]
            continue
        if op is None:
            rows.append(j.row(stage, KIND, None, None, "not judged: no norm op recorded"))
            continue
        _, expected, eps = normalised(j.g, op)
        got = op.out.values.astype(np.float64)
        diff = float(np.abs(got - expected).max()) if got.size else 0.0
        ok = bool(np.allclose(expected, got, **tolerance(atol=1e-5, rtol=1e-4)))
        what = "RMSNorm: each token's numbers divided by their root mean square" \
            if op.name == "rms_norm" else \
            "LayerNorm: each token's numbers minus their mean, over their standard deviation"
        rows.append(j.row(stage, KIND, ok, diff,
                          f"{what}, times the module's weight (eps {eps:g}; not part of plain "
                          f"attention)", source=op.source,
                          diagnosis=None if ok else ("norm_wrong", f"the {what.split(':')[0]} "
                                                     f"does not compute what it should "
                                                     f"(off by up to {diff:.3g})")))
    return rows


def mechanism(j: Judge, stage: Stage) -> str:
    """What `check` says when the module leaves plain attention at this stage: the norm,
    on what (x, or q and k), over which channels."""
    op = next((o for o in stage.ops if o.name in _NORMS and j.g.x_inputs(o)), None)
    hand = _by_hand(j.classified(), {o.index for o in stage.ops}) if op is None else None
    if hand is not None:
        name, width, end = hand.name, j.g.snap(hand.before).shape[-1], hand.after.op
    elif op is not None:
        name = "RMSNorm" if op.name == "rms_norm" else "LayerNorm"
        width, end = op.out.values.shape[-1], op.index
    else:
        return "a norm inside the module"
    role = j.roles_on_path().get(end, "")  # type: ignore[arg-type]
    on = {"Q": "Q (and K: QK-norm)", "K": "K (and Q: QK-norm)", "V": "V"}.get(role, "x")
    over = "per head, over each head's" if width == j.d_h and j.d_h != j.C else "over all"
    article = "an" if name == "RMSNorm" else "a"
    return (f"{article} {name} on {on}, {over} {width} channels: a learned normalisation that plain "
            f"multi-head attention does not have")


# ------------------------------------------------------------- check --expect qk_norm


def _qk_norms(j: Judge) -> dict[str, tuple[Stage, QKNorm]]:
    """The module's norms on q and k ("Q", "K"), each as the reference applies it."""
    found: dict[str, tuple[Stage, QKNorm]] = {}
    g = j.classified()
    roles = j.roles_on_path()
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        indices = {o.index for o in stage.ops}
        norms: list[tuple[int, int, QKNorm]] = []  # (its last op, its width, the norm)
        for op in (o for o in stage.ops if o.name in _NORMS and j.g.x_inputs(o)):
            weight, bias = affine(j.g, op)
            norms.append((op.index, op.out.values.shape[-1],
                          QKNorm(op.name == "rms_norm", eps_of(op), weight, bias, False)))
        for hand in (n for n in hand_norms(g) if n.ops & indices and n.after.op is not None):
            norms.append((hand.after.op, j.g.snap(hand.before).shape[-1],  # type: ignore[arg-type]
                          QKNorm(hand.rms, hand.eps, hand.weight, hand.bias, False)))
        for end, width, norm in norms:
            role = roles.get(end, "")
            if role not in ("Q", "K") or width % j.d_h:
                continue
            per_head = width == j.d_h and j.d_h != j.C
            after_rotary = g.op_derives(j.g.ops[end], {"rotary"})
            found.setdefault(role, (stage, QKNorm(norm.rms, norm.eps, norm.weight, norm.bias,
                                                  per_head, after_rotary)))
    return found


def reference(j: Judge) -> Part | None:
    """--expect qk_norm: the module's own norms on q and k (RMSNorm or LayerNorm, per head or
    over the whole projection, its weight, bias and eps), before or after the rotary as the
    module applies them."""
    found = _qk_norms(j)
    if not found:
        return None
    norms = [norm for _, norm in found.values()]
    names = sorted({n.name for n in norms})
    over = "per head" if all(n.per_head for n in norms) else \
        "over the whole projection" if not any(n.per_head for n in norms) else "per head and whole"
    after = " after the rotary" if any(n.after_rotary for n in norms) else ""
    on = " and ".join(role.lower() for role in ("Q", "K") if role in found)
    return Part(f"{' and '.join(names)} on {on} ({over}{after}, the module's weights)",
                q_norm=found["Q"][1] if "Q" in found else None,
                k_norm=found["K"][1] if "K" in found else None)


_REDUCE = {"mean", "var", "std", "norm", "sum"}


def _reduced_axis(op: OpRecord) -> int | None:
    dim = op.kwarg("dim", next((a for a in op.args[1:2] if isinstance(a, int | list | tuple)),
                               None))
    if isinstance(dim, list | tuple):
        dim = dim[0] if len(dim) == 1 else None
    return dim if isinstance(dim, int) else None


def _feeds(g: Graph, op: OpRecord, roles: dict[int, str], hops: int = 6) -> str | None:
    """The role ("Q" or "K") of the path to the scores the op's result joins within a few
    ops (a norm's mean joins q or k at its multiply), or None."""
    todo, seen = [op.index], set()
    for _ in range(hops):
        nxt = []
        for i in todo:
            if roles.get(i) in ("Q", "K"):
                return roles[i]
            nxt += [c for c in g.consumers[i] if c not in seen]
            seen.update(g.consumers[i])
        todo = nxt
    return None


def _expected(j: Judge) -> list[Row]:
    """Rows for --expect qk_norm: a norm that reduces over another axis than each token's
    channels; a norm on only one of q and k; none at all."""
    found = _qk_norms(j)
    g = j.classified()
    roles = j.roles_on_path()
    for op in g.ops:
        if op.name not in _REDUCE or not g.from_x[op.index] or g.kind.get(op.index) == KIND \
                or g.op_derives(op, {"scores", "softmax"}) or _feeds(g, op, roles) is None:
            continue
        axis = _reduced_axis(op)
        shape = g.snap(g.x_inputs(op)[0]).shape if g.x_inputs(op) else ()
        if axis is None or not shape or axis % len(shape) == len(shape) - 1:
            continue
        size = shape[axis % len(shape)]
        label = "the tokens" if size == j.T_q else "the heads" if size == j.h else f"{size} numbers"
        line = j.where(op.source)[1]
        role = (_feeds(g, op, roles) or "q").lower()
        return [j.row(j.stage_of.get(op.index), KIND, False, None,
                      "q and k normalised over each token's channels", source=op.source,
                      diagnosis=("qk_norm_axis", f"q/k normalisation over the wrong axis: the "
                                 f"{op.name} at line {line} reduces {role} over axis {axis} "
                                 f"({label}), not over each token's channels (the last axis, "
                                 f"per head or whole)"))]
    if len(found) == 1:
        (role, (stage, norm)), = found.items()
        other = "K" if role == "Q" else "Q"
        line = j.where(stage.source)[1]
        return [j.row(stage, KIND, False, None, "q and k both normalised before the scores",
                      diagnosis=("qk_norm_one_side", f"QK-norm on {role} only: {role} goes "
                                 f"through its {norm.name} (line {line}), but {other} reaches "
                                 f"the scores unnormalised; --expect qk_norm normalises both "
                                 f"(Qwen3's q_norm and k_norm)"))]
    if found:
        return []
    scores = next((s for s in j.trace.stages if s.kind in ("scores", "sdpa")), None)
    return [j.row(None, KIND, False, None, "q and k normalised before the scores",
                  source=scores.source if scores is not None else None,
                  position=j.position_before("scores"),
                  diagnosis=("mechanism_missing", "no q/k normalisation: --expect qk_norm wants "
                             "q and k each through an RMSNorm or LayerNorm (per head, or over "
                             "the whole projection) before the scores, and neither was"))]
