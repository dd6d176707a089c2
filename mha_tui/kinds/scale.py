"""scale: the scores (or q, k before them) multiplied or divided by one number.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, scalar_operand
from ..ops.numeric import f64, finite_std, ratio, tolerance
from ..ops.sizes import Sizes
from ..ops.vocab import LARGE_NEGATIVE, MASK_OPS, SCALE_OPS, SHAPE_OPS
from ..records import Check, OpRecord, Stage, Trace
from . import position_bias
from ._parts.builder import BHTD, BHTT, yes
from ._parts.cell import Cell, Term, Why, expanded_from, where
from ._parts.maker import StageMaker
from ._parts.quizzing import EXPANDED, Question, number_text
from ._parts.unit import Unit
from .position_bias import disentangled_scale

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "scale"


def scale(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """Multiplying or dividing the scores (or q, k before them) by one number."""
    if op.name not in {"div", "mul", "div_", "mul_", "true_divide"} or len(g.x_inputs(op)) != 1:
        return None
    if scalar_operand(g, op) is None or g.op_derives(op, {"softmax", "attend"}):
        return None
    if g.op_derives(op, {"scores"}):
        # One scaling of the scores; a second multiply after it, or after an op no rule
        # knows (Gemma 2's tanh soft-capping: / cap, tanh, * cap), is not "the" scale.
        # (OPT's `scores * 1.0` after q was scaled is still the scale stage: q's scale came
        # before the scores.)
        return None if _op_after_scores(g, op) or _scores_scaled_before(g, op) else "scale"
    if g.op_derives(op, {"transpose", "view"}):  # q scaled before q @ k^T (torch's own MHA)
        return "scale"
    if g.op_derives(op, {"project", "rotary"}) and _head_scale(scalar_operand(g, op), op, sizes):
        return "scale"  # OPT, BART: q_proj(x) * d_h ** -0.5, before the heads are split
    return None


def _op_after_scores(g: Graph, op: OpRecord) -> bool:
    """An op no rule knows lies between the scores and this op. One before the scores (Meta's
    KV cache written with `cache_k[:, :T] = xk` and read back) says nothing about the scale."""
    seen: set[int] = set()
    todo = list(g.x_inputs(op))
    while todo:
        source = g.producer(todo.pop())
        if source is None or source.index in seen:
            continue
        seen.add(source.index)
        kind = g.kind.get(source.index)
        if kind == "op":
            return True
        if kind != "scores":  # the scores are where the walk stops
            todo.extend(g.x_inputs(source))
    return False


def _scores_scaled_before(g: Graph, op: OpRecord) -> bool:
    """An op upstream of this one already scaled the scores (not q or k before them)."""
    seen: set[int] = set()
    todo = [r for r in g.x_inputs(op)]
    while todo:
        source = g.producer(todo.pop())
        if source is None or source.index in seen:
            continue
        seen.add(source.index)
        if g.kind.get(source.index) == "scale" and g.op_derives(source, {"scores"}):
            return True
        todo.extend(g.x_inputs(source))
    return False


def _head_scale(factor: float | None, op: OpRecord, sizes: Sizes) -> bool:
    """A factor that scales by the head width (1/sqrt(d_h), or its square root when q and k
    are both scaled): evidence that this multiplies queries or keys for the scores."""
    if factor is None or factor == 0:
        return False
    used = 1 / factor if op.name in ("div", "div_", "true_divide") else factor
    return any(abs(used - target) < 1e-6 * max(1.0, target)
               for target in (sizes.d_h ** -0.5, sizes.d_h ** -0.25))


RULES = (scale,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    s = m.s
    first = m.op(unit.ops[0])
    values, snap = m.four_d(unit, BHTT)
    factor = scalar_operand(m.g, first)
    before_ref = m.x_in(first)
    before = m.snap(before_ref)
    d_h = s.d_h
    sqrt = math.sqrt(d_h)
    divides = first.name in ("div", "div_", "true_divide")
    on_q = not m.g.op_derives(first, {"scores"})
    raw = "masked scores" if m.g.op_derives(first, {"mask"}) else "raw scores"
    if on_q:
        raw = f"{m.origin_name(before_ref).split(chr(39) + 's ')[-1]}"
    if divides and factor is not None and abs(factor - sqrt) < 1e-6 * max(1.0, sqrt):
        caption = f"{raw} / sqrt({d_h}) = {raw} / {sqrt:.4f}"
    elif not divides and factor is not None and abs(factor - 1 / sqrt) < 1e-6:
        caption = f"{raw} * d_h ** -0.5 = {raw} * {factor:.4f} = {raw} / sqrt({d_h})"
    elif factor is not None:
        caption = f"{raw} {'/' if divides else '*'} {factor:.6g}"
    else:
        caption = raw
    # Scores in cross-attention are (B, h, T_q, T_k): T_k may equal d_h (8 context tokens,
    # d_h = 8), so scaled scores are named as scores, never by their sizes alone.
    dims = (BHTT if values.ndim == 4 and values.shape[-1] == s.T else
            m.dims(values.shape, BHTT) if values.ndim == 4 and not on_q
            and values.shape[-1] == s.keys else m.dims(values.shape, BHTD))
    rec = m.b.record(m.tensor_name(first, fallback="scores"), snap, dims, values=values,
                     caption=caption)
    groups = m.per_head_ops(unit)
    if m.b.per_head and len(groups) > 1:  # every head's input, not only the first's
        before_values = np.stack([m.snap(m.x_in(grp[0])).values for grp in groups],
                                 axis=m.b.head_axis)
    else:
        before_values = m.b.out_4d([before_ref.op], BHTT)[0] if before_ref.op is not None \
            else before.values
    checks = []
    raw_std, new_std = finite_std(before_values), finite_std(values)
    if raw_std is not None and new_std is not None:
        checks.append(Check(f"spread (std) of the scores: {raw_std:.4f} raw -> "
                            f"{new_std:.4f} scaled" if not on_q else
                            f"spread (std) of {rec.name}: {raw_std:.4f} -> "
                            f"{new_std:.4f}", None))
    else:
        checks.append(Check("a single score: nothing to spread", None))
    if factor is not None:
        expected = 1 / sqrt
        used = 1 / factor if divides else factor
        checks.append(Check(f"the factor is 1/sqrt(d_h) = 1/sqrt({d_h}): "
                            f"{yes(abs(used - expected) < 1e-6)}", None))
    title = explanation = None
    unscaled = factor is not None and (1 / factor if divides else factor) == 1.0
    if unscaled:
        title = f"Not scaled: the factor is 1, not 1/sqrt(d_h) = {1 / sqrt:.4f}"
        explanation = (
            f"Here the scores are {'divided' if divides else 'multiplied'} by exactly 1: this "
            f"module leaves out the 1/sqrt(d_h) = 1/sqrt({d_h}) of scaled dot-product "
            "attention and leaves the scores as they are (T5 does this: it folds the "
            "scaling into how its weights are initialised).")
        note = "No 1/sqrt(d_h) here: the factor is 1."
    elif on_q:
        note = ("Q is scaled before the scores are computed (q * 1/sqrt(d_h)): the scaling "
                "happens here, on the queries, not on the scores; same result.")
    elif raw == "masked scores":
        note = "This module masks before it scales: -inf divided by sqrt(d_h) stays -inf."
    else:
        note = ""
    return m.stage(unit, stage_id, "scale", [rec], checks, shape_in=before_values.shape,
                      shape_out=values.shape if m.b.per_head else snap.shape, dims_in=rec.dims,
                      dims_out=rec.dims, note=note, title=title, explanation=explanation)


# ---------------------------------------------------------------------- judging


def scale_chain(j: Judge, soft: OpRecord) -> tuple[float, list[OpRecord], OpRecord] | None:
    """The factor between the raw product Q_i @ K_i^T and what softmax normalises.

    Walks back from softmax's input through masks, scalings and reshapes to the scores
    product, then from its two operands back to the projections: a scale applied to q
    (torch's own MHA), to the scores, or inside the softmax call all count; the factor
    is measured as the ratio of the numbers after to before each scaling op.
    """
    xs = j.g.x_inputs(soft)
    if not xs:
        return None
    ref, factor, ops = xs[0], 1.0, []
    for _ in range(32):
        op = j.g.producer(ref)
        if op is None:
            return None
        inputs = j.g.x_inputs(op)
        if j.kind(op) == "cosine":  # a learned scale of cosines: cosine's to judge
            return None
        if j.kind(op) == "softcap" and inputs:  # cap · tanh(s / cap): softcap's to judge,
            ref = inputs[0]  # and its / cap and * cap are no scaling of the scores
            continue
        if j.kind(op) == "sinks" and op.name == "cat" and len(inputs) == 1:
            ref = inputs[0]  # gpt-oss's `cat([QK, S])`: the sink column is no scaling
            continue
        if op.name in ("matmul", "bmm", "baddbmm", "einsum") and len(inputs) >= 2:
            operands = j.g.tensor_operands(op)
            if op.name == "baddbmm":  # bias + alpha * (batch1 @ batch2): alpha scales
                operands = operands[1:]
                alpha = op.kwarg("alpha", 1.0)
                factor *= float(alpha) if isinstance(alpha, int | float) else 1.0
            for operand in operands[:2]:
                _, f, _, passed = j.chain_to_projection(operand, over_rotary=True)
                factor *= f
                ops.extend(p for p in passed if p.name in SCALE_OPS)
            return factor, ops, op
        if op.name in SCALE_OPS and len(inputs) == 1:
            r = ratio(f64(op.out.values), f64(j.g.snap(inputs[0]).values))
            if r is not None:
                factor *= r
            ops.append(op)
        elif op.name not in MASK_OPS | SHAPE_OPS or not inputs:
            return None
        ref = inputs[0]
    return None


def judge(j: Judge) -> list[Row]:
    stages = [s for s in j.trace.stages if s.kind == "scale" and not j.is_sdpa(s)]
    terms = disentangled_scale(j)
    # --expect pos_bias with DeBERTa's n + 1 terms: each over sqrt((n + 1) d_h), as expected
    grown = terms is not None and position_bias.EXPECTED in j.facts.mechanisms
    expected = 1 / math.sqrt(j.d_h * (terms if grown else 1))  # type: ignore[operator]
    unscaled = position_bias.t5_unscaled(j)  # T5: 1/sqrt(d_h) folded into W_Q's init
    expected = 1.0 if unscaled else expected
    chains = [c for c in (scale_chain(j, op) for op in j.softmax_ops()) if c is not None]
    if not chains:
        return [j.row(s, "scale", None, None, "not judged: no path from the scores to "
                                                 "softmax was found") for s in stages]
    totals = [c[0] for c in chains]
    # A ratio of a half-precision module's rounded numbers is off by up to its rounding
    # (`check --dtype bfloat16`: 2^-6), far below any wrong scale's (sqrt(h), d_h ...).
    rel = _rel_tol()
    ok = all(math.isclose(t, expected, rel_tol=rel) for t in totals)
    total = next((t for t in totals if not math.isclose(t, expected, rel_tol=rel)), totals[0])
    scale_ops = [op for c in chains for op in c[1]]
    scores_op = chains[0][2]
    last_op = scale_ops[0] if scale_ops else None  # walked backwards: the last applied
    out = f64(last_op.out.values) if last_op is not None else f64(scores_op.out.values)
    finite = out[np.isfinite(out) & (out > LARGE_NEGATIVE)]
    diff = float(np.abs(finite - finite * expected / total).max()) if finite.size and total else 0.0
    checked = (f"scores * 1/sqrt({terms} d_h) = {expected:.4f} before softmax, DeBERTa's "
               f"{terms} terms (measured {_factor(total)})" if grown else
               f"scores not scaled before softmax, as T5's with its position bias (measured "
               f"{_factor(total)})" if unscaled else
               f"scores * 1/sqrt(d_h) = {expected:.4f} before softmax (measured {_factor(total)})")
    diagnosis = None if ok else scale_diagnosis(j, total)
    if not ok and terms is not None and math.isclose(total, 1 / math.sqrt(terms * j.d_h),
                                                     rel_tol=rel):
        # DeBERTa: every one of its terms over sqrt(3 d_h): the position terms' mechanism
        stage = next(s for s in j.trace.stages if s.kind == "pos_bias")
        diagnosis = ("mechanism", f"differs: {position_bias.mechanism(j, stage)}")
    note = ""
    per_chain = len(chains[0][1])
    if ok and per_chain == 1 and scale_ops[0].name.startswith("mul"):
        note = "multiplies by d_h ** -0.5 instead of dividing by sqrt(d_h): equivalent"
    elif ok and per_chain > 1:
        note = (f"scales in {per_chain} steps whose product is 1/sqrt(d_h) (e.g. q and k "
                "each by d_h ** -0.25): equivalent")
    upstream = {p.index for c in chains for operand in
                j.g.tensor_operands(c[2])[-2:]
                for p in j.chain_to_projection(operand)[3] if p.name in SCALE_OPS}
    if note:
        j.differences.append(note)
    if ok and upstream:
        j.differences.append("scales q (or k) before the product q @ k^T instead of the "
                                "scores: equivalent")
    if unscaled and ok:
        j.differences.append("does not scale the scores, as T5 (which folds 1/sqrt(d_h) into "
                             "W_Q's initialisation): with --expect pos_bias, equivalent")
    if not stages:
        if ok:
            return []
        src = last_op.source if last_op is not None else scores_op.source
        return [j.row(None, "scale", False, diff, checked + (
            "; no op scales them" if last_op is None else ""), source=src,
            diagnosis=diagnosis, position=j.position_after("scores"))]
    rows = []
    for stage in stages:
        final = stage is stages[-1]
        src = last_op.source if final and last_op is not None else None
        rows.append(j.row(stage, "scale", ok if final else None, diff if final else None,
                             checked if final else "part of the scaling, judged with the last",
                             source=src, note=note if final else "",
                             diagnosis=diagnosis if final else None))
    return rows


def _rel_tol() -> float:
    """How close a measured scale must come: 1e-5, or the module's dtype's rounding."""
    return tolerance(rtol=1e-5)["rtol"]


def scale_diagnosis(j: Judge, total: float) -> tuple[str, str]:
    named = [
        ("scaled_by_sqrt_C", 1 / math.sqrt(j.C),
         f"scaled by 1/sqrt(C) = 1/sqrt({j.C}) (the model width) instead of 1/sqrt(d_h) = "
         f"1/sqrt({j.d_h}) (one head's width): the scaled scores are {total:.4f} times the "
         f"raw ones, sqrt(h) = {math.sqrt(j.h):.4f} times too small"),
        ("not_scaled", 1.0, "the scores are not scaled: what softmax gets is 1.0000 times "
                            f"Q @ K^T, it should be 1/sqrt({j.d_h}) = "
                            f"{1 / math.sqrt(j.d_h):.4f} times"),
        ("scaled_by_d_h", 1 / j.d_h,
         f"divided by d_h = {j.d_h} instead of sqrt(d_h): scaled / raw = {total:.4f}"),
        ("scale_inverted", math.sqrt(j.d_h),
         f"multiplied by sqrt(d_h) instead of dividing: scaled / raw = {total:.4f}"),
        ("scaled_by_C", 1 / j.C, f"divided by C = {j.C}: scaled / raw = {total:.4f}"),
    ]
    for kind, value, message in named:
        if math.isclose(total, value, rel_tol=_rel_tol()) and not math.isclose(
                value, 1 / math.sqrt(j.d_h), rel_tol=1e-9):
            return kind, message
    return "wrong_scale", (f"scaled by {_factor(total)}; it should be 1/sqrt(d_h) = "
                           f"{1 / math.sqrt(j.d_h):.4f}")


def why(cell: Cell) -> Why:
    """A scaled score: the division (or product) and the d_h it comes from."""
    op, index = cell.per_head(cell.ops("div", "mul", "true_divide", "multiply", "div_", "mul_"))
    return scaled_why(cell, float(cell.operand(op, 0)[index]), cell.scalar(op),
                      op.name in ("div", "true_divide", "div_"), cell.trace.config.head_dim)


def scaled_why(cell: Cell, before: float, number: float, divides: bool, d_h: int,
               origin: str = "") -> Why:
    """The arithmetic of one scaled score, whoever computed its inputs: before / number or
    before × number, and whether the number is √d_h (1/√d_h); `origin` says where the number
    came from when it is not an operand of the module's own op (sdpa's `scale=`)."""
    computed = before / number if divides else before * number
    notes = [origin] if origin else []
    if divides and math.isclose(number, math.sqrt(d_h), rel_tol=1e-6):
        notes.append(f"the divisor is √d_h: d_h = {d_h}, √{d_h} = {number:.6g}")
    elif not divides and math.isclose(number, 1 / math.sqrt(d_h), rel_tol=1e-6):
        notes.append(f"the factor is 1/√d_h: d_h = {d_h}, 1/√{d_h} = {number:.6g}")
    else:
        notes.append(f"d_h = {d_h}; this {'divisor' if divides else 'factor'} is not "
                     f"{'√d_h' if divides else '1/√d_h'} "
                     f"({math.sqrt(d_h) if divides else 1 / math.sqrt(d_h):.6g})")
    terms = (Term("before", (), before),
             Term("÷ divisor" if divides else "× factor",
                  (before, "/" if divides else "×", number), computed))
    return Why(cell.stage.id, "scale", cell.record.name, cell.index, where(cell),
               f"{cell.name} = score {'/' if divides else '×'} {number:.6g}", terms,
               tuple(notes), computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The number the scores were divided by, read off one recorded cell before and after."""
    if not stage.tensors:
        return ()
    after = stage.tensors[-1]
    at = trace.index(stage.id)
    if at == 0 or not trace.stages[at - 1].tensors:
        return ()
    before = trace.stages[at - 1].tensors[-1]
    if before.shape != after.shape:
        return ()
    b, a = before.values.astype(np.float64), after.values.astype(np.float64)
    usable = np.isfinite(b) & np.isfinite(a) & (np.abs(a) > 1e-3) & (b > LARGE_NEGATIVE)
    if not usable.any():
        return ()
    index = tuple(int(k) for k in np.unravel_index(int(np.argmax(np.where(usable, np.abs(a), -1))),
                                                     a.shape))
    divisor = float(b[index] / a[index])
    spot = ", ".join(map(str, index))
    origin = f"both mha-tui's expansion, {EXPANDED}" if expanded_from(stage) else "both recorded"
    return (Question(stage.id, "divisor", "By what number are the scores divided here?",
                     "number", divisor, number_text(divisor),
                     f"{before.name}[{spot}] at {trace.stages[at - 1].id} / {after.name}[{spot}] "
                     f"at {stage.id}, {origin}: "
                     f"{b[index]:.6g} / {a[index]:.6g} = {divisor:.6g} (sqrt(d_h) = "
                     f"{math.sqrt(trace.config.head_dim):.6g}; computed by mha-tui)"),)


def _factor(value: float) -> str:
    """A measured scale factor as the words print it: 0.5000, or 1e+38 when four decimals
    would print forty digits (a factor that overflows the scores)."""
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"
