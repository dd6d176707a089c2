"""sdpa: F.scaled_dot_product_attention, one fused op, shown as the five steps it computes.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ...judge.numeric import blocked_set, close, f64
from ...records import Check, OpRecord, Stage, TensorRecord
from ..builder import BHTD, BHTT
from ..graph import Graph
from ..grouping import Unit
from ..maker import StageMaker, synthetic, words
from ..sizes import Sizes
from ..vocab import softmax
from .scale import scale_diagnosis
from .softmax import softmax_checks

if TYPE_CHECKING:
    from ...judge.judging import Judge, Row


KIND = "sdpa"


def fused_attention(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """F.scaled_dot_product_attention: expanded later into its five steps."""
    return "sdpa" if op.name == "scaled_dot_product_attention" else None


RULES = (fused_attention,)

SDPA_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def shared_heads(op: OpRecord, q: np.ndarray, k: np.ndarray, v: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v as the fused op uses them: with enable_gqa=True, K and V's h_kv heads each
    repeated for h / h_kv query heads (PyTorch documents repeat_interleave on the head axis)."""
    if op.kwarg("enable_gqa") is True and q.ndim >= 3 and k.ndim == q.ndim and \
            k.shape[-3] != q.shape[-3] and k.shape[-3] and q.shape[-3] % k.shape[-3] == 0:
        n = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, n, axis=-3), np.repeat(v, n, axis=-3)
    return q, k, v


def build(m: StageMaker, unit: Unit, stage_id: str) -> list[Stage]:
    """Five stages (scores, scale, mask, softmax, attend) computed here from the fused op's
    inputs, the way PyTorch documents its reference; the stage_id is theirs, not sdpa's."""
    op = m.op(unit.ops[0])
    s = m.s
    q, k, v = shared_heads(op, *(m.snap(r).values.astype(np.float32) for r in op.inputs[:3]))
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
        spelled = m.spelled(attn_mask_ref, op)
        masked_by.append("attn_mask" if spelled == "attn_mask" else f"attn_mask={spelled}")
    masked = (scaled + bias).astype(np.float32)
    weights = softmax(masked)
    context = (weights @ v).astype(np.float32)
    fused = op.out.values
    diff = float(np.max(np.abs(context - fused))) if context.size else 0.0
    close = bool(np.allclose(context, fused, equal_nan=True, **SDPA_TOLERANCE))
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


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    """F.scaled_dot_product_attention, judged as a whole from its own q, k, v.

    The recogniser shows it expanded into scores, scale, mask, softmax and attend (its
    own computation); the module ran one fused op, so the op's output is compared with
    causal attention computed here from the op's inputs, and a mismatch is put on the
    step whose variant (another scale, no mask) reproduces the output.
    """
    rows: list[Row] = []
    done: set[int] = set()
    for stage in j.trace.stages:
        if not j.is_sdpa(stage):
            continue
        op = next(op for op in stage.ops if op.name == "scaled_dot_product_attention")
        if op.index in done:
            continue
        done.add(op.index)
        kinds = [s for s in j.trace.stages if op in s.ops]
        good, diff, diag = _judge_sdpa(j, op)
        wrong = "" if diag is None else "attend" if diag[0] in ("sdpa_wrong", "dropout_active") \
            else "scale" if "scale" in diag[0] else "mask"
        checked = {
            "scores": "Q_i @ K_i^T for every head, inside the fused op",
            "scale": f"scaled by 1/sqrt(d_h) = {1 / math.sqrt(j.d_h):.4f} inside the fused op",
            "mask": "blocks exactly the causal entries, inside the fused op",
            "softmax": "rows normalised over the keys, inside the fused op",
            "attend": "F.scaled_dot_product_attention = softmax(Q K^T / sqrt(d_h) + causal "
                      "mask) V, recomputed here from its q, k, v",
        }
        seen_kinds = set()
        for s in kinds:
            seen_kinds.add(s.kind)
            is_wrong = s.kind == wrong
            rows.append(j.row(s, s.kind, not is_wrong, diff if s.kind in (wrong, "attend") else None,
                                 checked.get(s.kind, "inside the fused op"), source=op.source,
                                 diagnosis=diag if is_wrong else None))
        if wrong and wrong not in seen_kinds:
            rows.append(j.row(None, wrong, False, diff, checked[wrong], source=op.source,
                                 diagnosis=diag,
                                 position=j.trace.stages.index(kinds[0]) + 0.5 if kinds else 0))
        j.differences.append("computes attention with F.scaled_dot_product_attention "
                                "(scores, scale, mask, softmax and attend in one fused op): "
                                "equivalent" if good else "")
    return rows


def _judge_sdpa(j: Judge, op: OpRecord) -> tuple[bool, float, tuple[str, str] | None]:
    q, k, v = shared_heads(op, *(f64(j.g.snap(r).values) for r in j.g.tensor_operands(op)[:3]))
    d = q.shape[-1]
    T = q.shape[-2]
    expected_mask = blocked_set(T, j.facts.causal, j.facts.window)

    def attention(factor: float, mask: np.ndarray) -> np.ndarray:
        scores = q @ np.swapaxes(k, -1, -2) * factor
        # a row with no key to attend to: torch's fused op gives 0 there (numpy: NaN)
        return np.nan_to_num(softmax(np.where(mask, -np.inf, scores)) @ v, nan=0.0)

    good, diff = close(op.out.values, attention(1 / math.sqrt(d), expected_mask))
    if good:
        return True, diff, None
    p = op.kwarg("dropout_p", 0.0)
    if isinstance(p, float) and p > 0:
        return False, diff, ("dropout_active",
                             f"dropout is active inside F.scaled_dot_product_attention "
                             f"(dropout_p={p}): {j.runs_differ()}; pass "
                             "dropout_p=self.dropout if self.training else 0.0")
    for factor in (1 / math.sqrt(j.C), 1.0, 1 / d, math.sqrt(d)):
        if close(op.out.values, attention(factor, expected_mask))[0]:
            return False, diff, scale_diagnosis(j, factor)
    if close(op.out.values, attention(1 / math.sqrt(d), np.zeros_like(expected_mask)))[0]:
        return False, diff, ("mask_missing", "F.scaled_dot_product_attention ran without the "
                                             "causal mask: the output equals unmasked attention "
                                             "(is_causal=True, or an attn_mask, is missing)")
    given = next((j.g.snap(r).values for r in op.inputs if j.g.snap(r).dtype == "bool"), None)
    if given is not None and given.shape[-2:] == (T, T) and \
            close(op.out.values, attention(1 / math.sqrt(d), ~given.astype(bool)))[0] and \
            np.array_equal(np.broadcast_to(given, (T, T)) if given.ndim == 2 else given.reshape(-1, T, T)[0],
                           expected_mask):
        return False, diff, ("mask_inverted",
                             "the boolean mask is inverted: True must mean attend. "
                             "F.scaled_dot_product_attention keeps the entries where attn_mask "
                             "is True; this mask is True where a token may not look (the "
                             "masked_fill convention), so each token attends only to the "
                             "tokens after it, and the last token to none (its output is 0); "
                             "pass ~mask, or is_causal=True")
    if close(op.out.values, attention(1 / math.sqrt(d), ~expected_mask))[0] or close(
            op.out.values, attention(1 / math.sqrt(d), np.tril(np.ones_like(expected_mask), -1)))[0]:
        return False, diff, ("mask_reversed", "F.scaled_dot_product_attention's mask is "
                                              "reversed: it blocks the earlier tokens")
    return False, diff, ("sdpa_wrong", "F.scaled_dot_product_attention's output is not causal "
                                       "attention with 1/sqrt(d_h) scaling of its q, k, v")

# ------------------------------------------------------------ ordering
