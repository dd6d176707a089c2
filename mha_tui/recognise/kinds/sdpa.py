"""sdpa: F.scaled_dot_product_attention, one fused op, shown as the five steps it computes.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math

import numpy as np

from ...records import Check, OpRecord, Stage, TensorRecord
from ..builder import BHTD, BHTT
from ..graph import Graph
from ..grouping import Unit
from ..maker import StageMaker, synthetic, words
from ..sizes import Sizes
from ..vocab import softmax
from .softmax import softmax_checks

KIND = "sdpa"


def fused_attention(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """F.scaled_dot_product_attention: expanded later into its five steps."""
    return "sdpa" if op.name == "scaled_dot_product_attention" else None


RULES = (fused_attention,)

SDPA_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def build(m: StageMaker, unit: Unit, stage_id: str) -> list[Stage]:
    """Five stages (scores, scale, mask, softmax, attend) computed here from the fused op's
    inputs, the way PyTorch documents its reference; the stage_id is theirs, not sdpa's."""
    op = m.op(unit.ops[0])
    s = m.s
    q, k, v = (m.snap(r).values.astype(np.float32) for r in op.inputs[:3])
    attn_mask_ref = None
    for position, arg in enumerate(op.args):
        if position == 3 and hasattr(arg, "index"):
            attn_mask_ref = op.inputs[arg.index]  # type: ignore[attr-defined]
    kw_mask = op.kwarg("attn_mask")
    if hasattr(kw_mask, "index"):
        attn_mask_ref = op.inputs[kw_mask.index]  # type: ignore[attr-defined]
    is_causal = bool(op.kwarg("is_causal", op.args[5] if len(op.args) > 5 else False))
    factor = op.kwarg("scale")
    d = q.shape[-1]
    factor = float(factor) if isinstance(factor, int | float) else 1 / math.sqrt(d)
    L, S = q.shape[-2], k.shape[-2]
    raw = (q @ np.swapaxes(k, -2, -1)).astype(np.float32)
    scaled = (raw * np.float32(factor)).astype(np.float32)
    bias = np.zeros((L, S), dtype=np.float32)
    masked_by = []
    if is_causal:
        bias = np.where(np.tril(np.ones((L, S), dtype=bool)), bias, -np.inf).astype(np.float32)
        masked_by.append("is_causal=True")
    if attn_mask_ref is not None:
        given = m.snap(attn_mask_ref).values
        if given.dtype == bool:
            bias = np.where(given, bias, -np.inf).astype(np.float32)
        else:
            bias = (given + bias).astype(np.float32)
        masked_by.append(f"attn_mask={m.expr(attn_mask_ref)}")
    masked = (scaled + bias).astype(np.float32)
    weights = softmax(masked)
    context = (weights @ v).astype(np.float32)
    fused = op.out.values
    diff = float(np.max(np.abs(context - fused))) if context.size else 0.0
    close = bool(np.allclose(context, fused, **SDPA_TOLERANCE))
    label = ("Computed by mha-tui from the inputs of F.scaled_dot_product_attention, the way "
             "PyTorch documents its reference implementation; the module itself ran the fused op.")
    stages = []
    code, source = m.code([*unit.ops, *unit.helpers])
    ops = tuple(m.op(i) for i in sorted({*unit.ops, *unit.helpers}))

    def make(kind: str, name: str, values: np.ndarray, checks: list[Check], caption: str,
             value_kind: str = "signed", extra: tuple[TensorRecord, ...] = ()) -> Stage:
        title, explanation = words(kind)
        rec = m.b.record(name, synthetic(values), m.dims(values.shape, BHTT, BHTD),
                            kind=value_kind, caption=caption)  # type: ignore[arg-type]
        return Stage(id=kind, title=title + " (mha-tui's expansion)", code=code,
                     explanation=explanation, shape_in=q.shape, shape_out=values.shape,
                     dims_in=m.dims(q.shape, BHTD), dims_out=rec.dims,
                     tensors=(*extra, rec), checks=tuple(checks), note=label, kind=kind,
                     source=source, ops=ops)

    stages.append(make("scores", "q @ k.transpose(-2, -1)", raw,
                       [Check(f"computed here: {s.h} heads' q_i @ k_i^T", None)],
                       "row: query token · column: key token"))
    stages.append(make("scale", "scores * scale", scaled,
                       [Check(f"scale = {f'1/sqrt({d})' if op.kwarg('scale') is None else 'scale='}"
                              f" = {factor:.4f}", None)],
                       f"raw scores * {factor:.4f} = raw scores / sqrt({d})"))
    if masked_by:
        n = int(np.isneginf(np.broadcast_to(bias, masked.shape)).sum())
        stages.append(make("mask", "scores + attn_bias", masked,
                           [Check(f"{n} entries blocked by {' and '.join(masked_by)} are -inf", None)],
                           "attn_bias: 0 where a token may look, -inf where it may not"))
    stages.append(make("softmax", "attn_weight", weights, softmax_checks(weights, masked),
                       "row: query token · column: key token it takes from", "prob"))
    fused_rec = m.b.record(m.tensor_name(op, fallback="y") + " (fused, from the module)",
                              op.out, m.dims(op.out.shape, BHTD),
                              caption="what F.scaled_dot_product_attention returned")
    stages.append(make("attend", "attn_weight @ v", context,
                       [Check(f"the expansion equals the fused output: allclose(rtol="
                              f"{SDPA_TOLERANCE['rtol']:g}, atol={SDPA_TOLERANCE['atol']:g}) = "
                              f"{close} (largest difference {diff:.2e})", close)],
                       "row t: token t's weighted mix of values", extra=(fused_rec,)))
    m.out_of_kind["attend"] = (fused, op.out)
    return stages
