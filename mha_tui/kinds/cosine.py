"""cosine: cosine (normalised q-k) attention (open_clip's `scaled_cosine`, Swin v2): q and k
each scaled to unit length (`F.normalize(q, dim=-1)`), so that q_i · k_j is the cosine of
their angle, in [-1, 1]; the scores then times a learned per-head scale (`exp(logit_scale)`,
clamped) instead of 1/sqrt(d_h).

Recognised from the ops and checked on the values, never from names: an L2 normalize of a
projection's tensor over its channels on the way to the scores, and a multiply of the
scores made from such tensors.

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
from ._parts.builder import BHTD, BHTT
from ._parts.cell import Cell, Term, Why, WhyError, dot, where
from ._parts.grown import Part
from ._parts.maker import StageMaker
from ._parts.op_cell import explain, locate
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "cosine"
EXPECTED = "cosine"  # check --expect cosine grows the reference by reference(j)
_NORMALIZE = {"normalize"}
_TIMES = {"mul", "mul_"}


def _last_channels(op: OpRecord) -> bool:
    """F.normalize(t, p=2, dim=-1): the L2 length over each row's channels."""
    p = op.kwarg("p", next((a for a in op.args[1:2] if isinstance(a, int | float)), 2.0))
    dim = op.kwarg("dim", next((a for a in op.args[2:3] if isinstance(a, int)), 1))
    return p == 2 and dim in (-1, op.out.values.ndim - 1)


def normalises_q_or_k(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """F.normalize(q, dim=-1) of a projection's tensor, before any scores: q or k scaled to
    unit length over its channels."""
    if op.name not in _NORMALIZE or not _last_channels(op) or not g.x_inputs(op):
        return None
    if not g.op_derives(op, {"project", "qkv_split"}) or g.op_derives(op, {"scores", "softmax"}):
        return None
    return KIND


def scales_the_cosines(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """The scores made from unit-length q and k, times a learned scale (a tensor not made
    from x, or a number), before softmax."""
    if op.name not in _TIMES or len(g.x_inputs(op)) != 1 or g.op_derives(op, {"softmax"}):
        return None
    if not g.op_derives(op, {"scores"}) or not g.op_derives(op, {KIND}):
        return None
    return KIND if g.other_inputs(op) or scalar_operand(g, op) is not None else None


RULES = (normalises_q_or_k, scales_the_cosines)


@dataclass(frozen=True)
class Cosine:
    normalized: tuple[OpRecord, ...]  # F.normalize of q, then of k
    scaled: OpRecord | None  # the scores times the learned scale

    @property
    def ops(self) -> frozenset[int]:
        return frozenset({*(op.index for op in self.normalized),
                          *([self.scaled.index] if self.scaled else [])})


def found(g: Graph, ops: set[int]) -> Cosine:
    """The cosine ops among a stage's (or a unit's) ops."""
    mine = [g.ops[i] for i in sorted(ops) if g.kind.get(i) == KIND]
    return Cosine(tuple(op for op in mine if op.name in _NORMALIZE),
                  next((op for op in mine if op.name in _TIMES), None))


def _unit_rows(g: Graph, op: OpRecord) -> bool:
    """The normalize's output: every row of length 1, pointing where its input's did."""
    before = g.snap(g.x_inputs(op)[0]).values.astype(np.float64)
    after = op.out.values.astype(np.float64)
    lengths = np.linalg.norm(before, axis=-1, keepdims=True)
    expected = before / np.maximum(lengths, 1e-12)
    return after.shape == expected.shape and bool(np.allclose(after, expected, atol=1e-5))


def _scale_of(g: Graph, op: OpRecord) -> np.ndarray:
    """The learned scale the cosines are multiplied by, as recorded (per head, or one)."""
    number = scalar_operand(g, op)
    if number is not None:
        return np.asarray([number])
    return g.snap(g.other_inputs(op)[0]).values.astype(np.float64).reshape(-1)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    cos = found(m.g, set(unit.ops))
    tensors = []
    for op, role in zip(cos.normalized, ("q̂ = q / |q|", "k̂ = k / |k|"), strict=False):
        values, snap = m.b.out_4d([op.index], BHTD)
        tensors.append(m.b.record(role, snap, BHTD if values.ndim == 4 else None, values=values,
                                  caption="each row scaled to length 1"))
    checks = [Check(f"every row of {len(cos.normalized)} normalised tensor"
                    f"{'s' if len(cos.normalized) != 1 else ''} has length 1 and its input's "
                    "direction (recomputed by mha-tui)",
                    all(_unit_rows(m.g, op) for op in cos.normalized))]
    if cos.scaled is not None:
        scale = _scale_of(m.g, cos.scaled)
        values, snap = m.b.out_4d([cos.scaled.index], BHTT)
        tensors.append(m.b.record("scaled cosines", snap, BHTT if values.ndim == 4 else None,
                                  values=values, caption="the cosines times the learned scale"))
        cosines = m.snap(m.g.x_inputs(cos.scaled)[0]).values.astype(np.float64)
        finite = cosines[np.isfinite(cosines)]
        checks.append(Check(f"the scores before the scale are cosines, within [−1, 1] (largest "
                            f"|score| {np.abs(finite).max(initial=0.0):.4f}); the scale is "
                            f"{', '.join(f'{s:.4g}' for s in scale[:4])}"
                            f"{', ...' if scale.size > 4 else ''} (1/sqrt(d_h) would be "
                            f"{1 / np.sqrt(m.s.d_h):.4g})",
                            bool((np.abs(finite) <= 1 + 1e-5).all())))
    explanation = (
        "Cosine attention: q and k are each divided by their length, so q̂_i · k̂_j is the "
        "cosine of the angle between them, between −1 and 1 whatever the tokens' sizes. "
        "Cosines are too close together for a sharp softmax, so the scores are then multiplied "
        "by a learned scale per head (open_clip's and Swin v2's exp(logit_scale), clamped at "
        "100) in place of 1/sqrt(d_h).")
    first = cos.normalized[0] if cos.normalized else m.op(unit.ops[0])
    src = m.snap(m.x_in(first))
    last = cos.scaled or first
    return m.stage(unit, stage_id, KIND, tensors[-3:], checks, shape_in=src.shape,
                   shape_out=last.out.shape, dims_in=m.dims(src.shape, BHTD),
                   dims_out=tensors[-1].dims, title=title_of(KIND), explanation=explanation)


def _scales(j: Judge) -> np.ndarray | None:
    """The learned scale the module multiplies the cosines by, per head (or one)."""
    g = j.classified()
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        cos = found(g, {op.index for op in stage.ops})
        if cos.scaled is not None:
            scale = _scale_of(j.g, cos.scaled)
            return scale if scale.size in (1, j.h) else None
    return None


def reference(j: Judge) -> Part | None:
    """--expect cosine: unit-length q and k, the cosines times the module's own learned
    scale per head."""
    scale = _scales(j)
    if scale is None:
        return None
    shown = ", ".join(f"{s:.4g}" for s in scale[:4]) + (", ..." if scale.size > 4 else "")
    return Part(f"cosine attention (q and k at unit length, the cosines times the learned "
                f"scale {shown})", cosine=scale)


def _axis_words(j: Judge, op: OpRecord) -> str:
    """Which axis a normalize ran over, in the words of its input's layout."""
    dim = op.kwarg("dim", next((a for a in op.args[2:3] if isinstance(a, int)), 1))
    shape = op.out.values.shape
    if not isinstance(dim, int) or not shape:
        return "another axis"
    size = shape[dim % len(shape)]
    label = "the heads" if size == j.h and len(shape) == 4 and dim % 4 == 1 else \
        "the tokens" if size == j.T_q else f"axis {dim}"
    return f"axis {dim} ({label}, {size} numbers)" if not label.startswith("axis") else label


def _expected(j: Judge) -> list[Row]:
    """Rows for --expect cosine: a normalize over the wrong axis; no learned scale; none."""
    g = j.classified()
    stages = [s for s in j.trace.stages if s.kind == KIND]
    wrong = [op for op in g.ops if op.name in _NORMALIZE and g.from_x[op.index]
             and not _last_channels(op) and not g.op_derives(op, {"scores", "softmax"})]
    if wrong:
        op = wrong[0]
        line = j.where(op.source)[1]
        return [j.row(j.stage_of.get(op.index), KIND, False, None,
                      "q and k normalised to unit length over each head's d_h channels",
                      source=op.source,
                      diagnosis=("cosine_axis", f"cosine attention normalised over the wrong "
                                 f"axis: F.normalize at line {line} makes unit vectors along "
                                 f"{_axis_words(j, op)}, not along each head's {j.d_h} channels "
                                 f"(dim=-1); F.normalize's default is dim=1"))]
    if stages and _scales(j) is None:
        stage = stages[-1]
        return [j.row(stage, KIND, False, None, "the cosines times a learned scale per head",
                      diagnosis=("mechanism_missing", "cosine attention without its learned "
                                 "scale: the cosines lie in [−1, 1], too close together for a "
                                 "sharp softmax; open_clip multiplies them by "
                                 "exp(logit_scale) per head, clamped at 100"))]
    if stages:
        return []
    scores = next((s for s in j.trace.stages if s.kind in ("scores", "sdpa")), None)
    return [j.row(None, KIND, False, None, "q and k normalised to unit length",
                  source=scores.source if scores is not None else None,
                  position=j.position_before("scores"),
                  diagnosis=("mechanism_missing", "no cosine attention: --expect cosine wants q "
                             "and k each normalised to unit length (F.normalize(q, dim=-1)) "
                             "and the cosines times a learned scale, and neither was"))]


def judge(j: Judge) -> list[Row]:
    """Each cosine stage: q and k at unit length, recomputed from their inputs."""
    rows = _expected(j) if EXPECTED in j.facts.mechanisms else []
    g = j.classified()
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        cos = found(g, {op.index for op in stage.ops})
        ok = bool(cos.normalized) and all(_unit_rows(j.g, op) for op in cos.normalized)
        rows.append(j.row(stage, KIND, ok, None, "q and k normalised to unit length, the "
                          "scores times a learned scale (cosine attention: not part of plain "
                          "attention)", source=cos.normalized[0].source if cos.normalized
                          else None))
    return rows


def mechanism(j: Judge, stage: Stage) -> str | None:
    """What `check` says when the module leaves plain attention here."""
    cos = found(j.classified(), {op.index for op in stage.ops})
    if not cos.normalized:
        return None
    scale = ""
    if cos.scaled is not None:
        values = _scale_of(j.g, cos.scaled)
        scale = (f", then times a learned scale per head ({', '.join(f'{s:.4g}' for s in values[:4])}"
                 f"{', ...' if values.size > 4 else ''}) instead of 1/sqrt(d_h)")
    return (f"cosine attention: q and k normalised to unit length (F.normalize), so the scores "
            f"are cosines in [−1, 1]{scale} (open_clip's scaled_cosine, Swin v2); plain "
            f"multi-head attention takes the raw dot product")



def why(cell: Cell) -> Why:
    """A scaled cosine: q̂_i · k̂_j (the unit-length rows the stage shows, d_h products and
    their sum), times the head's learned scale (the multiply's recorded operand); a unit-
    length number: q[c] divided by the length of its row."""
    op, out, at = locate(cell, cell.stage.ops)
    if op.name in _NORMALIZE:
        return _unit(cell, op, at)
    if op.name not in _TIMES or len(cell.stage.tensors) < 3:
        return replace(explain(cell, op, out, at), kind=KIND)
    operands = [np.broadcast_to(cell.operand(op, k), op.out.shape) for k in range(len(op.inputs))]
    if len(operands) == 2:
        cosines, scales = sorted(operands, key=lambda a: -np.ptp(a))
        scale = float(scales[at])
    else:  # a number: times it
        cosines, scale = operands[0], cell.scalar(op)
    cosine = float(cosines[at])
    q_hat, k_hat = (t.values for t in cell.stage.tensors[:2])
    *lead, i, j = cell.index
    if q_hat.ndim != len(cell.index) or q_hat.shape[:-2] != tuple(cell.record.values.shape[:-2]):
        raise WhyError(f"cannot pair {cell.name} with rows of q̂ and k̂")
    row, col = q_hat[(*lead, i)], k_hat[(*lead, j)]
    terms, notes, total = dot(cell, row, col, [f"d{c}: q̂[{i}, {c}] × k̂[{j}, {c}]"
                                               for c in range(len(row))], "products")
    computed = total * scale
    spot = ", ".join(map(str, lead))
    terms = (*terms[:-1], Term("q̂_i · k̂_j: the cosine of their angle, in [−1, 1]", (), total),
             Term("× the head's learned scale", (total, "×", scale), computed))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = (q̂[{spot}, {i}, :] · k̂[{spot}, {j}, :]) × scale", terms,
               (*notes, f"the cosine the module multiplied is {cosine:.6g}; q̂ and k̂: q and "
                "k each divided by its length (F.normalize)",
                "the scale: exp(logit_scale) clamped, per head (open_clip), instead of "
                "1/sqrt(d_h)"), computed, cell.recorded)


def _unit(cell: Cell, op: OpRecord, at: tuple[int, ...]) -> Why:
    """q̂[c] = q[c] / max(|q row|, eps): F.normalize's arithmetic from its recorded input."""
    before = cell.operand(op, 0).astype(np.float64)
    *lead, c = at
    row = before[tuple(lead)]
    length = float(np.sqrt((row ** 2).sum()))
    eps = float(op.kwarg("eps", 1e-12))  # type: ignore[arg-type]
    computed = float(row[c]) / max(length, eps)
    terms = (Term(f"the row's {row.size} numbers squared and summed", (), length ** 2),
             Term("its length: the square root", (), length),
             Term(f"number {c} / the length", (float(row[c]), "/", length), computed))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = q[{c}] / |q|  (F.normalize: the row at unit length)", terms,
               ("the row: what F.normalize received (recorded)",), computed, cell.recorded)
