"""softcap: logit soft-capping (Gemma 2, Grok): the scores squashed into (-cap, cap) by
`cap * tanh(scores / cap)` before the mask and softmax, so that no score can grow without
bound.

Recognised from the ops and checked on the values, never from names: a `tanh` of the scores
divided (or multiplied) by one number, its result multiplied by the inverse of that number.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, scalar_operand
from ..ops.numeric import tolerance
from ..ops.sizes import Sizes
from ..records import Check, OpRecord, Stage
from ..stages import title_of
from ._parts.builder import BHTT
from ._parts.cell import Cell, Term, Why, WhyError, where
from ._parts.found import held
from ._parts.grown import Part
from ._parts.maker import StageMaker, score_dims
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "softcap"
EXPECTED = "softcap"  # check --expect softcap grows the reference by reference(j)
_INTO = {"div", "div_", "true_divide", "mul", "mul_"}
_OUT = {"mul", "mul_"}


@dataclass(frozen=True)
class Cap:
    into: OpRecord  # scores / cap (or scores * (1 / cap))
    tanh: OpRecord
    out: OpRecord  # tanh(...) * cap
    cap: float

    @property
    def ops(self) -> frozenset[int]:
        return frozenset({self.into.index, self.tanh.index, self.out.index})


def _factor(g: Graph, op: OpRecord) -> float | None:
    """What the op multiplies by (a division by c multiplies by 1 / c)."""
    value = scalar_operand(g, op)
    if value is None or value == 0:
        return None
    return 1.0 / value if op.name in ("div", "div_", "true_divide") else value


def cap_at(g: Graph, tanh: OpRecord) -> Cap | None:
    """The soft-capping around one tanh op, checked on the values; None if it is not one."""
    if tanh.name != "tanh" or not g.x_inputs(tanh):
        return None
    into = g.producer(g.x_inputs(tanh)[0])
    outs = [g.ops[i] for i in g.consumers[tanh.index]]
    if into is None or into.name not in _INTO or len(outs) != 1 or outs[0].name not in _OUT:
        return None
    out = outs[0]
    inward, outward = _factor(g, into), _factor(g, out)
    if inward is None or outward is None or \
            not np.isclose(inward * outward, 1.0, **tolerance(atol=1e-8, rtol=1e-5)):
        return None
    scores = g.snap(g.x_inputs(into)[0]).values.astype(np.float64)
    if scores.ndim < 2:
        return None
    expected = outward * np.tanh(scores * inward)
    if not np.allclose(expected, out.out.values, **tolerance(atol=1e-5, rtol=1e-4)):
        return None
    return Cap(into, tanh, out, abs(outward))


def caps(g: Graph) -> list[Cap]:
    return [cap for op in g.ops if op.name == "tanh" and g.from_x[op.index]
            for cap in [cap_at(g, op)] if cap is not None]


def squashes_the_scores(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """An op of cap * tanh(scores / cap), on the scores (after the product, before softmax)."""
    if op.name not in _INTO | {"tanh"} or not g.op_derives(op, {"scores"}) or \
            g.op_derives(op, {"softmax"}):
        return None
    tanh = op if op.name == "tanh" else None
    if tanh is None:
        later = [g.ops[i] for i in g.consumers[op.index]]
        earlier = [g.producer(r) for r in g.x_inputs(op)]
        tanh = next((o for o in [*later, *earlier] if o is not None and o.name == "tanh"), None)
    found = cap_at(g, tanh) if tanh is not None else None
    return KIND if found is not None and op.index in found.ops else None


RULES = (squashes_the_scores,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    found = held(caps(m.g), unit)
    assert found is not None  # the rule claimed its ops
    before_values, before = m.b.out_4d([m.x_in(found.into).op], BHTT)  # type: ignore[list-item]
    after_values, after = m.b.out_4d([found.out.index], BHTT)
    dims = score_dims(m, after_values)
    tensors = [m.b.record("scores before", before, dims, values=before_values,
                          caption="what the scores were"),
               m.b.record("scores after", after, dims, values=after_values,
                          caption=f"{found.cap:g} · tanh(scores / {found.cap:g})")]
    top = float(np.abs(after_values).max(initial=0.0))
    recomputed = found.cap * np.tanh(before_values.astype(np.float64) / found.cap)
    checks = [Check(f"every score within (−{found.cap:g}, {found.cap:g}): the largest |score| "
                    f"after is {top:.4f}", top < found.cap),
              Check(f"recomputed by mha-tui: {found.cap:g} · tanh(scores / {found.cap:g}) equals "
                    f"what the module made",
                    bool(np.allclose(recomputed, after_values, **tolerance(atol=1e-5, rtol=1e-4))))]
    explanation = (
        f"Logit soft-capping: each score s becomes {found.cap:g} · tanh(s / {found.cap:g}). "
        f"Small scores pass almost unchanged (tanh(u) ≈ u near 0); large ones are bent towards "
        f"±{found.cap:g} and can never pass it, so no single key can take all of a query's "
        f"weight just by growing. Gemma 2 caps its attention logits this way (cap 50).")
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=before.shape,
                   shape_out=after.shape, dims_in=dims, dims_out=dims, title=title_of(KIND),
                   explanation=explanation, extra_ops=sorted(found.ops))


def judge(j: Judge) -> list[Row]:
    """Each soft-capping stage, recomputed from its own input: cap · tanh(s / cap); with
    `--expect softcap`, the cap `--softcap` asked for, and soft-capping that is missing,
    after softmax or with two different numbers, each named at its line."""
    rows = []
    found = caps(j.classified())
    stages = [s for s in j.trace.stages if s.kind == KIND]
    if EXPECTED in j.facts.mechanisms:
        rows += _expected(j, found, stages)
    for stage in stages:
        cap = held(found, stage)
        if cap is None:
            rows.append(j.row(stage, KIND, None, None, "not judged: no tanh found again"))
            continue
        scores = j.g.snap(j.g.x_inputs(cap.into)[0]).values.astype(np.float64)
        got = cap.out.out.values.astype(np.float64)
        diff = float(np.abs(cap.cap * np.tanh(scores / cap.cap) - got).max()) if got.size else 0.0
        rows.append(j.row(stage, KIND, diff <= 1e-4 * max(1.0, cap.cap), diff,
                          f"scores soft-capped: {cap.cap:g} · tanh(scores / {cap.cap:g}) (not "
                          f"part of plain attention)", source=cap.tanh.source))
    return rows


def _words(cap: float) -> str:
    return f"logit soft-capping (cap {cap:g}: {cap:g} · tanh(scores / {cap:g}) before softmax)"


def reference(j: Judge) -> Part | None:
    """--expect softcap: the cap `--softcap` gave, else the module's own (from its
    soft-capping stage); None when neither is there (the judge says it is missing)."""
    g = j.classified()
    own = [cap for cap in caps(g) if g.kind.get(cap.tanh.index) == KIND]
    cap = j.facts.softcap if j.facts.softcap is not None else (own[0].cap if own else None)
    return Part(_words(cap), softcap=cap) if cap is not None else None


def _tanhs_of_scores(j: Judge) -> list[OpRecord]:
    g = j.classified()
    return [op for op in g.ops if op.name == "tanh" and g.from_x[op.index]
            and g.op_derives(op, {"scores", "scale", "sdpa"})]


def _expected(j: Judge, found: list[Cap], stages: list[Stage]) -> list[Row]:
    """Rows for --expect softcap: the cap the module uses against --softcap's; a tanh after
    softmax, or one whose divide and multiply are by different numbers; none at all."""
    g = j.classified()
    want = j.facts.softcap
    rows = []
    for stage in stages:
        cap = held(found, stage)
        if cap is not None and want is not None and \
                not np.isclose(cap.cap, want, **tolerance(atol=1e-8, rtol=1e-5)):
            rows.append(j.row(stage, KIND, False, abs(cap.cap - want),
                              f"scores soft-capped at --softcap {want:g}", source=cap.tanh.source,
                              diagnosis=("softcap_cap", f"soft-capping at {cap.cap:g} where "
                                         f"--softcap {want:g} was expected: {cap.cap:g} · "
                                         f"tanh(scores / {cap.cap:g}) (line {j.where(cap.tanh.source)[1]})"
                                         f" bounds the scores at ±{cap.cap:g}, not ±{want:g}")))
    if stages:
        return rows
    for tanh in _tanhs_of_scores(j):
        stage = j.stage_of.get(tanh.index)
        line = j.where(tanh.source)[1]
        cap = cap_at(g, tanh)
        if g.op_derives(tanh, {"softmax", "attend"}):
            what = f"{cap.cap:g} · tanh(· / {cap.cap:g})" if cap is not None else "tanh"
            return [j.row(stage, KIND, False, None, "the scores soft-capped before softmax",
                          source=tanh.source,
                          diagnosis=("softcap_after_softmax", f"soft-capping after softmax: "
                                     f"{what} at line {line} squashes the attention weights, not "
                                     f"the scores; --expect softcap caps the scores before the "
                                     f"mask and softmax (Gemma 2), so that each row of weights "
                                     f"still sums to 1"))]
        into = g.producer(g.x_inputs(tanh)[0]) if g.x_inputs(tanh) else None
        outs = [g.ops[i] for i in g.consumers[tanh.index]]
        inward = _factor(g, into) if into is not None and into.name in _INTO else 1.0
        outward = _factor(g, outs[0]) if len(outs) == 1 and outs[0].name in _OUT else 1.0
        if inward is not None and outward is not None and \
                not np.isclose(inward * outward, 1.0, **tolerance(atol=1e-8, rtol=1e-5)):
            return [j.row(stage, KIND, False, None, "the scores soft-capped: cap · tanh(scores "
                          "/ cap), one cap for both", source=tanh.source,
                          diagnosis=("softcap_cap", f"soft-capping with two caps: the scores "
                                     f"divided by {1 / inward:g} and the tanh multiplied by "
                                     f"{outward:g} at line {line}; cap · tanh(scores / cap) "
                                     f"divides and multiplies by the same cap"))]
    scores = next((s for s in j.trace.stages if s.kind in ("scores", "sdpa")), None)
    return [j.row(None, KIND, False, None, "the scores soft-capped before softmax",
                  source=scores.source if scores is not None else None,
                  position=j.position_after("scale"),
                  diagnosis=("mechanism_missing", "no soft-capping: --expect softcap wants each "
                             "score s to become cap · tanh(s / cap) before the mask and softmax "
                             "(Gemma 2: cap 50), and no tanh of the scores ran"))]


def why(cell: Cell) -> Why:
    """One capped score: cap · tanh(score / cap), from the score the stage received."""
    tensors = cell.stage.tensors
    if len(tensors) < 2:
        raise WhyError(f"stage {cell.stage.id} holds no scores to explain {cell.name} by")
    before = float(tensors[0].values[cell.index])
    after = float(tensors[1].values[cell.index])
    cap = _cap_of(cell.stage)
    inner = before / cap
    squashed = float(np.tanh(inner))
    computed = cap * squashed
    spot = ", ".join(map(str, cell.index))
    terms = (Term(f"scores before[{spot}] (recorded)", (), before),
             Term(f"divided by the cap {cap:g}", (before, "/", cap), inner),
             Term("tanh of it: within (-1, 1)", (), squashed),
             Term(f"times the cap {cap:g}", (squashed, "×", cap), computed))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {cap:g} · tanh(scores before[{spot}] / {cap:g})", terms,
               (f"soft-capping keeps every score within (-{cap:g}, {cap:g}); a small score "
                f"passes almost unchanged",), computed, after)


def _cap_of(stage: Stage) -> float:
    """The cap a stage's ops multiply by last (tanh(...) * cap)."""
    last = next(op for op in reversed(stage.ops) if op.name in _OUT)
    return abs(float(next(a for a in last.scalars() if isinstance(a, int | float))))


def mechanism(j: Judge, stage: Stage) -> str | None:
    """What `check` says when the module leaves plain attention here."""
    cap = held(caps(j.classified()), stage)
    if cap is None:
        return None
    return (f"logit soft-capping: the scores squashed into (−{cap.cap:g}, {cap.cap:g}) by "
            f"{cap.cap:g} · tanh(scores / {cap.cap:g}) before softmax (Gemma 2's "
            f"attn_logit_softcapping = {cap.cap:g}); plain multi-head attention does not cap them")
