"""sdpa: F.scaled_dot_product_attention, one fused op, shown as the five steps it computes.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import blocked, blocked_set, close, f64
from ..ops.sizes import Sizes
from ..ops.vocab import softmax
from ..records import Check, OpRecord, Ref, Stage, TensorArg, TensorRecord
from ._parts.builder import BHTD, BHTT
from ._parts.cell import Cell, Term, Why, WhyError, Witness, expanded_from
from ._parts.cell import fused_argument as argument
from ._parts.maker import StageMaker, synthetic, words
from ._parts.mask_shape import MaskShape, blocks_word, mask_shape, token_names
from ._parts.mask_why import added_why
from ._parts.unit import Unit
from .attend import weighted_sum_why
from .scale import scale_diagnosis, scaled_why
from .scores import score_why
from .softmax import softmax_checks, softmax_why

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "sdpa"


def fused_attention(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """F.scaled_dot_product_attention: expanded later into its five steps."""
    return "sdpa" if op.name == "scaled_dot_product_attention" else None


RULES = (fused_attention,)

SDPA_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

def mask_ref(op: OpRecord) -> Ref | None:
    """The attn_mask tensor given to the op, if one was."""
    given = argument(op, "attn_mask")
    return op.inputs[given.index] if isinstance(given, TensorArg) else None


def scale_factor(op: OpRecord, d_h: int) -> tuple[float, bool]:
    """The number the scores are multiplied by, and whether it was given (scale=); else
    PyTorch's default 1/sqrt(E), E = q.size(-1)."""
    given = argument(op, "scale")
    if isinstance(given, int | float) and not isinstance(given, bool):
        return float(given), True
    return 1 / math.sqrt(d_h), False


def shared_heads(op: OpRecord, q: np.ndarray, k: np.ndarray, v: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q, k, v as the fused op uses them: with enable_gqa=True, K and V's h_kv heads each
    repeated for h / h_kv query heads (PyTorch documents repeat_interleave on the head axis)."""
    if argument(op, "enable_gqa") is True and q.ndim >= 3 and k.ndim == q.ndim and \
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
    attn_mask_ref = mask_ref(op)
    is_causal = bool(argument(op, "is_causal", False))
    d = q.shape[-1]
    factor, given_scale = scale_factor(op, d)
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

    # Each step's input is the step before's output (q for scores); the expansion knows
    # what each is: (B, h, T, T) scores and weights, (B, h, T, d_h) q and attend's output.
    before = [(q.shape, m.dims(q.shape, BHTD))]

    def make(kind: str, name: str, values: np.ndarray, checks: list[Check], caption: str,
             value_kind: str = "signed", extra: tuple[TensorRecord, ...] = (),
             blocks: str = "", shape: MaskShape | None = None) -> Stage:
        title, explanation = words(kind)
        if shape is not None and shape.kind != "causal":
            # what the mask blocks, read from its entries: padding, a window, ... (the mask
            # kind's words), never "causal" for a mask that is not
            title, explanation = shape.title, shape.explanation or explanation
        rec = m.b.record(name, synthetic(values),
                            m.dims(values.shape, BHTD if kind == "attend" else BHTT),
                            kind=value_kind, caption=caption)  # type: ignore[arg-type]
        shape_in, dims_in = before[-1]
        before.append((values.shape, rec.dims))
        return Stage(id=kind, title=title + " (mha-tui's expansion)", code=code,
                     explanation=explanation, shape_in=shape_in, shape_out=values.shape,
                     dims_in=dims_in, dims_out=rec.dims,
                     tensors=(*extra, rec), checks=tuple(checks), note=label, kind=kind,
                     source=source, ops=ops, blocks=blocks)

    stages.append(make("scores", "q @ k.transpose(-2, -1)", raw,
                       [Check(f"computed here: {s.h} heads' q_i @ k_i^T", None)],
                       "row: query token · column: key token"))
    stages.append(make("scale", "scores * scale", scaled,
                       [Check(f"scale = {f'scale={factor:g}, given' if given_scale else f'1/sqrt({d})'}"
                              f" = {factor:.4f}", None)],
                       f"raw scores * {factor:.4f} = raw scores / sqrt({d})"))
    if masked_by:
        blocked = np.isneginf(np.broadcast_to(bias, masked.shape))
        n = int(blocked.sum())
        shape = mask_shape(blocked, token_names(m.b.config.tokens))
        stages.append(make("mask", "scores + attn_bias", masked,
                           [Check(f"{n} entries blocked by {' and '.join(masked_by)} are -inf", None)],
                           "attn_bias: 0 where a token may look, -inf where it may not",
                           blocks=blocks_word(shape) if n else "none", shape=shape if n else None))
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


# ------------------------------------------------------------ why this number

EXPANDED = ("the module ran F.scaled_dot_product_attention as one fused op and recorded only "
            "its q, k, v and its output: this stage's numbers are mha-tui's expansion of it, "
            "computed by mha-tui from q, k and v the way PyTorch documents its reference (in "
            "float32), not by the module")
BY = "mha-tui's expansion's"


def expansion_why(cell: Cell) -> Why:
    """A cell of the expansion (scores, scale, mask, softmax or attend): the same arithmetic
    as the kind's own why (kinds/<kind>.py), from the fused op's q, k, v and the expansion's
    stages before it, set beside the expansion's number; attend's also beside the fused op's
    own output, the module's number."""
    op = expanded_from(cell.stage)
    if op is None:
        raise WhyError(f"stage {cell.stage.id} is not an expansion of "
                       "F.scaled_dot_product_attention")
    explain = _EXPLAIN.get(cell.stage.kind)
    if explain is None:
        raise WhyError(f"mha-tui does not explain the cells of the expansion's "
                       f"{cell.stage.kind!r} stage")
    return explain(cell, op)


def _expansion(cell: Cell, op: OpRecord) -> dict[str, Stage]:
    """The expansion's stages of this op, by kind."""
    return {s.kind: s for s in cell.trace.stages if any(o.index == op.index for o in s.ops)}


def _before(cell: Cell, op: OpRecord, *kinds: str) -> tuple[Stage, np.ndarray]:
    """The expansion's stage just before this one (the first of `kinds` it has), and its
    (..., L, S) result broadcast to this cell's leading axes."""
    stages = _expansion(cell, op)
    stage = next((stages[k] for k in kinds if k in stages), None)
    if stage is None or not stage.tensors:
        raise WhyError(f"the expansion of F.scaled_dot_product_attention has no "
                       f"{' or '.join(kinds)} stage before {cell.stage.id}")
    values = stage.tensors[-1].values
    return stage, np.broadcast_to(values, (*cell.record.values.shape[:-2], *values.shape[-2:]))


def _qkv(cell: Cell, op: OpRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The fused op's q, k, v as it uses them (K/V heads shared with enable_gqa=True),
    broadcast to the cell's leading axes, and the number of query heads per K/V head."""
    q, k, v = (cell.operand(op, n) for n in range(3))
    per_kv = q.shape[-3] // k.shape[-3] if q.ndim >= 3 and k.ndim == q.ndim and \
        k.shape[-3] and q.shape[-3] != k.shape[-3] else 1
    q, k, v = shared_heads(op, q, k, v)
    lead = cell.record.values.shape[:-2]
    return (*(np.broadcast_to(t, (*lead, *t.shape[-2:])) for t in (q, k, v)),  # type: ignore[return-value]
            per_kv)


def _heads(cell: Cell, per_kv: int) -> tuple[str, str, tuple[str, ...]]:
    """How this cell's query head and K/V head are written, and a note when they differ."""
    lead = cell.index[:-2]
    q_head = ", ".join(map(str, lead))
    if per_kv == 1 or "h" not in cell.record.dims:
        return q_head, q_head, ()
    axis = cell.record.dims.index("h")
    head = cell.index[axis]
    kv = (*lead[:axis], head // per_kv, *lead[axis + 1:])
    return q_head, ", ".join(map(str, kv)), (
        f"enable_gqa=True: K and V have {cell.record.values.shape[axis] // per_kv} heads, each "
        f"shared by {per_kv} query heads; query head {head} reads K/V head {head} // {per_kv} "
        f"= {head // per_kv}",)


def _as_expansion(made: Why, basis: str, notes: tuple[str, ...] = (),
                  witness: Witness | None = None) -> Why:
    return replace(made, basis=basis, recorded_by=BY, notes=(*notes, *made.notes, EXPANDED),
                   witness=witness)


def _scores(cell: Cell, op: OpRecord) -> Why:
    q, k, _, per_kv = _qkv(cell, op)
    *lead, i, j = cell.index
    q_head, kv_head, gqa = _heads(cell, per_kv)
    made = score_why(cell, q[(*lead, i)], k[(*lead, j)], f"q[{q_head}, {i}, :]",
                     f"k[{kv_head}, {j}, :]", ())
    return _as_expansion(made, "q and k, the inputs the module gave "
                               "F.scaled_dot_product_attention (recorded)", gqa)


def _scale(cell: Cell, op: OpRecord) -> Why:
    stage, scores = _before(cell, op, "scores")
    d_h = cell.operand(op, 0).shape[-1]
    factor, given = scale_factor(op, d_h)
    origin = (f"scale={factor:g} was passed to F.scaled_dot_product_attention: the fused op "
              "multiplies the scores by it instead of its default 1/√E" if given else
              f"no scale= was passed: F.scaled_dot_product_attention multiplies by its default "
              f"1/√E, E = q.size(-1) = {d_h}")
    made = scaled_why(cell, float(scores[cell.index]), factor, False, d_h, origin)
    return _as_expansion(made, f"the expansion's {stage.id} stage (computed by mha-tui)")


def _mask(cell: Cell, op: OpRecord) -> Why:
    stage, scaled = _before(cell, op, "scale")
    *_, i, j = cell.index
    facts: list[Term] = []
    added = 0.0
    if argument(op, "is_causal", False):
        blocked = j > i
        added = -math.inf if blocked else 0.0
        facts.append(Term(f"is_causal=True: key {j} {'>' if blocked else '<='} query {i}, so "
                          f"{'-inf' if blocked else '0'}", (), added))
    ref = mask_ref(op)
    if ref is not None:
        given = cell.operand(op, op.inputs.index(ref))
        at = _own_index(cell.index, given.shape)
        entry = given[at]
        spot = f"attn_mask[{', '.join(map(str, at))}]"
        if given.dtype == bool:
            added = added if bool(entry) else -math.inf
            facts.append(Term(f"{spot} = {bool(entry)} (a bool mask: True means may attend), "
                              f"so {'0' if entry else '-inf'}", (), 0.0 if entry else -math.inf))
        else:
            added += float(entry)
            facts.append(Term(f"{spot}, a float mask, added as it is", (), float(entry)))
    made = added_why(cell, float(scaled[cell.index]), added, name="attn_bias",
                     notes=("attn_bias is what F.scaled_dot_product_attention adds to the scaled "
                            "scores: -inf where is_causal or a False in a bool attn_mask "
                            "blocks, a float attn_mask's own value",))
    made = replace(made, terms=(made.terms[0], *facts, *made.terms[1:]))
    return _as_expansion(made, f"the expansion's {stage.id} stage (computed by mha-tui) and the "
                               "op's is_causal and attn_mask (recorded)")


def _own_index(index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Where a cell of a broadcast result reads a tensor of `shape` (NumPy's broadcasting)."""
    tail = index[len(index) - len(shape):]
    return tuple(0 if n == 1 else k for k, n in zip(tail, shape, strict=True))


def _softmax(cell: Cell, op: OpRecord) -> Why:
    stage, scores = _before(cell, op, "mask", "scale")
    made = softmax_why(cell, scores[cell.index[:-1]], _dropout(op, "these weights are the ones "
                                                                   "before dropout"))
    return _as_expansion(made, f"the expansion's {stage.id} stage (computed by mha-tui)")


def _dropout(op: OpRecord, then: str) -> tuple[str, ...]:
    p = argument(op, "dropout_p", 0.0)
    if not isinstance(p, int | float) or not p:
        return ()
    return (f"dropout_p={p:g}: inside the fused op, each weight is then dropped (0) at random "
            f"or kept and scaled by 1/(1 - p); which were dropped never leaves the op (not "
            f"recorded), so the expansion leaves dropout out: {then}",)


def _attend(cell: Cell, op: OpRecord) -> Why:
    stage, weights = _before(cell, op, "softmax")
    _, _, v, per_kv = _qkv(cell, op)
    *lead, _, c = cell.index
    _, kv_head, gqa = _heads(cell, per_kv)
    made = weighted_sum_why(cell, weights[cell.index[:-1]], v[(*lead, slice(None), c)],
                            f"v[{kv_head}, k, {c}]", gqa)
    fused = op.out.values
    label = next((t.name for t in cell.stage.tensors[:-1]), "the fused output")
    caveat = _dropout(op, "the fused op's output includes it, the expansion does not")
    if np.isnan(weights[cell.index[:-1]]).all():
        caveat += ("no key is left for this query: the expansion's weights are NaN, and "
                   "torch's fused op returns 0 for such a row",)
    witness = Witness(f"{label.split(' (')[0]}[{', '.join(map(str, cell.index))}] "
                      "(what F.scaled_dot_product_attention returned)",
                      float(np.broadcast_to(fused, cell.record.values.shape)[cell.index]),
                      " ".join(caveat))
    return _as_expansion(made, f"the expansion's {stage.id} stage (computed by mha-tui) and v, "
                               "the fused op's input (recorded)", witness=witness)


_EXPLAIN = {"scores": _scores, "scale": _scale, "mask": _mask, "softmax": _softmax,
            "attend": _attend}


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
        padded = _padding(j, f64(j.g.snap(op.inputs[0]).values)) is not None
        # the reference's mask, in words: causal, padding, both or none
        masks = " and ".join(m for m, on in (("causal", j.facts.causal), ("padding", padded)) if on)
        checked = {
            "scores": "Q_i @ K_i^T for every head, inside the fused op",
            "scale": f"scaled by 1/sqrt(d_h) = {1 / math.sqrt(j.d_h):.4f} inside the fused op",
            "mask": "blocks exactly the causal entries, inside the fused op",
            "softmax": "rows normalised over the keys, inside the fused op",
            "attend": "F.scaled_dot_product_attention = softmax(Q K^T / sqrt(d_h)"
                      + (f" + {masks} mask" if masks else "") + ") V, recomputed here from its "
                      "q, k, v",
        }
        if padded:
            checked["mask"] = ("blocks " + ("the causal entries and " if j.facts.causal else "")
                               + "each row's padded keys for every query, inside the fused op"
                               + _padded_rows_words(j, op))
        # A padding bug is named where the mask was made (its broadcast), not at the call.
        made = mask_ref(op)
        maker = j.g.producer(made) if made is not None else None
        blamed = maker.source if diag is not None and diag[0].startswith("padding_") and \
            maker is not None and maker.source is not None else op.source
        seen_kinds = set()
        for s in kinds:
            seen_kinds.add(s.kind)
            is_wrong = s.kind == wrong
            rows.append(j.row(s, s.kind, not is_wrong, diff if s.kind in (wrong, "attend") else None,
                                 checked.get(s.kind, "inside the fused op"),
                                 source=blamed if is_wrong else op.source,
                                 diagnosis=diag if is_wrong else None))
        if wrong and wrong not in seen_kinds:
            rows.append(j.row(None, wrong, False, diff, checked[wrong], source=blamed,
                                 diagnosis=diag,
                                 position=j.trace.stages.index(kinds[0]) + 0.5 if kinds else 0))
        j.differences.append("computes attention with F.scaled_dot_product_attention "
                                "(scores, scale, mask, softmax and attend in one fused op): "
                                "equivalent" if good else "")
    return rows


def _padded_rows_words(j: Judge, op: OpRecord) -> str:
    """Words for a fused op whose mask also blocks the padded queries' rows (its output there
    is 0, not the reference's): the module's own choice, said; else nothing."""
    made = mask_ref(op)
    if made is None:
        return ""
    given = np.asarray(j.g.snap(made).values)
    if given.ndim != 4:
        return ""
    # True = take part for a boolean mask; an additive one blocks with -inf or a huge negative
    shut = ~given if given.dtype == bool else blocked(given)
    pad = np.asarray(j.facts.padding, dtype=bool)
    try:
        shut = np.broadcast_to(shut, (pad.shape[0], given.shape[1], pad.shape[1], pad.shape[1]))
    except ValueError:
        return ""
    if not (shut.all(axis=-1) & pad[:, None, :]).any():
        return ""
    return (", and blocks the padded queries' rows too (the module's own choice: no real "
            "token reads them)")


def _padding(j: Judge, q: np.ndarray) -> np.ndarray | None:
    """A padded batch's (B, T) padding (`--batch`), True = padding, when the fused op's q is
    (B, h, T, d_h) of that batch; else None (no padding, or heads merged into the batch)."""
    if j.facts.padding is None:
        return None
    pad = np.asarray(j.facts.padding, dtype=bool)
    return pad if q.ndim == 4 and q.shape[0] == pad.shape[0] and q.shape[-2] == pad.shape[1] \
        else None


def _judge_sdpa(j: Judge, op: OpRecord) -> tuple[bool, float, tuple[str, str] | None]:
    q, k, v = shared_heads(op, *(f64(j.g.snap(r).values) for r in j.g.tensor_operands(op)[:3]))
    d = q.shape[-1]
    T = q.shape[-2]
    causal = blocked_set(T, j.facts.causal, j.facts.window)  # (T, T)
    pad = _padding(j, q)  # (B, T), True = padding
    # A padded batch: each row's padded keys are blocked for every query, (B, 1, T, T).
    expected_mask = causal if pad is None else causal | pad[:, None, None, :]

    def attention(factor: float, mask: np.ndarray) -> np.ndarray:
        scores = q @ np.swapaxes(k, -1, -2) * factor
        # a row with no key to attend to: torch's fused op gives 0 there (numpy: NaN)
        return np.nan_to_num(softmax(np.where(mask, -np.inf, scores)) @ v, nan=0.0)

    got, want = f64(op.out.values), attention(1 / math.sqrt(d), expected_mask)
    if pad is not None and got.shape == want.shape and not np.isnan(got).any():
        # A padded query's row is never read for a real token's output: what the module's
        # mask does there (blocks it too, DeBERTa's way) is its own choice.
        got = np.where(pad[:, None, :, None], want, got)
    good, diff = close(got, want)
    if good:
        return True, diff, None
    p = op.kwarg("dropout_p", 0.0)
    if isinstance(p, float) and p > 0:
        return False, diff, ("dropout_active",
                             f"dropout is active inside F.scaled_dot_product_attention "
                             f"(dropout_p={p}): {j.runs_differ()}; pass "
                             "dropout_p=self.dropout if self.training else 0.0")
    if pad is not None:
        padding = _padding_diagnosis(op.out.values, lambda mask: attention(1 / math.sqrt(d), mask),
                                     causal, pad)
        if padding is not None:
            return False, diff, padding
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


def _padding_diagnosis(out: np.ndarray, attention: Callable[[np.ndarray], np.ndarray],
                       causal: np.ndarray, pad: np.ndarray) -> tuple[str, str] | None:
    """The classic padding bugs, as the fused op's output shows them (the same names as the
    mask kind's): the padding on the query axis, inverted, or not given at all."""
    found = (
        (causal | pad[:, None, :, None], "padding_on_queries",
         "the padding mask given to F.scaled_dot_product_attention is broadcast on the query "
         "axis: the padded positions' rows are blocked, and every query still sees the padded "
         "keys; put the padding on the last (key) axis, mask[:, None, None, :]"),
        (causal | ~pad[:, None, None, :], "padding_inverted",
         "the padding mask given to F.scaled_dot_product_attention is inverted: the tokens are "
         "blocked and the padded keys are seen (attn_mask keeps the entries where it is True: "
         "True for a token, False for padding)"),
        (causal, "mask_missing",
         "F.scaled_dot_product_attention ran without the padding mask: every query also "
         "attends to the padded keys (pass attn_mask=mask[:, None, None, :], True for a token)"),
    )
    for mask, name, said in found:
        if close(out, attention(mask))[0]:
            return name, said
    return None


# ------------------------------------------------------------ ordering
