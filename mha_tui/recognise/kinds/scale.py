"""scale: the scores (or q, k before them) multiplied or divided by one number.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math

import numpy as np

from ...records import Check, OpRecord, Stage
from ..builder import BHTD, BHTT, yes
from ..graph import Graph, scalar_operand
from ..grouping import Unit
from ..maker import StageMaker
from ..sizes import Sizes

KIND = "scale"


def scale(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """Multiplying or dividing the scores (or q, k before them) by one number."""
    if op.name not in {"div", "mul", "div_", "mul_", "true_divide"} or len(g.x_inputs(op)) != 1:
        return None
    if scalar_operand(g, op) is None or g.op_derives(op, {"softmax", "attend"}):
        return None
    if g.op_derives(op, {"scores"}):
        return "scale"
    if g.op_derives(op, {"transpose", "view"}):  # q scaled before q @ k^T (torch's own MHA)
        return "scale"
    if g.op_derives(op, {"project", "rotary"}) and _head_scale(scalar_operand(g, op), op, sizes):
        return "scale"  # OPT, BART: q_proj(x) * d_h ** -0.5, before the heads are split
    return None


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
    rec = m.b.record(m.tensor_name(first, fallback="scores"), snap,
                        BHTT if values.ndim == 4 and values.shape[-1] == s.T
                        else m.dims(values.shape, BHTD),
                        values=values, caption=caption)
    groups = m.per_head_ops(unit)
    if m.b.per_head and len(groups) > 1:  # every head's input, not only the first's
        before_values = np.stack([m.snap(m.x_in(grp[0])).values for grp in groups],
                                 axis=m.b.head_axis)
    else:
        before_values = m.b.out_4d([before_ref.op], BHTT)[0] if before_ref.op is not None \
            else before.values
    checks = []
    raw_f = before_values[np.isfinite(before_values)].astype(np.float64)
    new_f = values[np.isfinite(values)].astype(np.float64)
    if raw_f.size > 1 and new_f.size > 1:
        checks.append(Check(f"spread (std) of the scores: {raw_f.std(ddof=1):.4f} raw -> "
                            f"{new_f.std(ddof=1):.4f} scaled" if not on_q else
                            f"spread (std) of {rec.name}: {raw_f.std(ddof=1):.4f} -> "
                            f"{new_f.std(ddof=1):.4f}", None))
    else:
        checks.append(Check("a single score: nothing to spread", None))
    if factor is not None:
        expected = 1 / sqrt
        used = 1 / factor if divides else factor
        checks.append(Check(f"the factor is 1/sqrt(d_h) = 1/sqrt({d_h}): "
                            f"{yes(abs(used - expected) < 1e-6)}", None))
    if on_q:
        note = ("Q is scaled before the scores are computed (q * 1/sqrt(d_h)): the scaling "
                "happens here, on the queries, not on the scores; same result.")
    elif raw == "masked scores":
        note = "This module masks before it scales: -inf divided by sqrt(d_h) stays -inf."
    else:
        note = ""
    return m.stage(unit, stage_id, "scale", [rec], checks, shape_in=before_values.shape,
                      shape_out=values.shape if m.b.per_head else snap.shape, dims_in=rec.dims,
                      dims_out=rec.dims, note=note)
