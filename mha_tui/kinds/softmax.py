"""softmax: scores become weights, by softmax or written out by hand (exp, sum, divide).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, hand_written_softmaxes
from ..ops.numeric import ATOL, HALF, RTOL, close, f64, precision, tolerance
from ..ops.sizes import Sizes
from ..ops.vocab import LARGE_NEGATIVE, SOFTMAXES
from ..ops.vocab import softmax as softmax_of
from ..records import Check, OpRecord, Stage, Trace
from ..roles import find, role_checks, role_notes, roles_of
from ._parts.builder import BHTT, plural, yes
from ._parts.cell import Cell, Term, Why, where
from ._parts.maker import StageMaker, words
from ._parts.mask_fill import written_upstream
from ._parts.quizzing import (
    Question,
    cell_index,
    head_of_interest,
    key_name,
    last_query,
    number_text,
    recorded,
    token_name,
)
from ._parts.unit import Unit
from .scores import scaled_inside

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "softmax"


def softmax(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    return "softmax" if op.name in SOFTMAXES and g.x_inputs(op) else None


def handwritten_softmax(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """exp(s - max(s)) / sum(exp(...)) written out over several ops or lines: one softmax."""
    if g.softmax_parts is None:
        g.softmax_parts = {i for found in hand_written_softmaxes(g) for i in found.parts}
    return "softmax" if op.index in g.softmax_parts else None


RULES = (softmax, handwritten_softmax)


def _row_name(at: tuple[int, ...], tokens: tuple[str, ...]) -> str:
    """`query AI (row 2) of head 1`, from a row's index in the weights' leading axes."""
    *lead, t = at
    word = f"query {tokens[t]} (row {t})" if 0 <= t < len(tokens) else f"query row {t}"
    if len(lead) >= 2:
        return f"{word} of head {lead[-1]}" + (f", batch row {lead[0]}" if lead[0] else "")
    return word + (f" of head {lead[0]}" if lead else "")


def nan_words(nan_rows: np.ndarray, before: np.ndarray, tokens: tuple[str, ...] = (),
              masked: np.ndarray | None = None) -> str:
    """Why some rows of the weights are NaN, from the scores softmax read: a row whose every
    score is -inf has every key blocked (by the mask, or by scores that overflowed to -inf),
    and its softmax is 0/0; a row holding NaN or +inf already carried it in. masked: the
    entries the mask op wrote, where known."""
    rows = [tuple(int(i) for i in at) for at in np.argwhere(nan_rows)]
    first = rows[0]
    more = f" ({len(rows)} rows in all)" if len(rows) > 1 else ""
    row = before[first] if before.shape[:-1] == nan_rows.shape else None
    name = _row_name(first, tokens)
    if row is not None and bool(np.isneginf(row).all()):
        unmasked = 0 if masked is None else int(np.count_nonzero(~masked[first]))
        if unmasked:
            return (f"{name} has every score -inf, {unmasked} of them not written by the mask "
                    f"(scores that overflowed float32 before it): its softmax is 0/0 = NaN{more}")
        return (f"{name} has every key blocked: its softmax is 0/0 = NaN{more}; a mask must "
                "leave each query at least one key (itself, in causal attention)")
    if row is not None and bool(np.isnan(row).any()):
        return f"{name} is NaN: the scores softmax read already held NaN{more}"
    if row is not None and bool(np.isposinf(row).any()):
        return (f"{name} is NaN: a score of +inf makes exp overflow, and inf/inf = NaN{more}")
    return f"{name} is NaN{more}"


def weights_words(weights: np.ndarray, tokens: tuple[str, ...] = ()) -> str | None:
    """The softmax explanation's sentence about row sums when the rows do not all sum to 1
    (an all-blocked row's NaN, a sink or a dropped column's share): what these weights hold,
    or None when every row sums to 1."""
    if not weights.size:
        return None
    with np.errstate(invalid="ignore"):
        sums = weights.sum(axis=-1, dtype=np.float64)
    nan_rows = np.isnan(sums)
    finite = sums[~nan_rows]
    if not nan_rows.any() and (finite.size == 0 or np.abs(finite - 1).max() < 1e-5):
        return None
    text = ("Softmax along each row turns scores into attention weights: every entry is in "
            "[0, 1]")
    if finite.size and np.abs(finite - 1).max() >= 1e-5:
        text += (f". Here the rows sum to {finite.min():.4f} to {finite.max():.4f}, not all "
                 "to 1: part of each row's weight went to entries not shown here (a sink, or "
                 "a column taken off after softmax)")
    else:
        text += " and every row with a key to look at sums to 1"
    if nan_rows.any():
        at = tuple(int(i) for i in np.argwhere(nan_rows)[0])
        text += (f"; {_row_name(at, tokens)} is NaN: with every key blocked, softmax divides "
                 "0 by 0")
    return text + ". Row t says how much token t takes from each token."


# The note on a softmax no mask ran before (cross-attention says its own instead: cross.py).
UNMASKED_SELF = ("No mask was applied: every token sees every token, later ones included "
                 "(bidirectional attention, as in an encoder such as BERT).")


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    first = m.op(unit.ops[0])
    values, snap = m.four_d(unit, BHTT)
    groups = m.per_head_ops(unit)
    masked = None
    if m.b.per_head and len(groups) > 1:
        before = np.stack([m.snap(m.x_in(grp[0])).values for grp in groups],
                                 axis=m.b.head_axis)
    else:
        ref = m.x_in(first)
        before = m.b.out_4d([ref.op], BHTT)[0] if ref.op is not None else m.snap(ref).values
        masked = written_upstream(m.g, ref)
    checks = softmax_checks(values, before, masked, m.b.config.tokens)
    config = m.b.config  # what each head is for, from these weights (mha_tui.roles)
    checks += role_checks(values, config.ids, config.model.layer if config.model else 0)
    ops = [m.op(i) for i in unit.ops]
    sums = [op for op in ops if op.name == "sum"]
    by_hand = any(op.name == "exp" for op in ops) and bool(sums)
    told = sums[0] if by_hand else first  # the op whose axis the rows are taken along
    dim = told.kwarg("dim", told.kwarg("axis", next((a for a in told.scalars()
                                                     if isinstance(a, int)), -1)))
    if dim not in (-1, values.ndim - 1, snap.ndim - 1):
        checks.append(Check(f"softmax over {'axis' if by_hand else 'dim'}={dim}, not the last "
                            f"axis: rows do not sum to 1", False))
    name_op = ops[-1] if by_hand else first
    rec = m.b.record(m.tensor_name(name_op, fallback="weights"), snap,
                        BHTT if values.ndim == 4 else None, values=values, kind="prob",
                        caption="row: query token · column: key token it takes from")
    note = "" if "mask" in m.made else UNMASKED_SELF
    if "scale" not in m.made and scaled_inside(m.g) is None and m.s.d_h:
        note = " ".join(filter(None, [note, (
            f"Nothing scaled these scores: softmax takes Q·Kᵀ as it is, not divided by "
            f"√d_h = {math.sqrt(m.s.d_h):.4g} (d_h = {m.s.d_h}).")]))
    explanation = None
    if by_hand:
        stable = any(op.name == "sub" for op in ops)
        lines = len({(op.source.file, op.source.line) for op in ops})
        checks.append(Check(f"written by hand ({plural(lines, 'line')}): "
                            f"{'subtract the row maximum, ' if stable else ''}exp, divide by the "
                            f"row sum; recognised from those ops as one softmax", None))
        checks.append(Check(f"the row maximum is subtracted before exp (no overflow): "
                            f"{yes(stable)}", None))
        explanation = (words("softmax")[1] + " Here softmax is written out by hand: "
                       + ("exp(s - max(s)) / sum(exp(s - max(s))) along each row. Subtracting "
                          "the row maximum changes nothing in the result and keeps exp from "
                          "overflowing." if stable else "exp(s) / sum(exp(s)) along each row."))
    if explanation is None:
        explanation = weights_words(values, m.b.config.tokens)
    tensors = [rec]
    cast = None if m.b.per_head else _rounded(m, unit, first)
    if cast is not None:  # a bfloat16 model's softmax in float32, then `.to(query.dtype)`
        cast_values, cast_snap = m.b.out_4d([cast.index], BHTT)
        tensors.append(m.b.record(
            f"{m.tensor_name(cast, fallback='weights')} ({cast.out.dtype})", cast_snap,
            BHTT if cast_values.ndim == 4 else None, values=cast_values, kind="prob",
            caption=f"the weights rounded to {cast.out.dtype}: what the module passes on"))
        moved = float(np.abs(cast_values.astype(np.float64) - values).max()) if values.size else 0.0
        checks.append(Check(f"softmax computed in {first.out.dtype}, then rounded to "
                            f"{cast.out.dtype}: the largest weight moved by {moved:.2e}", None))
    return m.stage(unit, stage_id, "softmax", tensors, checks, shape_in=before.shape,
                      shape_out=values.shape, dims_in=rec.dims, dims_out=rec.dims, note=note,
                      explanation=explanation)


_CASTS = {"to", "type", "type_as", "half", "bfloat16"}


def _rounded(m: StageMaker, unit: Unit, softmax_op: OpRecord) -> OpRecord | None:
    """The cast of the softmax's weights to half precision that the stage holds (Llama's
    `softmax(..., dtype=torch.float32).to(query.dtype)`), or None."""
    found = None
    for i in sorted({*unit.helpers, *unit.folded}):
        op = m.op(i)
        if i > softmax_op.index and op.name in _CASTS and op.outputs and op.out.dtype in HALF \
                and op.out.dtype != softmax_op.out.dtype and op.out.shape == softmax_op.out.shape:
            found = op
    return found


def softmax_checks(weights: np.ndarray, before: np.ndarray,
                   masked: np.ndarray | None = None,
                   tokens: tuple[str, ...] = ()) -> list[Check]:
    """Rows sum to 1; every masked entry gets weight 0. masked: the entries the mask op
    wrote a mask value into (an added -10000 leaves a score above -1e4), else those holding
    -inf or a large negative such as finfo.min or -1e9 (a mask that fills -3.4e38 blocks as
    surely as -inf)."""
    with np.errstate(invalid="ignore"):
        sums = weights.sum(axis=-1, dtype=weights.dtype) if weights.size else np.zeros(0)
    nan_rows = np.isnan(sums)
    finite = np.abs(sums[~nan_rows] - 1)
    deviation = float(finite.max()) if finite.size else 0.0
    p = precision()  # bfloat16 weights: each rounded by up to 2^-9 of itself
    half = p.dtype in HALF
    rows = "every other row" if nan_rows.any() else "every row"
    checks = [Check(f"{rows} sums to 1 (largest deviation {deviation:.2e}"
                    + (f", {p.words()})" if half else ")"),
                    deviation < (p.rtol if half else 1e-5))]
    if nan_rows.any():
        wrote = masked.reshape(before.shape) if masked is not None and \
            masked.size == before.size else None
        checks.insert(0, Check(nan_words(nan_rows, before, tokens, wrote), False))
    if before.shape == weights.shape:
        blocked = before <= LARGE_NEGATIVE if before.dtype.kind == "f" else np.isneginf(before)
        if masked is not None and masked.size == blocked.size:
            blocked = blocked | masked.reshape(blocked.shape)
        if nan_rows.any() and nan_rows.shape == blocked.shape[:-1]:
            blocked = blocked & ~nan_rows[..., None]  # an all-blocked row is said above
        n_blocked = int(np.count_nonzero(blocked))
        if n_blocked:
            n_zero = int(np.count_nonzero((weights == 0) & blocked))  # without indexing
            checks.append(Check(f"{n_zero} of {n_blocked} masked entries are exactly 0"
                                + (" (in the rows that are not NaN)" if nan_rows.any() else ""),
                                n_zero == n_blocked))
    return checks


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    rows = []
    for stage in j.trace.stages:
        if stage.kind != "softmax" or j.is_sdpa(stage):
            continue
        ops = j.main_ops(stage, SOFTMAXES)
        if not ops:
            continue
        op = ops[0]
        logits = j.tokens_last(f64(j.g.snap(j.g.x_inputs(op)[0]).values))
        got = j.tokens_last(f64(op.out.values))
        good, d = close(got, softmax_of(logits, -1), 1.0)
        diag = None
        if not good:
            diag = _softmax_diagnosis(j, logits, got)
        rows.append(j.row(stage, "softmax", good, d,
                             "each query's row normalised over the keys",
                             source=op.source, diagnosis=diag))
    return rows


def _softmax_diagnosis(j: Judge, logits: np.ndarray, got: np.ndarray) -> tuple[str, str]:
    names = {logits.ndim - 2: "the query axis: every column sums to 1",
             logits.ndim - 3: "the head axis: the heads' weights for one entry sum to 1",
             0: "the batch axis"}
    for axis in range(logits.ndim - 1):
        if np.allclose(got, softmax_of(logits, axis), equal_nan=True, **tolerance(atol=ATOL, rtol=RTOL)):
            dim = axis - logits.ndim
            return "softmax_wrong_axis", (f"softmax over the wrong axis (dim={dim}, "
                                          f"{names.get(axis, 'axis ' + str(axis))}): each "
                                          "query's row must be normalised over the keys, "
                                          "dim=-1")
    sums = got.sum(axis=-1)
    return "softmax_wrong", (f"the weights are not a softmax of the scores over the keys "
                             f"(row sums range {np.nanmin(sums):.4f} to {np.nanmax(sums):.4f})")


def why(cell: Cell) -> Why:
    """A weight: exp(s_ij - max) / Σ_k exp(s_ik - max), with the row's numbers."""
    ops = cell.ops("softmax", "_softmax")
    unshifted = False  # exp(s) / sum, no max subtracted: exp's input is the score itself
    if not ops and cell.ops("exp"):  # NumPy: exp(s - max(s)) / sum, the row's max op first
        ops = cell.ops("max", "amax")
        if not ops:
            ops, unshifted = cell.ops("exp"), True
    op, index = cell.per_head(ops)
    scores = cell.operand(op, 0)
    axis = _axis(op, scores.ndim)
    cell_at = index  # the cell in the scores' coordinates
    if op.name in ("max", "amax"):  # its output is (T, 1): the cell's row, not its column
        index = (*index[:-1], 0)
    *lead, i, _ = index
    notes = ["the module's exp has no max subtracted (exp(s) / Σ exp(s)); mha-tui subtracts "
             "it, which gives the same number"] if unshifted else []
    dropouts = cell.ops("dropout", "dropout_")
    if dropouts:
        p = dropouts[0].kwarg("p", dropouts[0].args[1] if len(dropouts[0].args) > 1 else None)
        training = dropouts[0].kwarg("training", None)
        notes.append(f"then dropout (p={p}, training={training}): "
                     + ("it changes nothing here" if training is False or p == 0
                        else "it can zero or rescale this weight"))
    if axis != scores.ndim - 1:  # a softmax over another axis (dim=-2: down a column)
        return _across(cell, scores, cell_at, axis, tuple(notes))
    notes += _role_notes(cell)
    return softmax_why(cell, scores[(*lead, i)], tuple(notes))


def _role_notes(cell: Cell) -> list[str]:
    """The head scores (mha_tui.roles) this weight is an entry of."""
    config, head = cell.trace.config, cell.head
    roles = roles_of(cell.record.values, config.ids, config.model.layer if config.model else 0)
    if not roles or len(cell.index) < 2:
        return []
    role = roles[head if head is not None and head < len(roles) else 0]
    return role_notes(role, cell.index[-2], cell.index[-1])


def _axis(op: OpRecord, ndim: int) -> int:
    """The axis the softmax (or NumPy's row max before exp) normalises over, from 0."""
    if op.name in ("max", "amax"):
        axis = op.kwarg("axis", op.args[1] if len(op.args) > 1 else -1)
    else:
        axis = op.kwarg("dim", op.args[1] if len(op.args) > 1 else -1)
    return int(axis) % ndim if isinstance(axis, int) and ndim else max(ndim - 1, 0)


def _across(cell: Cell, scores: np.ndarray, index: tuple[int, ...], axis: int,
            notes: tuple[str, ...]) -> Why:
    """A weight of a softmax over another axis than the keys: exp(s - max) / Σ exp(s - max)
    along that axis (the query axis: down the cell's column), a term per position on it."""
    values = scores[(*index[:axis], slice(None), *index[axis + 1:])].astype(np.float64)
    p = index[axis]
    queries = axis == scores.ndim - 2
    what = "query axis" if queries else f"axis {axis}"
    j = cell.index[-1]
    at = (lambda k: f"s[{k}, {j}]") if queries else (lambda k: f"s[{axis}={k}]")
    terms, top, computed = _weight_terms(
        values, p, (lambda k: f"query {cell.token(k)}") if queries else (lambda k: f"position {k}"),
        at, "column" if queries else what)
    said = [f"this softmax runs over the {what} (dim {axis - scores.ndim}), not over the keys: "
            + (f"down column {j}, a term per query, so each column of weights sums to 1, not "
               f"each row" if queries else f"a term per position along axis {axis}"),
            f"the largest of these scores, max = {top:.6g}, is subtracted first (the result is "
            "the same; exp cannot overflow)"]
    if np.isneginf(values).all():
        said[1] = "every score here is blocked (-inf): exp(-inf - (-inf)) is undefined: NaN"
    return Why(cell.stage.id, "softmax", cell.record.name, cell.index, where(cell),
               f"{cell.name} = exp({at(p)} - max_k {at('k')}) / Σ_k exp({at('k')} - max)",
               tuple(terms), (*said, *notes), computed, cell.recorded)


def _weight_terms(values: np.ndarray, p: int, label: Callable[[int], str],
                  at: Callable[[object], str], over: str) -> tuple[list[Term], float, float]:
    """One softmax weight's terms along the axis it normalises: exp(v_k - max) for each k,
    their sum Σ, and exp(v_p - max) / Σ; with the max and the weight."""
    top = float(np.max(values))
    with np.errstate(invalid="ignore"):
        exps = np.exp(values - top)
    total = float(exps.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        computed = float(exps[p] / total)
    terms = [Term(f"{label(k)}: exp({at(k)} - max)", ("exp(", float(values[k]), "-", top, ")"),
                  float(exps[k])) for k in range(len(values))]
    terms.append(Term(f"Σ over the {over}", (), total))
    terms.append(Term(f"exp({at(p)} - max) / Σ", (float(exps[p]), "/", total), computed))
    return terms, top, computed


def softmax_why(cell: Cell, scores: np.ndarray, notes: tuple[str, ...] = ()) -> Why:
    """The arithmetic of one weight, whoever computed the row of scores: exp(s_ij - max) /
    Σ_k exp(s_ik - max), a term per key."""
    *_, i, j = cell.index
    row = scores.astype(np.float64)
    terms, top, computed = _weight_terms(row, j, lambda k: f"key {cell.key_token(k)}",
                                         lambda k: f"s[{i}, {k}]", "row")
    said = [f"the row's largest score, max = {top:.6g}, is subtracted first (the result is "
            "the same; exp cannot overflow)"]
    if np.isneginf(row).all():
        said = ["every key of this row is blocked (-inf): exp(-inf - (-inf)) is undefined, "
                "so the whole row is NaN; no key is left to attend to"]
    elif np.isneginf(row).any():
        said.append("a blocked (-inf) score gives exp(-inf) = 0: no weight")
    return Why(cell.stage.id, "softmax", cell.record.name, cell.index, where(cell),
               f"{cell.name} = exp(s[{i}, {j}] - max_k s[{i}, k]) / Σ_k exp(s[{i}, k] - max)",
               tuple(terms), (*said, *notes), computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """What a row of weights sums to, and which key the last query weighs most in head 1."""
    if not stage.tensors or len(stage.tensors[-1].shape) < 2:
        return ()
    record = stage.tensors[-1]
    head = head_of_interest(record)
    i = last_query(trace, record)
    row_index = cell_index(record, head=head, row=i)[:-1]
    row = record.values[row_index].astype(np.float64)
    total = float(row.sum())
    spot = ", ".join(map(str, row_index))
    questions = [Question(stage.id, "row_sum", f"What does row {i} of head {head}'s weights "
                          f"(query {token_name(trace, i)}) sum to?", "number", total,
                          number_text(total), f"Σ_j {record.name}[{spot}, j] over "
                          f"{recorded(stage, 'row')} = {total:.6g} (summed by mha-tui): softmax "
                          "makes every row sum to 1")]
    if np.isfinite(row).all() and row.size > 1:
        top = tuple(int(j) for j in np.flatnonzero(row == row.max()))  # a tie: any of them
        questions.append(Question(
            stage.id, "most_attended", f"In head {head}, which "
            f"{'context token' if trace.config.cross else 'token'} does query "
            f"{token_name(trace, i)} (row {i}) attend to most?",
            "key" if trace.config.cross else "token", top,
            " or ".join(f"{key_name(trace, j)} (position {j})" for j in top),
            f"the largest weight in {recorded(stage, 'row')} {record.name}[{spot}, :] is "
            f"{row[top[0]]:.4f}, at key {' and '.join(map(str, top))}"))
    return (*questions, *_role_question(stage, trace))


# The label asked about first: the mechanism a trained model is shown for.
ASKED_ROLES = ("induction", "previous-token", "duplicate-token", "first-token", "current-token")


def _role_question(stage: Stage, trace: Trace) -> list[Question]:
    """Which head of this layer earns a label (the induction head, if one does), from its
    scores on these very weights (mha_tui.roles)."""
    record = stage.tensors[-1]
    config = trace.config
    if config.cross or config.batch:
        # A head's role reads positions of one sequence (the previous token, the first):
        # across two sequences it means nothing, and a padded row's pad queries would skew it.
        return []
    roles = roles_of(record.values, config.ids, config.model.layer if config.model else 0)
    if len(roles) < 2:
        return []
    for kind in ASKED_ROLES:
        best = find(roles, kind)
        if best is None:
            continue
        score = best.score(kind)
        scores = ", ".join(f"head {role.head} {role.score(kind).value:.3f}" for role in roles)
        return [Question(stage.id, "head_role", f"Which head (0 to {len(roles) - 1}) of this layer "
                         f"is the {kind} head: the one with the highest {kind} score "
                         f"({score.formula}, at least 0.5)?", "integer", best.head,
                         f"head {best.head}", f"{kind} scores from {record.name}: {scores}")]
    return []
