"""position_bias: numbers added to the scores that depend on where the tokens are, not on
what they are: ALiBi (a slope per head times the key's position; BLOOM, MPT) and T5's
relative-position buckets (a learned number per head and distance).

Recognised from the ops and values, never from names: an add onto the scores (before
softmax) of a tensor that does not come from the projections and holds no mask value; its
shape across heads and positions says which kind it is. BLOOM's baddbmm adds its ALiBi bias
in the same call as q @ k^T: the scores kind shows that bias with `bias_stage()` below.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import tolerance
from ..ops.sizes import Sizes
from ..ops.vocab import very_negative
from ..records import Check, OpRecord, Ref, Snapshot, Stage, TensorRecord, Trace
from ._parts.builder import BHTT
from ._parts.cell import Cell, Term, Why, WhyError, dot, maker, where
from ._parts.grown import Part
from ._parts.maker import StageMaker, synthetic
from ._parts.quizzing import Question, cell_index, head_of_interest, number_text, token_name
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "pos_bias"  # short: the app's rail is narrow
EXPECTED = "pos_bias"  # check --expect pos_bias grows the reference by reference(j)


def adds_position_bias(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """scores + a bias that does not come from x's projections and blocks nothing."""
    if op.name not in {"add", "add_"} or len(op.inputs) != 2:
        return None
    if not g.op_derives(op, {"scores", "scale"}) or g.op_derives(op, {"softmax", "mask"}):
        return None
    scores = [ref for ref in op.inputs if g.derives(ref, {"scores", "scale"})]
    others = [ref for ref in op.inputs if not g.derives(ref, {"scores", "scale", "project"})]
    if len(scores) != 1 or len(others) != 1:
        return None
    bias = g.snap(others[0]).values
    if bias.dtype.kind != "f" or very_negative(bias) or not np.isfinite(bias).all():
        return None
    if bias.size < 2 or np.ptp(bias) == 0:  # one number added everywhere changes nothing
        return None
    return KIND


_PRODUCTS = {"einsum", "matmul", "bmm", "mul"}
_CARRY = {"getitem", "unsqueeze", "view", "reshape", "expand", "contiguous", "to", "float",
          "type_as", "permute", "transpose", "flatten", "squeeze"}


# What a relative term passes through on its way to the scores: shape ops, a gather of
# each query's relative positions (DeBERTa), a division by a number (DeBERTa's sqrt(3 d_h)),
# and the sum of several terms (DeBERTa's c2p + p2c).
_THROUGH = _CARRY | {"gather", "div", "div_", "true_divide", "add", "add_"}


def _term_of_q(g: Graph, ref: Ref) -> bool:
    """ref is made from the queries (or the keys: a projection, not the scores) times a
    table not made from x, through shape ops, gathers, a division and sums of such terms:
    SAM's einsum("bhwc,hkc->bhwk", q, R_h), DeBERTa's gather(q @ pos_key^T) / sqrt(3 d_h)
    + its position-to-content twin made from k."""
    todo, seen, found = [ref], set(), False
    while todo:
        r = todo.pop()
        op = g.producer(r)
        if op is None or g.derives(r, {"scores", "scale", "softmax"}) or len(seen) > 32:
            return False
        if op.index in seen:
            continue
        seen.add(op.index)
        if op.name in _PRODUCTS and g.op_derives(op, {"project"}) and g.other_inputs(op) and \
                any(g.snap(o).ndim >= 2 for o in g.other_inputs(op)):
            found = True
            continue
        if op.name not in _THROUGH or not g.x_inputs(op):
            return False
        todo.extend(g.x_inputs(op))
    return found


def adds_relative_terms(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """scores + q · R: relative-position terms made from the queries and a learned table
    (SAM's decomposed 2-D height and width terms, DeBERTa's content-to-position and
    position-to-content terms), added before softmax; and the ops that make the terms."""
    if op.name in {"add", "add_"} and len(op.inputs) == 2 and \
            g.op_derives(op, {"scores", "scale"}) and not g.op_derives(op, {"softmax", "mask"}):
        terms = [r for r in op.inputs if not g.derives(r, {"scores", "scale"})]
        return KIND if len(terms) == 1 and _term_of_q(g, terms[0]) else None
    if op.name in _PRODUCTS | _THROUGH and g.op_derives(op, {"project"}) and \
            not g.op_derives(op, {"scores", "scale", "softmax"}):
        return KIND if _feeds_relative_add(g, op) else None
    return None


def _feeds_relative_add(g: Graph, op: OpRecord, depth: int = 8) -> bool:
    """The op's result goes, through a few shape ops, gathers and sums of terms, into an
    add onto the scores as a q · R term."""
    todo, seen = [op.index], set()
    while todo and depth:
        depth -= 1
        nxt = []
        for i in todo:
            for c in g.consumers[i]:
                if c in seen:
                    continue
                seen.add(c)
                user = g.ops[c]
                if user.name in {"add", "add_"} and g.op_derives(user, {"scores", "scale"}):
                    return _term_of_q(g, Ref("op", op=i))
                if user.name in _THROUGH | _PRODUCTS:
                    nxt.append(c)
        todo = nxt
    return False


RULES = (adds_position_bias, adds_relative_terms)


@dataclass(frozen=True)
class BiasShape:
    kind: str  # "alibi", "relative", "other"
    slopes: tuple[float, ...] = ()


def bias_shape(bias: np.ndarray) -> BiasShape:
    """bias (h, T, T) as the scores see it: ALiBi when each head's row is its slope times the
    key position (plus a constant per row, which softmax ignores) and the slopes differ;
    relative when it depends only on the distance j - i."""
    h, T, _ = bias.shape
    if T >= 2:
        steps = np.diff(bias, axis=-1)  # (h, T, T - 1)
        slopes = steps[:, :, :1]
        if np.allclose(steps, slopes, **tolerance(atol=1e-6, rtol=1e-4)) and \
                np.allclose(slopes, slopes[:, :1], **tolerance(atol=1e-6, rtol=1e-4)):
            per_head = tuple(float(s) for s in slopes[:, 0, 0])
            if len(set(np.round(per_head, 8))) > 1 or h == 1:
                return BiasShape("alibi", per_head)
        rows, cols = np.indices((T, T))
        distance = cols - rows
        relative = all(np.allclose(bias[:, distance == d], bias[:, distance == d][:, :1],
                                   **tolerance(atol=1e-6, rtol=1e-5)) for d in range(-T + 1, T))
        if relative:
            return BiasShape("relative")
    return BiasShape("other")


def bias_stage(m: StageMaker, stage_id: str, bias: np.ndarray, before: np.ndarray,
               after: np.ndarray, *, unit: Unit | None = None, base: Stage | None = None,
               bias_name: str = "position bias", note: str = "", per_row: bool = False
               ) -> Stage:
    """The stage of a position bias: the bias per head, the scores before and after.
    per_row: terms made from each batch row's queries (SAM, DeBERTa), kept row by row (B, h,
    T, T); else one row's, the same for every row."""
    h = m.s.h
    rows = np.broadcast_to(bias, after.shape).reshape(-1, *after.shape[-3:]) \
        if bias.ndim >= 3 else np.broadcast_to(bias, after.shape[-3:])[None]
    full = np.asarray(rows[0], dtype=np.float64)
    shape = bias_shape(full.reshape(-1, *after.shape[-2:])[-h:]) if full.ndim == 3 else \
        BiasShape("other")
    kept = np.asarray(rows, dtype=np.float64) if per_row and after.ndim == 4 else full[None]
    tensors: list[TensorRecord] = [
        m.b.record(bias_name, synthetic(kept.astype(after.dtype)), BHTT,
                   caption="what is added to each head's scores: row query, column key"),
        m.b.record("scores + bias", synthetic(after), BHTT if after.ndim == 4 else None)]
    added = after.astype(np.float64) - before.astype(np.float64)
    ok = bool(np.allclose(added, np.broadcast_to(kept if per_row else full, added.shape),
                          **tolerance(atol=1e-5, rtol=1e-4)))
    checks = [Check("the scores after minus the scores before equal the bias, for every head "
                    "(computed by mha-tui)", ok)]
    if shape.kind == "alibi":
        slopes = ", ".join(f"{s:.4g}" for s in shape.slopes)
        ratios = [b / a for a, b in zip(shape.slopes, shape.slopes[1:], strict=False) if a]
        geometric = bool(ratios) and np.allclose(ratios, ratios[0], **tolerance(atol=1e-8, rtol=1e-3))
        title = "ALiBi position bias: each head penalises distance with its own slope"
        checks.append(Check(f"head h adds m_h × (key position) to every row: slopes m = "
                            f"{slopes}" + (f" (a geometric series, ratio {ratios[0]:.4g})"
                                           if geometric else ""), None))
        explanation = (
            "ALiBi (attention with linear biases): no position embedding is added to x. Each "
            "head adds to its scores a number proportional to the key's position, m_h × j; "
            "a constant per row changes nothing after softmax, so this is the same as "
            "subtracting m_h × (i − j), the distance back from the query. Far-away tokens get "
            "lower scores; heads with a large slope look close by, heads with a small slope far. "
            "The slopes are fixed, not learned.")
    elif shape.kind == "relative":
        title = "Relative position bias: a number per head and distance"
        T = full.shape[-1]
        checks.append(Check(f"the bias depends only on the distance j − i: one number per head "
                            f"on each of the {2 * T - 1} diagonals (found by mha-tui)", None))
        explanation = (
            "A learned bias per head for each distance between query and key (T5 groups "
            "distances into buckets: exact for near tokens, coarser further away). It depends "
            "only on j − i, never on the tokens, and is added to every head's scores before "
            "softmax.")
    else:
        title = "Position bias added to the scores"
        explanation = ("Numbers that do not depend on the tokens are added to the scores before "
                       "softmax: a bias on which positions each head prefers.")
    if unit is not None:
        return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=before.shape,
                       shape_out=after.shape, dims_in=BHTT, dims_out=BHTT, title=title,
                       explanation=explanation, note=note)
    assert base is not None
    return Stage(id=stage_id, title=title, code=base.code, explanation=explanation,
                 shape_in=tuple(before.shape), shape_out=tuple(after.shape), dims_in=BHTT,
                 dims_out=BHTT, tensors=tuple(tensors), checks=tuple(checks), note=note,
                 kind=KIND, source=base.source, ops=base.ops)


def _build_terms(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    """q · R terms added to the scores: the terms (the scores after minus before) per head."""
    g = m.g
    mine = [i for i in unit.ops if g.from_x[i]]  # not the helpers that index the tables
    adds = [m.op(i) for i in mine if m.op(i).name in {"add", "add_"}
            and any(g.derives(r, {"scores", "scale"}) for r in m.op(i).inputs)]
    first, last = adds[0], m.op(max(mine))
    scores_ref = next(r for r in first.inputs if g.derives(r, {"scores", "scale"}))
    start = scores_ref
    while True:  # back from the add's view of the scores to the scores themselves
        producer = g.producer(start)
        if producer is None or producer.name not in _CARRY or not g.x_inputs(producer) or \
                g.kind.get(producer.index) not in (None, "aux", KIND):
            break
        start = g.x_inputs(producer)[0]
    before_snap = m.snap(start)
    after = last.out.values
    if after.size != before_snap.values.size:
        raise ValueError("the terms' sum is not the scores' shape")
    after4 = after.reshape(m.s.B, -1, m.s.T, m.s.T) if after.ndim != 4 else after
    before4 = before_snap.values.reshape(after4.shape)
    stage = bias_stage(m, stage_id, after4 - before4, before4, after4, unit=unit,
                       bias_name="q · R terms", per_row=True)
    words = ("Relative position terms made from the queries: each query's vector is dotted with "
             "a learned table of relative positions (SAM: one for the height, one for the width "
             "of the image grid, add_decomposed_rel_pos) and the results are added to its "
             "scores before softmax. Unlike ALiBi or T5's bias they depend on the query's "
             "content as well as on the distance.")
    if any(m.op(i).name == "gather" for i in mine):
        n = len(relative_terms(g, (m.op(i) for i in mine))) + 1
        words = ("Disentangled attention (DeBERTa): besides content-to-content q · k, each "
                 "query is dotted with a learned table of relative positions "
                 "(content-to-position) and each key with another (position-to-content); "
                 "gather picks, for every (query, key) pair, the entry of their relative "
                 f"position δ(i, j), and the terms are added to the scores. All {n} terms are "
                 f"divided by sqrt({n} d_h), not sqrt(d_h), so that their sum keeps the scale "
                 "of one.")
    from dataclasses import replace as _replace

    return _replace(stage, title="Relative position terms: q · R added to the scores",
                    explanation=words)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    if any(m.op(i).name in _PRODUCTS and m.g.op_derives(m.op(i), {"project"}) and
           not m.g.op_derives(m.op(i), {"scores", "scale"}) for i in unit.ops):
        return _build_terms(m, unit, stage_id)  # q · R made here, not a bias handed in
    op = m.op(unit.ops[0])
    g = m.g
    scores_ref = next(ref for ref in op.inputs if g.derives(ref, {"scores", "scale"}))
    bias_ref = next(ref for ref in op.inputs if ref is not scores_ref)
    after, _ = m.four_d(unit, BHTT)
    before = _four(m, m.snap(scores_ref), after.shape)
    bias = m.snap(bias_ref).values
    name = _written_name(op) or m.spelled(bias_ref, op)
    note = ""
    if bias_ref.kind == "input":
        note = (f"This attention module does not compute the bias: it arrives as its forward's "
                f"argument `{bias_ref.name or name}`, made outside it (by the model, or by an "
                f"earlier layer, as T5's first layer does for all the others).")
    return bias_stage(m, stage_id, np.broadcast_to(bias, after.shape) if bias.ndim <= 4 else bias,
                      before, after, unit=unit, bias_name=name, note=note)


def _written_name(op: OpRecord) -> str | None:
    """The bias as the add's line names it: `scores = scores + position_bias` gives
    position_bias (the one name on the right that is not the one assigned)."""
    target, equals, right = op.source.text.partition("=")
    if not equals or right.startswith("="):
        return None
    names = [n for n in re.findall(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+)*", right)
             if n != target.strip()]
    return names[0] if len(names) == 1 else None


def _four(m: StageMaker, snap: Snapshot, shape: tuple[int, ...]) -> np.ndarray:
    values = snap.values
    return values.reshape(shape) if values.size == int(np.prod(shape)) else values


# ---------------------------------------------------------------------- judging


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi's fixed slope per head (Press et al.; BLOOM's and MPT's build_alibi): for h a
    power of 2, 2^(-8 i / h), i = 1..h; otherwise those of the power of 2 below h, then
    every other slope of the power of 2 above it."""
    def power_of_2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(np.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** int(np.floor(np.log2(heads)))
    slopes = power_of_2(closest)
    if closest != heads:
        slopes += power_of_2(2 * closest)[0::2][: heads - closest]
    return np.asarray(slopes, dtype=np.float64)




def judge(j: Judge) -> list[Row]:
    """Each position-bias stage, from its own tensors (the bias as the scores see it, and
    the scores after it): the bias is what was added; with `--expect alibi` it must be
    ALiBi's m_h (j - i) with the fixed slopes (alibi_slopes), compared on
    the entries softmax sees, each row from its diagonal (a constant per row changes
    nothing after softmax)."""
    rows = _expected(j) if EXPECTED in j.facts.mechanisms else []
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        if len(stage.tensors) < 2 or stage.tensors[0].values.ndim < 2:
            rows.append(j.row(stage, KIND, None, None, "not judged: no bias tensor recorded"))
            continue
        T = stage.tensors[0].values.shape[-1]
        bias = np.asarray(stage.tensors[0].values, dtype=np.float64).reshape(-1, T, T)[-j.h:]
        shape = bias_shape(bias) if bias.shape[0] == j.h else BiasShape("other")
        measured = ", ".join(f"{m:.4g}" for m in shape.slopes[:4]) + \
            (", ..." if len(shape.slopes) > 4 else "")
        said = {"alibi": f"ALiBi, slopes {measured}", "relative": "a relative-position bias"
                }.get(shape.kind, "a position bias")
        added = all(c.ok is not False for c in stage.checks[:1])
        if not j.facts.alibi:
            grown = EXPECTED in j.facts.mechanisms  # in the reference, by --expect pos_bias
            rows.append(j.row(stage, KIND, added, None,
                              f"scores + {said}: the bias is what was added (" + (
                                  "the reference adds the module's own terms: --expect pos_bias"
                                  if grown else "not part of plain attention; check --expect "
                                  "alibi for an ALiBi exercise") + ")"))
            continue
        slopes = alibi_slopes(j.h)
        expected = ", ".join(f"{m:.4g}" for m in slopes[:4]) + (", ..." if j.h > 4 else "")
        distance = np.arange(T)[None, :] - np.arange(T)[:, None]  # (T, T): j - i
        seen = np.tril(np.ones((T, T), bool)) if j.facts.causal else np.ones((T, T), bool)
        relative = bias - np.diagonal(bias, axis1=1, axis2=2)[:, :, None]  # each row from i = j
        want = slopes[:, None, None] * distance  # (h, T, T)
        diff = float(np.abs(relative - want)[:, seen].max()) if bias.shape[0] == j.h else np.inf
        ok = added and diff <= 1e-5 + 1e-4 * float(np.abs(want).max(initial=1.0))
        checked = (f"scores + ALiBi's m_h (j − i), slopes {expected} (2^(−8i/h)): {said} "
                   f"measured")
        diagnosis = None
        if not ok:
            if shape.kind == "alibi" and all(m < 0 for m in shape.slopes):
                message = (f"ALiBi slopes {measured} where {expected} were expected: the bias "
                           f"must fall with the distance back to the key, not grow")
            elif shape.kind == "alibi":
                message = (f"ALiBi slopes {measured} where {expected} were expected "
                           f"(head i of h gets 2^(−8i/h), i = 1..h)")
            else:
                message = (f"the bias added to the scores is not ALiBi's m_h (j − i) with "
                           f"slopes {expected}: it is {said} (off by up to {diff:.3g})")
            diagnosis = ("alibi_slopes", message)
        rows.append(j.row(stage, KIND, ok, diff, checked, diagnosis=diagnosis))
    return rows


def why(cell: Cell) -> Why:
    """A biased score: the score plus the bias at this head, query and key; inside BLOOM's
    baddbmm, beta · bias + alpha · (q · k)."""
    bias_record = cell.stage.tensors[0]
    op, at = maker(cell, {"add", "add_", "baddbmm"})
    bias_value = float(np.broadcast_to(bias_record.values, cell.record.values.shape)[cell.index])
    i, j = cell.index[-2], cell.index[-1]
    if op.name == "baddbmm":
        bias = np.broadcast_to(cell.operand(op, 0), op.out.shape)
        queries, keys_t = cell.operand(op, 1), cell.operand(op, 2)
        beta = float(op.kwarg("beta", 1.0))  # type: ignore[arg-type]
        alpha = float(op.kwarg("alpha", 1.0))  # type: ignore[arg-type]
        *lead, qi, kj = at
        row, col = queries[(*lead, qi)], keys_t[(*lead, slice(None), kj)]
        terms, notes, total = dot(cell, row, col, [f"d{k}: Q[{qi}, {k}] × K[{kj}, {k}]"
                                                   for k in range(len(row))], "products")
        added = float(bias[tuple(at)])
        computed = beta * added + alpha * total
        terms = (*terms[:-1], Term("q · k", (), total), Term("× alpha", (total, "×", alpha), alpha * total),
                 Term("+ beta × bias", (beta, "×", added), beta * added), Term("sum", (), computed))
        return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
                   f"{cell.name} = beta · bias[{i}, {j}] + alpha · Q[{qi}, :] · K[{kj}, :]  "
                   "(one baddbmm call)", terms,
                   ("baddbmm adds the bias and the scaled scores in one call: its recorded inputs",
                    *notes), computed, cell.recorded)
    operands = [np.broadcast_to(cell.operand(op, k), op.out.shape) for k in (0, 1)]
    full_bias = np.broadcast_to(bias_record.values, cell.record.values.shape)
    k = next((k for k in (0, 1) if np.array_equal(operands[k].reshape(full_bias.shape), full_bias)),
             None)
    if k is None:
        raise WhyError(f"cannot find the bias among the inputs of {cell.stage.id}'s add")
    score, added = float(operands[1 - k][tuple(at)]), float(operands[k][tuple(at)])
    computed = score + added
    if added != bias_value:
        raise WhyError(f"the bias at {cell.name} is not the stage's {bias_record.name}")
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = score[{i}, {j}] + bias[{i}, {j}]",
               (Term("the score (the add's recorded input)", (), score),
                Term(f"+ bias[{i}, {j}]", (), added), Term("sum", (score, "+", added), computed)),
               ("the bias depends on the positions (query row, key column) and the head, never "
                "on the tokens",), computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """One number of the bias: head 1, the last query, the key just before it."""
    if not stage.tensors or len(stage.tensors[0].shape) < 2:
        return ()
    bias = stage.tensors[0]
    head = head_of_interest(bias)
    i = bias.shape[-2] - 1
    j = max(0, i - 1)
    index = cell_index(bias, head=head, row=i, col=j)
    value = float(bias.values[index])
    spot = ", ".join(map(str, index))
    return (Question(stage.id, "value", f"What number is added to head {head}'s score of "
                     f"query {token_name(trace, i)} (row {i}) against key "
                     f"{token_name(trace, j)} (column {j})?", "number", value, number_text(value),
                     f"{bias.name}[{spot}], recorded: the bias depends on the positions and "
                     "the head, never on the tokens"),)


def relative_terms(g: Graph, ops: Iterable[OpRecord]) -> list[OpRecord]:
    """The products that make relative-position terms from q or k among a stage's ops
    (SAM's two einsums, DeBERTa's c2p and p2c bmm)."""
    return [op for op in ops if op.name in _PRODUCTS and g.from_x[op.index]
            and any(g.snap(r).ndim >= 2 for r in g.other_inputs(op))]


def disentangled_scale(j: Judge) -> int | None:
    """DeBERTa's scale: n + 1 when the module adds n relative terms gathered by position
    (c2p, p2c) and so divides every term by sqrt((n + 1) d_h); None without such terms."""
    g = j.classified()
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        if any(op.name == "gather" for op in stage.ops):
            return len(relative_terms(g, stage.ops)) + 1
    return None


def mechanism(j: Judge, stage: Stage) -> str | None:
    """What `check` says when the module leaves plain attention at this stage: the position
    terms or bias added to the scores, from the same recognition the stage shows."""
    g = j.classified()
    terms = relative_terms(g, stage.ops)
    if terms and any(op.name == "gather" for op in stage.ops):
        n = len(terms) + 1
        return (f"relative position terms added to the scores (DeBERTa's disentangled "
                f"attention): besides content-to-content q · k, {len(terms)} terms made from the "
                f"queries and keys with learned tables of relative positions (content-to-position "
                f"q · R[δ(i, j)], position-to-content k · R[δ(j, i)], gathered by relative "
                f"position), every term divided by sqrt({n} d_h) = {np.sqrt(n * j.d_h):.4g} "
                f"instead of sqrt(d_h); plain multi-head attention has no positions")
    if terms:
        return ("relative position terms added to the scores before softmax, made from the "
                "queries: q · R with learned tables of relative positions (decomposed over the "
                "grid's height and width, as SAM's add_decomposed_rel_pos); plain multi-head "
                "attention has no positions")
    if not stage.tensors or stage.tensors[0].values.ndim < 2:
        return None
    T = stage.tensors[0].values.shape[-1]
    bias = np.asarray(stage.tensors[0].values, dtype=np.float64).reshape(-1, T, T)[-j.h:]
    shape = bias_shape(bias) if bias.shape[0] == j.h else BiasShape("other")
    if shape.kind == "relative":
        return ("a relative position bias added to the scores: a learned number per head and "
                "distance j − i (T5's buckets); plain multi-head attention has no positions")
    return None  # ALiBi and other biases: said from the values (check --expect alibi)


# ------------------------------------------------------------ check --expect pos_bias


def t5_unscaled(j: Judge, *, expected: bool = True) -> bool:
    """--expect pos_bias on T5's attention: a learned bias per head and distance (its
    buckets) and scores that are never scaled (T5 folds 1/sqrt(d_h) into W_Q's
    initialisation), which the reference then leaves unscaled too. `expected`: only with
    --expect pos_bias (the scale's judge); the reference asks whenever it grows the bias."""
    raw = next((s.tensors[0].values for s in j.trace.stages if s.kind == "scores"
                and s.tensors), None)
    if (expected and EXPECTED not in j.facts.mechanisms) or raw is None:
        return False
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        if relative_terms(j.classified(), stage.ops) or len(stage.tensors) < 2:
            continue
        T = stage.tensors[0].values.shape[-1]
        bias = np.asarray(stage.tensors[0].values, dtype=np.float64).reshape(-1, T, T)[-j.h:]
        after = np.asarray(stage.tensors[1].values, dtype=np.float64)
        if bias.shape[0] != j.h or bias_shape(bias).kind != "relative" or after.size != raw.size:
            continue
        before = after - np.broadcast_to(stage.tensors[0].values, after.shape)
        return bool(np.allclose(before, raw.reshape(after.shape), **tolerance(atol=1e-5, rtol=1e-4)))
    return False


def reference(j: Judge) -> Part | None:
    """--expect pos_bias: the module's own position terms or bias, as its stage shows them
    added to the scores (each batch row's own when made from its queries, else one row's),
    added to the scores scaled by 1/sqrt(d_h) (DeBERTa's n + 1 terms: 1/sqrt((n + 1) d_h))."""
    stage = next((s for s in j.trace.stages if s.kind == KIND and s.tensors
                  and s.tensors[0].values.ndim >= 3), None)
    if stage is None:
        return None
    T = stage.tensors[0].values.shape[-1]
    bias = np.asarray(stage.tensors[0].values, dtype=np.float64)
    if bias.size % (j.h * T * T) or bias.shape[-2] != T:
        return None
    bias = bias.reshape(-1, j.h, T, T)
    # made from each row's queries (SAM, DeBERTa): every row's own terms, (B, h, T, T);
    # else one row's, the same for every row, (1, h, T, T)
    if not (relative_terms(j.classified(), stage.ops) and bias.shape[0] == j.B):
        bias = bias[:1]
    n = disentangled_scale(j)
    said = mechanism(j, stage) or "a position bias added to the scores"
    said = said.split(";")[0].split(":")[0]
    if n is not None:
        return Part(f"{said} (every term divided by sqrt({n} d_h))", bias=bias,
                    score_scale=1.0 / np.sqrt(n * j.d_h))
    if t5_unscaled(j, expected=False):
        return Part(f"{said} (the module's own, added to scores that are not scaled, as T5's)",
                    bias=bias, score_scale=1.0)
    return Part(f"{said} (the module's own, added to the scaled scores)", bias=bias)


def _expected(j: Judge) -> list[Row]:
    """Rows for --expect pos_bias: none added to the scores."""
    if any(s.kind == KIND for s in j.trace.stages):
        return []
    scores = next((s for s in j.trace.stages if s.kind in ("scores", "sdpa")), None)
    return [j.row(None, KIND, False, None, "relative position terms added to the scores",
                  source=scores.source if scores is not None else None,
                  position=j.position_before("mask"),
                  diagnosis=("mechanism_missing", "no position bias: --expect pos_bias wants "
                             "relative position terms added to the scores before softmax (T5's "
                             "buckets, SAM's decomposed q · R, DeBERTa's c2p and p2c), and "
                             "nothing not made from the tokens' content was added to them"))]
