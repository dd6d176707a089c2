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

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, scalar_operand
from ..ops.sizes import Sizes
from ..records import Check, OpRecord, Stage
from ..stages import title_of
from ._parts.cell import Cell, Term, Why, where
from ._parts.found import held
from ._parts.grown import Differential, Part
from ._parts.hand_norm import BY_HAND, hand_norms
from ._parts.judging import judged_x
from ._parts.maker import StageMaker
from ._parts.op_cell import explain, locate
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "differential"
EXPECTED = "differential"  # check --expect differential grows the reference by reference(j)
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
                   title=title_of(KIND), explanation=explanation)


def _expected(j: Judge) -> list[Row]:
    """Rows for --expect differential and no difference of two maps found: the second map
    added instead of subtracted, or no second map at all."""
    g = j.classified()
    for op in g.ops:
        if op.name not in ("add", "add_") or len(g.x_inputs(op)) != 2 or \
                not all(g.derives(r, {"softmax"}) for r in g.x_inputs(op)):
            continue
        times = [g.producer(r) for r in g.x_inputs(op)]
        if any(t is not None and _lambda(g, t) is not None for t in times):
            line = j.where(op.source)[1]
            return [j.row(j.stage_of.get(op.index), KIND, False, None,
                          "first map − λ · second map", source=op.source,
                          diagnosis=("differential_sign", f"differential attention adds the "
                                     f"second map, times λ, to the first at line {line}: "
                                     f"--expect differential subtracts it, so that attention "
                                     f"both maps give to the same tokens cancels"))]
    scores = next((s for s in j.trace.stages if s.kind in ("softmax", "sdpa")), None)
    return [j.row(None, KIND, False, None, "two softmax maps per head, the second times λ "
                  "subtracted from the first", source=scores.source if scores else None,
                  position=j.position_after("softmax"),
                  diagnosis=("mechanism_missing", "no differential attention: --expect "
                             "differential wants two softmax maps per head, the second times a "
                             "learned λ subtracted from the first, and no such difference ran"))]


def judge(j: Judge) -> list[Row]:
    """Each differential stage: the difference recomputed from its two maps and λ; with
    --expect differential and none, what is there instead."""
    rows = []
    found = differences(j.classified())
    if EXPECTED in j.facts.mechanisms and not any(s.kind == KIND for s in j.trace.stages):
        rows += _expected(j)
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


def why(cell: Cell) -> Why:
    """A number of the difference: first map − λ × second map, from the two maps the
    subtraction received (recorded) and λ; after it (the per-head norm, × (1 − λ_init)), the
    op that made the number, recomputed from its recorded inputs."""
    op, out, at = locate(cell, cell.stage.ops)
    normed = _through_norm(cell, op, at)
    if normed is not None:
        return normed
    if op.name not in _SUBS or len(op.inputs) != 2:
        made = explain(cell, op, out, at)
        return replace(made, kind=KIND, notes=(
            *made.notes, "after the difference of the two maps: each head's output "
                         "normalised (an RMSNorm over its channels) and times (1 − λ_init)"))
    first = float(np.broadcast_to(cell.operand(op, 0), op.out.shape)[at])
    times = next((o for o in cell.stage.ops if o.name in _TIMES), None)
    second = float(np.broadcast_to(cell.operand(times, 0), times.out.shape)[at]) \
        if times is not None and times.out.shape == op.out.shape else None
    weighted = float(np.broadcast_to(cell.operand(op, 1), op.out.shape)[at])
    if second is None or not second:
        lam = None
    else:
        lam = weighted / second
    computed = first - weighted
    terms = [Term("the first map (softmax 1, recorded)", (), first)]
    if lam is not None:
        terms.append(Term(f"λ × the second map (softmax 2), λ = {lam:.6g}", (lam, "×", second),
                          weighted))
    else:
        terms.append(Term("λ × the second map (recorded)", (), weighted))
    terms.append(Term("first − λ × second", (first, "-", weighted), computed))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = first[...] − λ · second[...]", tuple(terms),
               ("differential attention: attention both maps give to the same tokens cancels; "
                "the difference may be negative",), computed, cell.recorded)


def _through_norm(cell: Cell, op: OpRecord, at: tuple[int, ...]) -> Why | None:
    """(1 − λ_init) × RMSNorm(the head's output row)[c] × weight[c], from the row the norm
    received (recorded): when op is the multiply by (1 − λ_init) of a norm written out."""
    rec = cell.trace.recording
    if rec is None or op.name not in _TIMES or not op.inputs:
        return None
    g = Graph(rec, x_names=judged_x(rec))
    ref = g.x_inputs(op)[0] if g.x_inputs(op) else None
    norm = next((n for n in hand_norms(g) if ref is not None and n.after.op == ref.op), None)
    factor = _lambda(g, op)
    if norm is None or factor is None or g.snap(norm.before).shape != op.out.values.shape:
        return None
    *lead, c = at
    row = g.snap(norm.before).values[tuple(lead)].astype(np.float64)
    square = float((row ** 2).mean()) if norm.rms else float(((row - row.mean()) ** 2).mean())
    root = float(np.sqrt(square + norm.eps))
    centred = float(row[c]) - (0.0 if norm.rms else float(row.mean()))
    gamma = float(norm.weight[c])
    normed = centred / root * gamma + (float(norm.bias[c]) if norm.bias is not None else 0.0)
    computed = factor * normed
    terms = (Term(f"the head's output row: its {row.size} numbers' mean square", (), square),
             Term(f"√(mean square + eps), eps = {norm.eps:g}", (), root),
             Term(f"number {c} / √(...) × gamma[{c}]", (centred, "/", root, "×", gamma), normed),
             Term("× (1 − λ_init)", (normed, "×", factor), computed))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = (1 − λ_init) · {norm.name}(the head's output row)[{c}]", terms,
               ("the row: the difference of the two maps times V, as the norm received it "
                "(recorded); gamma: the norm's own weight",
                "differential attention normalises each head's output (subln) and scales it by "
                "(1 − λ_init)"), computed, cell.recorded)


def reference(j: Judge) -> Part | None:
    """--expect differential: the module's own λ, its per-head norm's weight and eps, and its
    (1 − λ_init); which heads are paired is tried both ways by the judge (unilm's adjacent
    heads, DiffLlama's halves)."""
    g = j.classified()
    found = differences(g)
    stage = next((s for s in j.trace.stages if s.kind == KIND), None)
    if not found or stage is None:
        return None
    indices = {op.index for op in stage.ops}
    after = [op for op in stage.ops if op.name in _TIMES and op.index not in found[0].ops
             and _lambda(g, op) is not None and g.op_derives(op, {"attend"})]
    if not after:
        return None
    factor = _lambda(g, after[-1])
    assert factor is not None
    norm = next((n for n in hand_norms(g) if n.ops & indices), None)
    fitted = (norm.weight, norm.eps) if norm is not None else _rms_fit(
        g.snap(g.x_inputs(after[-1])[0]).values, found[0].sub.out.values)
    if fitted is None:
        return None
    lam = found[0].lam
    return Part(f"differential attention (two softmax maps per head, the second times λ = "
                f"{lam:.4g} subtracted, a per-head RMSNorm and × (1 − λ_init) = "
                f"{factor:.4g})",
                differential=Differential(lam, factor, fitted[0], fitted[1]))


def _rms_fit(normed: np.ndarray, difference: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The weight and eps of an RMSNorm that makes `normed` from `difference` (an RMSNorm
    module mha-tui did not find written out: DiffLlama's groupnorm), or None."""
    if difference.shape != normed.shape:
        return None
    x = difference.astype(np.float64)
    y = normed.astype(np.float64)
    for eps in (1e-6, 1e-5, 1e-8):
        n = x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)
        flat_n, flat_y = n.reshape(-1, n.shape[-1]), y.reshape(-1, y.shape[-1])
        denominator = (flat_n * flat_n).sum(axis=0)
        if (denominator <= 1e-12).any():
            return None
        weight = (flat_n * flat_y).sum(axis=0) / denominator
        if np.allclose(n * weight, y, atol=1e-5, rtol=1e-4):
            return weight, eps
    return None
