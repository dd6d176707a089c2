"""differential: differential attention (Diff Transformer, microsoft/unilm; Hugging Face's
DiffLlama): each head takes two softmax maps (from two halves of its queries and keys) and
subtracts the second, times a learned λ, from the first, so that attention both maps give
to irrelevant tokens cancels; the difference (or its product with V) is then normalised per
head (an RMSNorm) and scaled by (1 − λ_init).

Recognised from the ops and checked on the values, never from names: a subtraction of two
tensors that both come from softmax, one of them multiplied by a number not made from x;
then a norm and a multiply by a number of what the subtraction made, before W_O.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, scalar_operand
from ..ops.sizes import Sizes
from ..records import Check, OpRecord, Stage
from ._parts.found import held
from ._parts.hand_norm import BY_HAND, hand_norms
from ._parts.maker import StageMaker
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "differential"
TITLE = "Differential attention: the second softmax map, times λ, subtracted from the first"
_SUBS = {"sub", "sub_"}
_TIMES = {"mul", "mul_"}
_NORMS = {"rms_norm", "layer_norm"}


@dataclass(frozen=True)
class Difference:
    sub: OpRecord  # first − λ · second
    times: OpRecord  # λ · second
    lam: float

    @property
    def ops(self) -> frozenset[int]:
        return frozenset({self.sub.index, self.times.index})


def _lambda(g: Graph, op: OpRecord) -> float | None:
    """The one number (a Python number or a one-element tensor not made from x) op multiplies
    its x-derived input by."""
    if op.name not in _TIMES or len(g.x_inputs(op)) != 1:
        return None
    number = scalar_operand(g, op)
    if number is not None:
        return number
    others = [g.snap(r).values for r in g.other_inputs(op)]
    return float(others[0].reshape(-1)[0]) if len(others) == 1 and others[0].size == 1 else None


def difference_at(g: Graph, sub: OpRecord) -> Difference | None:
    """first − λ · second, both from softmax, checked on the values."""
    if sub.name not in _SUBS or len(g.x_inputs(sub)) != 2:
        return None
    first, second = g.x_inputs(sub)
    times = g.producer(second)
    lam = _lambda(g, times) if times is not None else None
    if times is None or lam is None or not g.derives(first, {"softmax"}) or \
            not g.op_derives(times, {"softmax"}):
        return None
    made = g.snap(first).values.astype(np.float64) - lam * g.snap(
        g.x_inputs(times)[0]).values.astype(np.float64)
    if made.shape != sub.out.values.shape or not np.allclose(made, sub.out.values, atol=1e-5):
        return None
    return Difference(sub, times, lam)


def differences(g: Graph) -> list[Difference]:
    return [d for op in g.ops if op.name in _SUBS and g.from_x[op.index]
            for d in [difference_at(g, op)] if d is not None]


def subtracts_two_maps(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """The λ multiply and the subtraction of two softmax maps (or of their products with V)."""
    if op.name not in _SUBS | _TIMES or not g.op_derives(op, {"softmax"}):
        return None
    if op.name in _SUBS:
        return KIND if difference_at(g, op) is not None else None
    subs = [g.ops[c] for c in g.consumers[op.index] if g.ops[c].name in _SUBS]
    return KIND if any((d := difference_at(g, s)) is not None and d.times is op
                       for s in subs) else None


def normalises_the_difference(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """After the difference, before W_O: its per-head norm (Diff Transformer's subln, DiffLlama's
    groupnorm; written out or a call) and the multiply by (1 − λ_init)."""
    if not g.op_derives(op, {KIND}) or g.op_derives(op, {"w_o"}):
        return None
    if op.name in _NORMS:
        return KIND
    if op.name in _TIMES and _lambda(g, op) is not None:
        return KIND
    if op.name in BY_HAND and any(op.index in norm.ops for norm in hand_norms(g)):
        return KIND
    return None


RULES = (subtracts_two_maps, normalises_the_difference)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    found = held(differences(m.g), unit)
    assert found is not None  # the rule claimed its ops
    first_ref = m.g.x_inputs(found.sub)[0]
    first, second = m.snap(first_ref), m.snap(m.g.x_inputs(found.times)[0])
    last = m.op(max(unit.ops))
    tensors = [m.b.record("first map", first, m.dims(first.shape), caption="from softmax 1"),
               m.b.record("second map", second, m.dims(second.shape), caption="from softmax 2"),
               m.b.record("first − λ · second", found.sub.out, m.dims(found.sub.out.shape),
                          caption=f"λ = {found.lam:.4g}")]
    if last.index != found.sub.index:
        tensors.append(m.b.record("normalised, scaled", last.out, m.dims(last.out.shape),
                                  caption="per-head norm, then × (1 − λ_init)"))
    recomputed = first.values.astype(np.float64) - found.lam * second.values.astype(np.float64)
    checks = [Check(f"first − {found.lam:.4g} × second, recomputed by mha-tui, equals what the "
                    "module made", bool(np.allclose(recomputed, found.sub.out.values, atol=1e-5)))]
    explanation = (
        "Differential attention (Diff Transformer): every head computes two softmax maps from "
        "two halves of its queries and keys, and subtracts the second, times a learned λ "
        f"(here {found.lam:.4g}), from the first. Attention that both maps give to the same "
        "irrelevant tokens cancels, like noise in a differential amplifier; a row of the "
        "difference no longer sums to 1 and may be negative. The result is normalised per "
        "head and scaled by (1 − λ_init).")
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=first.shape,
                   shape_out=last.out.shape, dims_in=tensors[0].dims, dims_out=tensors[-1].dims,
                   title=TITLE, explanation=explanation)


def judge(j: Judge) -> list[Row]:
    """Each differential stage: the difference recomputed from its two maps and λ."""
    rows = []
    found = differences(j.classified())
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        d = held(found, stage)
        rows.append(j.row(stage, KIND, True if d is not None else None, None,
                          f"first map − λ · second map, λ = {d.lam:.4g} (differential attention: "
                          "not part of plain attention)" if d is not None else
                          "not judged: no difference of two softmax maps found again",
                          source=d.sub.source if d is not None else None))
    return rows


def mechanism(j: Judge, stage: Stage) -> str | None:
    """What `check` says when the module leaves plain attention here."""
    d = held(differences(j.classified()), stage)
    if d is None:
        return None
    return (f"differential attention: two softmax maps per head, the second times a learned "
            f"λ = {d.lam:.4g} subtracted from the first, then a per-head norm and × (1 − λ_init) "
            f"(Diff Transformer, DiffLlama); plain multi-head attention has one softmax map per "
            f"head, and its head and value bookkeeping follows from that")
