"""mask: blocking score entries (add a -inf buffer, masked_fill, where with a large negative);
with --no-causal, the mask that did not run.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, masks_somewhere
from ..ops.numeric import (
    ATOL,
    HALF,
    blocked,
    blocked_pattern,
    blocked_set,
    causal_set,
    f64,
    max_diff,
    precision,
)
from ..ops.sizes import Sizes
from ..ops.vocab import LARGE_NEGATIVE, MASK_OPS, very_negative
from ..records import Check, OpRecord, Stage, Statement, TensorRecord, Trace
from ..stages import NO_MASK, NO_MASK_ARGUMENT
from ._parts.builder import BHTT, Builder
from ._parts.maker import StageMaker, possessive
from ._parts.mask_fill import fill_check, fill_of, fill_value, written
from ._parts.mask_shape import MaskShape, blocks_word, mask_shape, token_names  # noqa: F401  (MaskShape: the kind's words, re-exported)
from ._parts.mask_why import why  # noqa: F401  (the kind's why, in mask_why.py: why.py reads mask.why)
from ._parts.quizzing import Question, head_of_interest, recorded
from ._parts.unit import Unit
from .scores import scaled_inside

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "mask"


def mask(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """Blocking score entries: add a -inf buffer, masked_fill, or where with a big negative."""
    if not g.x_inputs(op) or not g.op_derives(op, {"scores"}) or g.op_derives(op, {"softmax"}):
        return None
    others = g.other_inputs(op)
    if op.name in {"add", "add_"}:
        return "mask" if others and masks_somewhere(g, others[0]) else None
    if op.name in {"sub", "sub_"}:  # scores - M: M's negative is what is added
        return "mask" if others and g.is_x(op.inputs[0]) and \
            masks_somewhere(g, others[0], sign=-1.0) else None
    if op.name in {"masked_fill", "masked_fill_"}:
        value = fill_value(op)
        if value is not None and value <= LARGE_NEGATIVE:
            return "mask"
        fills = [r for r in others if g.snap(r).values.size == 1]
        return "mask" if fills and very_negative(g.snap(fills[0]).values) else None
    if op.name == "where":
        numbers = [a for a in op.scalars() if isinstance(a, int | float)]
        if any(float(n) <= LARGE_NEGATIVE for n in numbers):
            return "mask"
        return "mask" if any(very_negative(g.snap(r).values) for r in others
                             if g.snap(r).dtype != "bool") else None
    if op.name in _WRITES:
        return "mask" if _writes_blocks(g, op) else None
    return None


# `scores[..., i, j] = -inf` (pbloem's mask_ with torch.triu_indices): an index_put
_WRITES = {"setitem", "__setitem__", "index_put", "index_put_"}


def _writes_blocks(g: Graph, op: OpRecord) -> bool:
    """An indexed write into the scores whose every changed entry is now blocked."""
    before = g.snap(g.x_inputs(op)[0]).values.astype(np.float64)
    after = op.out.values.astype(np.float64)
    if before.shape != after.shape:
        return False
    with np.errstate(invalid="ignore"):
        changed = ~((before == after) | (np.isnan(before) & np.isnan(after)))
        blocked = np.isneginf(after) | (after <= LARGE_NEGATIVE)
    return bool(changed.any() and blocked[changed].all())


RULES = (mask,)

SKIPPED_MASK = (
    "No mask was applied (--no-causal): the module's masking lines did not run, so every "
    "token may attend to every token, later ones included, and the scaled scores go on to "
    "softmax unchanged.")


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    g = m.g
    groups = m.per_head_ops(unit)
    first = m.op(unit.ops[0])
    before_ref = m.x_in(first)
    values, snap = m.four_d(unit, BHTT)
    if m.b.per_head and len(groups) > 1:
        before_values = np.stack([m.snap(m.x_in(grp[0])).values for grp in groups],
                                 axis=m.b.head_axis)
    else:
        before_values = m.b.out_4d([before_ref.op], BHTT)[0] if before_ref.op is not None \
            else m.snap(before_ref).values
    mask_ref = next((r for r in g.other_inputs(first) if m.snap(r).values.size > 1), None)
    tensors = []
    how = first.name.rstrip("_")
    if mask_ref is not None:
        given = m.snap(mask_ref)
        if given.dtype == "bool":
            caption = ("True where the score is replaced" if how == "masked_fill" else
                       "True where the score is kept" if _where_keeps(first) else
                       "True where the score is replaced")
        else:
            caption = "0 where a token may look, -inf (or a large negative) where it may not"
        mask_values = given.values
        if mask_values.ndim == 2 and mask_values.shape[0] == mask_values.shape[1]:
            n = mask_values.shape[0]
            above = np.triu(np.ones((n, n), dtype=bool), 1)
            if given.dtype == "bool" and np.array_equal(mask_values, above):
                caption = "True above the diagonal (a later token), False on and below it"
            elif given.dtype == "bool" and np.array_equal(mask_values, ~above):
                caption = "True on and below the diagonal, False above it (a later token)"
            elif given.dtype != "bool" and np.isneginf(mask_values[above]).all() and \
                    (mask_values[~above] == 0).all():
                caption = "0 on and below the diagonal, -inf above"
        tensors.append(m.b.record(m.spelled(mask_ref, first), given,
                                     m.broadcast_dims(given.shape, ("T", "T"), ("B", "T", "T"),
                                                      onto=(values.shape, BHTT)),
                                     values=mask_values, caption=caption,
                                     kind="int" if given.dtype == "bool" else "signed"))
    name = m.tensor_name(first, fallback="scores")
    before_op = g.producer(before_ref)
    before_name = m.tensor_name(before_op) if before_op is not None else "scores"
    stage_name = "scale" if g.op_derives(first, {"scale"}) else "scores"
    tensors.append(m.b.record(name, snap, BHTT if values.ndim == 4 else None, values=values,
                                 share=(f"{possessive(stage_name)} {before_name}", m.snap(before_ref))))
    floats = values.dtype.kind == "f"
    # What the mask op wrote (the added tensor, the filled positions), and what was blocked
    # before it; a threshold on the result only when the op does not say.
    blocked = written_4d(m, unit, values.shape)
    if blocked is None:
        blocked = values <= LARGE_NEGATIVE if floats else np.zeros(values.shape, bool)
    elif before_values.shape == values.shape and before_values.dtype.kind == "f":
        blocked = blocked | (before_values <= LARGE_NEGATIVE)
    n_total = int(np.count_nonzero(blocked))  # counted once, read below
    T = values.shape[-1]
    above = np.triu(np.ones((values.shape[-2], T), dtype=bool), 1)
    causal = values.ndim >= 2 and bool(np.array_equal(np.broadcast_to(above, values.shape), blocked))
    # -inf <= -1e4: every -inf is a blocked entry, so they are counted without indexing
    n_inf = int(np.count_nonzero(values == -np.inf)) if floats and n_total else 0
    # values[~blocked] == before_values[~blocked], without copying either out
    kept = bool(((values == before_values) | blocked).all()) \
        if before_values.shape == values.shape else True
    where = "above the diagonal" if causal else "the mask blocks"
    shape = mask_shape(blocked, token_names(m.b.config.tokens))
    checks = [
        fill_check(m, groups, values, before_values, blocked, n_total, n_inf, where),
        Check(f"entries {'on and below the diagonal' if causal else 'the mask lets through'} "
              f"are unchanged", kept),
    ]
    note = ""
    inside = scaled_inside(g)
    if inside is not None:
        note = (f"The scores were already scaled inside baddbmm (alpha = {inside:.6g}); "
                f"the mask comes after the scaling.")
    elif g.op_derives(first, {"scale"}) is False and "scale" not in m.made \
            and "scale" in g.kind.values():  # a scale comes later (GPT-Neo never scales)
        note = "This module masks the raw scores, before scaling."
    if first.in_place:
        note = (note + " " if note else "") + (
            f"{first.name} changes the tensor in place; mha-tui recorded the scores before it ran, "
            "so the scores stage still shows them unmasked.")
    explanation = None
    if how == "masked_fill":
        explanation = ("A token may only attend to itself and earlier tokens. masked_fill "
                       "writes -inf wherever the boolean mask is True; softmax turns -inf into "
                       "exactly 0. The same (T, T) mask broadcasts over every batch and head.")
    elif how == "where":
        explanation = ("torch.where keeps a score where the condition allows it and puts a "
                       "large negative number elsewhere; softmax turns those into (almost) 0.")
    if n_total and n_inf < n_total:
        # The words follow the recorded values: -1e9 or finfo.min is not -inf.
        written_as = fill_of(m.g, first)
        if written_as is not None and written_as[0] == "added" and how == "sub":
            done = (f"get {-written_as[1]:.6g} subtracted (the subtracted tensor holds 0 where "
                    f"a token may look and {-written_as[1]:.6g} where it may not)")
        elif written_as is not None and written_as[0] == "added":
            done = (f"get the mask's {written_as[1]:.6g} added (the mask tensor holds 0 where "
                    f"a token may look and {written_as[1]:.6g} where it may not)")
        else:
            done = f"are set to a large negative number ({float(values[blocked].max()):.3g})"
        explanation = ("A token may only attend to itself and earlier tokens. The scores it "
                       f"may not look at {done}, not -inf; softmax turns them into 0 to within "
                       "float32 precision (their exp underflows). The same (T, T) mask "
                       "broadcasts over every batch and head.")
    title = None
    if shape.kind != "causal" and n_total:
        title, explanation = shape.title, shape.explanation
        checks.insert(0, Check(f"{n_total} entries blocked: {shape.what}", None))
    stage = m.stage(unit, stage_id, "mask", tensors, checks, shape_in=before_values.shape,
                    shape_out=values.shape, dims_in=tensors[-1].dims, dims_out=tensors[-1].dims,
                    note=note, explanation=explanation, title=title)
    return replace(stage, blocks=blocks_word(shape) if n_total else "none")


def written_4d(m: StageMaker, unit: Unit, shape: tuple[int, ...]) -> np.ndarray | None:
    """The entries the stage's mask op(s) wrote a mask value into, laid out as the stage's
    (B, h, T, T) tensor (stacked per head as out_4d stacks the values); None when an op
    does not say (mask_fill.written)."""
    marks = []
    for group in m.per_head_ops(unit):
        # every mask op of the stage, in order (GPT-Neo's local layer: torch.where with its
        # window, then the added causal mask): an entry any of them wrote is blocked
        ops = [op for op in group if op.name in MASK_OPS | {"baddbmm"}]
        wrote = [written(m.g, op) for op in ops]
        last = group[-1].out.shape
        if not ops or any(w is None or w.shape != last for w in wrote):
            return None
        marks.append(np.logical_or.reduce(wrote))
    mark = np.stack(marks, axis=m.b.head_axis) if len(marks) > 1 else marks[0]
    if mark.shape != shape and mark.size == int(np.prod(shape)):
        mark = mark.reshape(shape)  # torch's (B*h, T, T) regrouped, as out_4d does
    elif mark.shape != shape:
        return None
    return mark


def _where_keeps(op: OpRecord) -> bool:
    """torch.where(cond, scores, -inf): True keeps; where(cond, -inf, scores): True replaces."""
    args = op.args
    return len(args) > 1 and hasattr(args[1], "index") and op.inputs[args[1].index].kind == "op"


def _skipped_lines(before: Stage, after: Stage) -> tuple[str, Statement] | None:
    """The module's own lines between the scale stage's statement and softmax's that did not
    run (an `if` that was False and its body), read from the file, each marked as skipped."""
    import linecache

    if before.source is None or not after.ops:
        return None
    start = max(op.source.end_line or op.source.line for op in before.ops) if before.ops else 0
    end = after.ops[0].source.line
    file = after.ops[0].source.file
    if not start or file != before.source.file or end - start < 2:
        return None
    lines = [linecache.getline(file, n).rstrip("\n") for n in range(start + 1, end)]
    code = [line for line in lines if line.strip() and not line.strip().startswith("#")]
    if not code or not code[0].strip().startswith("if "):
        return None
    indent = min(len(line) - len(line.lstrip()) for line in code)
    marked = []
    for n, line in enumerate(code):
        text = line[indent:].split("  # ", 1)[0].rstrip()
        marked.append(text + ("  # False: the line below did not run" if n == 0 and text.startswith("if ")
                              else "  # skipped, did not run"))
    return "\n".join(marked), Statement(file=file, line=start + 1, text="\n".join(marked), end_line=end - 1)


def add_skipped_mask(stages: list[Stage], b: Builder) -> None:
    """--no-causal on a module whose mask line is guarded: say that no mask ran, after scale,
    showing the module's own guarded lines as skipped."""
    at = next((i for i, st in enumerate(stages) if st.kind == "scale"), None)
    softmax = next((st for st in stages if st.kind == "softmax"), None)
    if at is None or not stages[at].tensors or softmax is None:
        return
    skipped = _skipped_lines(stages[at], softmax)
    if skipped is None and b.g.rec.library != "numpy":
        return
    scaled = stages[at].tensors[-1]
    passed = replace(scaled, shares_storage=True, shares_with=f"scale's {scaled.name}",
                     caption="no mask: the scaled scores, unchanged")
    same = bool(softmax.ops) and any(
        ref.kind == "op" and ref.op in {op.index for op in stages[at].ops}
        for ref in softmax.ops[0].inputs)
    numpy = b.g.rec.library == "numpy"
    info = NO_MASK_ARGUMENT if numpy else NO_MASK
    if skipped is not None:
        code, source = skipped
        explanation = info.explanation if numpy else SKIPPED_MASK
    else:
        code, source, explanation = info.code, None, info.explanation
    stages.insert(at + 1, Stage(
        id="mask", title=info.title, code=code, explanation=explanation,
        shape_in=stages[at].shape_out, shape_out=stages[at].shape_out, dims_in=scaled.dims,
        dims_out=scaled.dims, tensors=(passed,),
        checks=(Check("no mask was applied: the scores are the scaled scores, the same tensor",
                      same),),
        kind="mask", source=source, ops=(), blocks="none"))


# ---------------------------------------------------------------------- judging


def _nth(k: int) -> str:
    n = k + 1
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _judge_op(j: Judge, op: OpRecord, expected: np.ndarray
              ) -> tuple[bool, float, np.ndarray | None, np.ndarray, np.ndarray, str]:
    """One mask op: (right, largest change to a kept entry, the pattern it blocks (None when
    it differs between heads), the scores before it, the entries it keeps, the note on the
    value it masks with)."""
    after = j.tokens_last(f64(op.out.values))
    if op.name == "baddbmm":  # mask + q @ k^T in one op (torch's own MHA)
        operands = [f64(j.g.snap(r).values) for r in j.g.tensor_operands(op)]
        before = float(op.kwarg("alpha", 1) or 1) * (operands[1] @ operands[2])
        if "adds the mask inside the scores product (baddbmm): equivalent" not in j.differences:
            j.differences.append("adds the mask inside the scores product (baddbmm): "
                                 "equivalent")
    else:
        before = j.tokens_last(f64(j.g.snap(j.g.x_inputs(op)[0]).values))
    if before.shape != after.shape:
        before = np.broadcast_to(before, after.shape)
    # what the op wrote, not a threshold on its result (mask_fill.written)
    wrote = written(j.g, op)
    wrote = j.tokens_last(wrote) if wrote is not None else None
    newly = (wrote if wrote is not None and wrote.shape == after.shape else blocked(after)) \
        & ~blocked(before)
    square = newly.ndim >= 2 and newly.shape[-1] == j.T_q
    flat = newly.reshape(-1, j.T_q, j.T_q) if square else None
    same = flat is not None and all(np.array_equal(f, flat[0]) for f in flat)
    pattern = flat[0] if same and flat is not None else None
    kept = ~newly
    d = max_diff(np.where(kept, after, 0.0), np.where(kept, before, 0.0))
    good = pattern is not None and np.array_equal(pattern, expected) and d <= _allowed(
        before, kept)
    values = after[newly]
    note = ""
    if good and values.size and np.isfinite(values).all():
        written_as = fill_of(j.g, op)
        how = (f"subtracts {-written_as[1]:.6g} from the entries it blocks"
               if written_as is not None and written_as[0] == "added" and
               op.name.startswith("sub") else
               f"adds {written_as[1]:.6g} to the entries it blocks" if written_as is not None
               and written_as[0] == "added" else
               f"masks with {written_as[1]:.6g}" if written_as is not None else
               f"masks with {float(values.max()):.3g}")
        note = (f"{how} instead of -inf: softmax gives those entries weight 0 in float32, the "
                f"same weights: equivalent")
    return good, d, pattern, before, kept, note


def judge(j: Judge) -> list[Row]:
    """Judge the entries blocked by the mask op, then what actually reaches softmax."""
    stages = [s for s in j.trace.stages if s.kind == "mask" and not j.is_sdpa(s)]
    if j.facts.padding is not None:
        return _judge_padded(j, stages)
    expected = blocked_set(j.T_q, j.facts.causal, j.facts.window)
    rows: list[Row] = []
    mask_ok = True
    value_note = ""
    for stage in stages:
        ops = j.main_ops(stage, MASK_OPS | {"baddbmm"})
        if not ops:
            rows.append(j.row(stage, "mask", None, None, "no masking op recognised"))
            continue
        # Every op of the stage is judged: a per-head loop (`for h in range(n_heads):
        # ... masked_fill ...`) masks once per head, and each head's mask must be right. The
        # row is the first wrong one's (its line and head), else the last's.
        judged = [_judge_op(j, op, expected) for op in ops]
        wrong = next((k for k, one in enumerate(judged) if not one[0]), None)
        op = ops[-1] if wrong is None else ops[wrong]
        good, d, pattern, before, kept, note = judged[-1 if wrong is None else wrong]
        d = max(one[1] for one in judged)
        mask_ok &= good
        value_note = note or value_note
        diag = None if good else _mask_diagnosis(j, pattern, expected, d, _allowed(before, kept))
        if diag is not None and len(ops) > 1:
            diag = (diag[0], f"{diag[1]} (the {_nth(wrong or 0)} of this line's {len(ops)} "
                             "mask ops, one a pass of its loop)")
        n = int(expected.sum())
        rows.append(j.row(stage, "mask", good, d,
                             _blocks_words(j, n),
                             source=op.source, note=value_note, diagnosis=diag))
    if value_note:
        j.differences.append(value_note)
    # What softmax normalises: the masked scores must be what reaches it.
    soft = j.softmax_ops()
    if not soft or not mask_ok:
        return rows
    logits = j.tokens_last(f64(j.g.snap(j.g.x_inputs(soft[0])[0]).values))
    pattern = blocked_pattern(logits) if logits.ndim >= 2 and logits.shape[-1] == j.T_q else None
    if pattern is not None and np.array_equal(pattern, expected):
        if not stages and expected.any():
            j.differences.append("applies the mask inside the scores op (an additive "
                                    "attn_mask in baddbmm): equivalent")
        return rows
    if pattern is None:
        return rows
    # The future is not blocked before softmax.
    after = _mask_after_softmax(j, soft[0], expected)
    if after is not None:
        op, d = after
        sums = f64(op.out.values).sum(axis=-1)
        rows.append(j.row(j.stage_of.get(op.index), "mask", False, d,
                             "the causal entries are blocked before softmax",
                             source=op.source, diagnosis=(
                                 "mask_after_softmax",
                                 "the mask is applied after softmax: the causal entries are "
                                 "blocked in the weights, not in the scores, so the rows "
                                 f"no longer sum to 1 (row sums {np.nanmin(sums):.4f} to "
                                 f"{np.nanmax(sums):.4f}); mask the scores, then softmax"),
                             position=j.position_after("softmax")))
        return rows
    if stages and j.classified().derives(j.g.x_inputs(soft[0])[0], {"mask"}):
        # The masked scores do reach softmax, through a line no rule places (a relu that
        # turns -inf into 0): that line is where the module leaves attention, and the
        # end-to-end comparison names it (verdict._departure), not the mask's line.
        rows[-1] = j.row(stages[-1], "mask", None, None,
                         "the masked scores reach softmax, changed on the way by a line "
                         "judged below")
        return rows
    if stages:
        last = stages[-1]
        rows[-1] = j.row(last, "mask", False, None,
                            "the masked scores are what softmax normalises",
                            source=j.main_ops(last, MASK_OPS)[-1].source,
                            diagnosis=("mask_missing",
                                       "the mask's result never reaches softmax: softmax "
                                       f"normalises scores with {int(expected.sum())} causal "
                                       "entries unblocked (the masked tensor is not the one "
                                       "passed on)"))
        return rows
    rows.append(j.row(None, "mask", False, None,
                         f"blocks exactly the {int(expected.sum())} causal entries before softmax",
                         source=soft[0].source,
                         diagnosis=("mask_missing" if j.facts.causal else "mask_unexpected",
                                    "no mask: softmax gets every score, so each token also "
                                    "attends to the tokens after it" if j.facts.causal else
                                    "the scores are masked although --no-causal was given"),
                         position=j.position_before("softmax")))
    return rows


def _judge_padded(j: Judge, stages: list[Stage]) -> list[Row]:
    """A padded batch (`check --batch`): each row blocks its padded keys for every query,
    besides the causal entries. The classic bugs are named: the padding on the query axis
    (whole rows blocked), an inverted padding mask (the tokens blocked, the padding seen)."""
    pad = np.asarray(j.facts.padding, dtype=bool)  # (B, T), True = padding
    B, T = pad.shape
    causal = blocked_set(T, j.facts.causal, j.facts.window)  # (T, T)
    expected = causal[None] | pad[:, None, :]  # (B, T_q, T_k)
    words = (f"blocks {'the causal entries and ' if causal.any() else ''}each row's padded "
             "keys for every query")
    rows: list[Row] = []
    for stage in stages:
        ops = j.main_ops(stage, MASK_OPS)
        if not ops:
            rows.append(j.row(stage, "mask", None, None, "no masking op recognised"))
            continue
        op = ops[-1]
        after = f64(op.out.values)
        before = np.broadcast_to(f64(j.g.snap(j.g.x_inputs(op)[0]).values), after.shape)
        newly = blocked(after) & ~blocked(before)
        if newly.size % (B * T * T):
            rows.append(j.row(stage, "mask", None, None, f"{words}: not judged (its shape "
                              f"{after.shape} is not (B, h, T, T))", source=op.source))
            continue
        per_row = newly.reshape(B, -1, T, T)  # (B, h, T, T)
        kept = ~newly
        d = max_diff(np.where(kept, after, 0.0), np.where(kept, before, 0.0))
        # A padded query's row is never read for a real token's output: what the module
        # blocks there is its own choice (DeBERTa's mask blocks the padded queries too).
        differs = per_row != expected[:, None]
        wrong = differs & ~pad[:, None, :, None]  # on a real query's row, (B, h, T_q, T_k)
        good = not wrong.any() and d <= _allowed(before, kept)
        checked = words
        if good and differs.any():
            checked += (", and blocks the padded queries' rows too (the module's own choice: "
                        "no real token reads them)")
        diag = None
        if good and np.isneginf(after).all(axis=-1).any():
            good = False
            diag = ("padding_nan", "the padded queries' rows are blocked entirely with -inf: "
                    "softmax makes them NaN, and the next layer's weights @ V (0 * NaN) carries "
                    "it to the real tokens; block with torch.finfo(dtype).min, as Hugging Face "
                    "does, or block the padded keys only")
        if not good and diag is None:
            on_queries = causal[None] | pad[:, :, None]
            inverted = causal[None] | ~pad[:, None, :]
            if (per_row == on_queries[:, None]).all():
                diag = ("padding_on_queries", "the padding mask is broadcast on the query "
                        "axis: the padded positions' rows are blocked, and every query still "
                        "sees the padded keys; put the padding on the last (key) axis, "
                        "mask[:, None, None, :]")
            elif (per_row == inverted[:, None]).all():
                diag = ("padding_inverted", "the padding mask is inverted: the tokens are "
                        "blocked and the padded keys are seen (attention_mask is 1 for a "
                        "token, 0 for padding; key_padding_mask is True for padding)")
            else:
                diag = ("padding_wrong", "the mask does not block exactly each row's padded "
                        "keys" + (" and the causal entries" if causal.any() else "")
                        + _first_wrong_entry(wrong, per_row, pad))
        rows.append(j.row(stage, "mask", good, d, checked, source=op.source, diagnosis=diag))
    # F.scaled_dot_product_attention takes the padding in its attn_mask: the sdpa kind
    # judges it from the fused op's own output.
    if not stages and pad.any() and not any(j.is_sdpa(s) for s in j.trace.stages):
        soft = j.softmax_ops()
        rows.append(j.row(None, "mask", False, None, words,
                          source=soft[0].source if soft else None,
                          diagnosis=("mask_missing", "no mask: softmax gets every score, so "
                                     "every query also attends to the padded keys"),
                          position=j.position_before("softmax")))
    return rows


def _first_wrong_entry(wrong: np.ndarray, per_row: np.ndarray, pad: np.ndarray) -> str:
    """Where a padded batch's mask is first wrong (`wrong`: on a real query's row): a key it
    should block that is seen, or a key it blocks that should be seen (batch row, head,
    query, key)."""
    if not wrong.any():
        return ""
    b, h, i, k = (int(n) for n in np.argwhere(wrong)[0])
    what = "padding" if pad[b, k] else "a token"
    done = "blocked" if per_row[b, h, i, k] else "seen"
    head = f", head {h}" if per_row.shape[1] > 1 else ""
    return f": in batch row {b}{head}, query {i} has key {k} ({what}) {done}"


def _allowed(before: np.ndarray, kept: np.ndarray) -> float:
    """How far the mask op may move a score it does not block: ATOL, or, for a module in
    bfloat16 or float16, that dtype's rounding of the scores' size (a mask added inside the
    product, baddbmm, rounds the sum once more)."""
    p = precision()
    if p.dtype not in HALF:
        return ATOL
    scores, kept = np.broadcast_arrays(f64(before), kept)
    finite = np.abs(scores[kept & np.isfinite(scores)])
    return p.atol * max(1.0, float(finite.max()) if finite.size else 1.0)


def _mask_diagnosis(j: Judge, pattern: np.ndarray | None, expected: np.ndarray, d: float,
                    allowed: float = ATOL) -> tuple[str, str]:
    T = j.T_q
    if pattern is None:
        return "mask_wrong", "the mask blocks different entries in different heads"
    lower = np.tril(np.ones((T, T), bool), k=-1)
    n = int(pattern.sum())
    if not expected.any() and pattern.any():
        return "mask_unexpected", (f"{n} entries are masked although --no-causal was given")
    if np.array_equal(pattern, lower) or np.array_equal(pattern, ~expected):
        what = ("the earlier tokens and each token itself ({n} entries: the diagonal and "
                "below)" if np.array_equal(pattern, ~expected) else
                "the earlier tokens ({n} entries below the diagonal)").format(n=n)
        return "mask_reversed", (f"the mask is reversed: it blocks {what} and lets every "
                                 "token see the ones after it; block key j > query i")
    if not pattern.any():
        return "mask_missing", "the mask line blocks nothing: every score reaches softmax"
    if j.facts.window is not None and np.array_equal(pattern, causal_set(T)):
        return "window_missing", (f"no sliding window: the mask blocks only the future, but "
                                  f"--window {j.facts.window} wants every key {j.facts.window} "
                                  "or more tokens back blocked too")
    window = _window_of(pattern)
    if window is not None and j.facts.window != window:
        wanted = "" if j.facts.window is None else f" (--window {j.facts.window} was given)"
        return "sliding_window", (
            f"differs: sliding window of {window}: each token looks only at itself and the "
            f"{window - 1} token{'s' if window != 2 else ''} before it{wanted}; plain causal "
            f"attention lets it see every earlier token (check --window {window} if that is "
            "the exercise)")
    if np.array_equal(pattern, expected | np.eye(T, dtype=bool)):
        return "mask_diagonal", "the mask also blocks each token from itself (the diagonal)"
    if d > allowed and np.array_equal(pattern, expected):
        return "mask_changes_scores", f"the mask also changes unmasked scores (by up to {d:.3g})"
    return "mask_wrong", (f"the mask blocks {n} entries, {int((pattern & ~expected).sum())} of "
                          f"them not causal ones, and misses {int((expected & ~pattern).sum())}")


def _blocks_words(j: Judge, n: int) -> str:
    if j.facts.window is not None:
        return (f"blocks exactly the {n} entries of a causal sliding window of "
                f"{j.facts.window} (key after query, or {j.facts.window} or more back)")
    if j.facts.causal:
        return f"blocks exactly the {n} causal entries (key after query)"
    return "blocks nothing (--no-causal)"


def _window_of(pattern: np.ndarray) -> int | None:
    """w when the pattern blocks the future and every key w or more tokens back."""
    T = pattern.shape[-1]
    for w in range(1, T):
        if np.array_equal(pattern, blocked_set(T, True, w)):
            return w
    return None


def _mask_after_softmax(j: Judge, soft: OpRecord, expected: np.ndarray
                        ) -> tuple[OpRecord, float] | None:
    """An op after softmax that blocks exactly the causal entries of the weights."""
    for op in j.g.ops[soft.index + 1:]:
        if not j.g.from_x[op.index] or op.name not in MASK_OPS:
            continue
        xs = j.g.x_inputs(op)
        before, after = f64(j.g.snap(xs[0]).values), f64(op.out.values)
        if before.shape != after.shape or after.shape[-1] != j.T_q:
            continue
        changed = (before != after) & ~(np.isnan(before) & np.isnan(after))
        flat = changed.reshape(-1, j.T_q, j.T_q)
        if all(np.array_equal(f & ~expected, np.zeros_like(f)) for f in flat) and changed.any():
            return op, max_diff(after, before)
    return None


def _stage_written(stage: Stage, trace: Trace, shape: tuple[int, ...]) -> np.ndarray | None:
    """The entries the stage's one mask op wrote a mask value into, in the shape of the
    stage's tensor (None: several ops, or one that does not say)."""
    ops = [op for op in stage.ops if op.name in MASK_OPS | {"baddbmm"}]
    if len(ops) != 1 or trace.recording is None:
        return None
    mark = written(Graph(trace.recording), ops[0])
    if mark is None or mark.size != int(np.prod(shape)):
        return None
    return mark.reshape(shape)


def _padded_keys(stage: Stage, trace: Trace, record: TensorRecord, head: int
                 ) -> tuple[Question, ...]:
    """A padded batch (`--batch`): how many keys of the first padded row the mask blocks for
    every query, read from the entries it blocked (its padded keys, when the mask is right)."""
    config = trace.config
    padded = next((b for b, row in enumerate(config.padding) if any(row)), None)
    if not config.batch or padded is None or record.dims[:1] != ("B",) or len(record.shape) != 4:
        return ()
    index = (padded, head) if record.dims[1] == "h" else (padded, 0)
    held = blocked(record.values[index])
    every = [int(j) for j in np.flatnonzero(held.all(axis=0))]
    if not every:
        return ()
    keys = config.row_tokens(padded)
    return (Question(stage.id, "padded_keys", f"Batch row {padded} is padded to "
                     f"{held.shape[-1]} tokens: how many of its keys does the mask block for "
                     f"every query?", "integer", len(every), str(len(every)),
                     f"the key columns of {recorded(stage, record.name)}"
                     f"[{', '.join(map(str, index))}] blocked in every row: "
                     + ", ".join(f"{j} ({keys[j] if j < len(keys) else j})" for j in every)
                     + " (counted by mha-tui)"),)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """How many entries of one head's T x T scores the mask blocks; with a padded batch, how
    many of batch row 0's keys it blocks for every query."""
    if not stage.tensors or len(stage.tensors[-1].shape) < 2:
        return ()
    record = stage.tensors[-1]
    head = 0 if "h" in record.dims else head_of_interest(record)
    index = [0] * (len(record.shape) - 2)
    if "h" in record.dims:
        index[record.dims.index("h")] = head
    grid = record.values[tuple(index)]
    held = blocked(grid)  # entries holding a mask value after the stage
    wrote = _stage_written(stage, trace, record.shape)
    if wrote is not None and not np.array_equal(wrote[tuple(index)], held):
        # an added -10000 leaves -9999.3 where the score was 0.7: count what the op wrote
        held = wrote[tuple(index)]
        how = "into which the mask op wrote a mask value (the added mask holds -1e4 or below there)"
    else:
        how = "that hold a mask value (-inf, or -1e4 and below) after this stage"
    count = int(held.sum())
    T = grid.shape[-1]
    row = " of batch row 0" if trace.config.batch else ""
    return (*_padded_keys(stage, trace, record, head), Question(
                     stage.id, "blocked", f"How many of the {grid.size} entries of head {head}'s "
                     f"{grid.shape[0]} x {T} scores{row} does the mask block?", "integer", count,
                     str(count), f"the entries of "
                     f"{recorded(stage, record.name)}[{', '.join(map(str, index))}] "
                     f"{how}: {count} "
                     f"(counted by mha-tui)"),)
