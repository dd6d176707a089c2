"""mask's why: how one masked score was made, kept or blocked and why (masked_fill, an
added mask, torch.where, baddbmm's mask), and the arithmetic sdpa's expansion shares
(added_why, masked_why). Split from mask.py, which re-exports `why`.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math

import numpy as np

from ...ops.vocab import LARGE_NEGATIVE
from ...records import OpRecord, TensorArg
from ..scores import baddbmm_factors
from .cell import Cell, Term, Why, WhyError, where


def why(cell: Cell) -> Why:
    """A masked score: kept or blocked, why, and the value written."""
    if not cell.stage.ops:  # --no-causal: the module's mask lines did not run
        return _skipped(cell)
    # baddbmm(mask, q, k^T): the masked scores themselves (the masked_fill_ before it
    # only builds the mask)
    op, index = cell.per_head(cell.ops("baddbmm") or cell.ops(
        "masked_fill", "masked_fill_", "add", "add_", "where", "sub"))
    if op.name == "baddbmm":
        return _baddbmm_why(cell, op, index)
    if op.name == "where":
        return _where_why(cell, op, index)
    before = float(cell.operand(op, 0)[index])
    out_shape = op.out.shape
    *_, i, j = index
    if op.name.startswith("masked_fill"):
        own = cell.operand(op, 1)
        mask = np.broadcast_to(own, out_shape)
        blocked = bool(mask[index])
        fill = cell.scalar(op)
        computed = fill if blocked else before
        # the entry as the mask itself is indexed: [i, j] of a (T, T) mask, [b, 0, 0, j] of
        # a padding mask broadcast from (B, 1, 1, T)
        spot = ", ".join(map(str, _own_index(index, own.shape))) if own.ndim > 2 else f"{i}, {j}"
        terms = (Term("score before the mask", (), before),
                 Term(f"mask[{spot}] = {blocked}: "
                      + ("written over with the fill value" if blocked else "kept"), (), computed))
        return masked_why(cell, terms, computed, blocked, f"the mask's entry [{spot}] is {blocked}")
    if op.name.startswith(("add", "sub")):
        added = float(np.broadcast_to(cell.operand(op, 1), out_shape)[index])
        return added_why(cell, before, added, adds=op.name.startswith("add"))
    raise WhyError(f"stage {cell.stage.id}: a {op.name} mask is not explained yet")


def _own_index(index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """Where a cell of a broadcast result reads a tensor of `shape` (NumPy's broadcasting)."""
    tail = index[len(index) - len(shape):]
    return tuple(0 if n == 1 else k for k, n in zip(tail, shape, strict=True))


def _where_why(cell: Cell, op: OpRecord, index: tuple[int, ...]) -> Why:
    """torch.where(mask, scores, fill) keeps the score where the mask is True and writes the
    fill elsewhere; torch.where(mask, fill, scores) the other way round."""
    shape = op.out.shape

    def at(arg: object) -> float | None:
        """The argument's number at the cell (a tensor broadcast, or a plain number)."""
        if isinstance(arg, TensorArg):
            return float(np.broadcast_to(cell.operand(op, arg.index), shape)[index])
        return float(arg) if isinstance(arg, int | float) else None

    def many(arg: object) -> bool:
        return isinstance(arg, TensorArg) and cell.operand(op, arg.index).size > 1

    def scores(arg: object) -> bool:
        """The argument holds the stage before's numbers (one score: a single token and head)."""
        before = _before(cell)
        return isinstance(arg, TensorArg) and before is not None and before.shape == shape and \
            np.array_equal(np.broadcast_to(cell.operand(op, arg.index), shape), before,
                           equal_nan=True)

    if len(op.args) >= 3 and many(op.args[1]) != many(op.args[2]):
        keep_when = many(op.args[1])  # where(mask, scores, fill): True keeps the score
    elif len(op.args) >= 3 and scores(op.args[1]) != scores(op.args[2]):
        keep_when = scores(op.args[1])  # one number each (one token, one head): by the values
    else:
        raise WhyError(f"stage {cell.stage.id}: cannot tell the scores from the fill value in "
                       f"its torch.where")
    before, fill = (at(op.args[1]), at(op.args[2])) if keep_when else (at(op.args[2]),
                                                                         at(op.args[1]))
    if before is None or fill is None:
        raise WhyError(f"stage {cell.stage.id}: cannot read its torch.where's arguments")
    condition = bool(np.broadcast_to(cell.operand(op, 0), shape)[index])
    blocked = condition != keep_when
    computed = fill if blocked else before
    *_, i, j = index
    terms = (Term("score before the mask", (), before),
             Term(f"mask[{i}, {j}] = {condition}: "
                  + ("replaced by the fill value" if blocked else "kept"), (), computed))
    return masked_why(cell, terms, computed, blocked,
                      f"the mask's entry [{i}, {j}] is {condition} (torch.where keeps the score "
                      f"where it is {keep_when})")


def _before(cell: Cell) -> np.ndarray | None:
    """The main tensor of the stage before this one (the scores the mask is given)."""
    ids = [s.id for s in cell.trace.stages]
    at = ids.index(cell.stage.id)
    if at == 0 or not cell.trace.stages[at - 1].tensors:
        return None
    return cell.trace.stages[at - 1].tensors[-1].values


def _skipped(cell: Cell) -> Why:
    """--no-causal (mask.add_skipped_mask): no mask ran; the score is the one before, read."""
    before = _before(cell)
    if before is None or before.shape != cell.record.values.shape:
        raise WhyError(f"stage {cell.stage.id} holds no op to explain {cell.name} by")
    previous = cell.trace.stages[[s.id for s in cell.trace.stages].index(cell.stage.id) - 1]
    computed = float(before[cell.index])
    at = ", ".join(map(str, cell.index))
    return Why(cell.stage.id, "mask", cell.record.name, cell.index, where(cell),
               f"{cell.name} = {previous.id}'s {previous.tensors[-1].name}[{at}]  (no mask ran)",
               (Term(f"the {previous.id} stage's number", (), computed),),
               ("no mask was applied (--no-causal): the module's masking lines did not run, "
                "so every key is kept and this score goes on to softmax unchanged",
                "read, not computed"), computed, cell.recorded)


def _baddbmm_why(cell: Cell, op: OpRecord, index: tuple[int, ...]) -> Why:
    """torch.baddbmm(mask, q, k^T) (nn.MultiheadAttention): the product and the mask in one
    call; the score before the mask is computed by mha-tui from the call's q and k^T."""
    *lead, i, j = index
    alpha, beta = baddbmm_factors(op)
    q, k_t = cell.operand(op, 1), cell.operand(op, 2)
    before = alpha * float(np.dot(q[(*lead, i)].astype(np.float64),
                                  k_t[(*lead, slice(None), j)].astype(np.float64)))
    added = beta * float(np.broadcast_to(cell.operand(op, 0), op.out.shape)[index])
    return added_why(cell, before, added, notes=(
        "torch.baddbmm(mask, q, k^T) adds the mask to q @ k^T in one call: the score before "
        "the mask is computed by mha-tui from the call's q and k^T (the scores stage above, "
        "mha-tui's expansion); the result is the module's own",))


def added_why(cell: Cell, before: float, added: float, adds: bool = True, name: str = "mask",
              notes: tuple[str, ...] = ()) -> Why:
    """The arithmetic of an additive mask, whoever computed its inputs: the score plus (or
    minus) the mask's entry, blocked where that is -inf (or -1e9 and below)."""
    *_, i, j = cell.index
    computed = before + added if adds else before - added
    # blocked: what the mask wrote here is a mask value (-inf, -1e4 and below), whatever
    # the sum came to (-10000 added to a score of 0.7 is -9999.3)
    blocked = math.isinf(computed) or (added if adds else -added) <= LARGE_NEGATIVE
    terms = (Term("score before the mask", (), before),
             Term(f"{'+' if adds else '-'} {name}[{i}, {j}]",
                  (before, "+" if adds else "-", added), computed))
    entry = (f"the mask's entry [{i}, {j}] is {added:g}" if name == "mask"
             else f"{name}[{i}, {j}] is {added:g}")
    return masked_why(cell, terms, computed, blocked, entry, notes)


def masked_why(cell: Cell, terms: tuple[Term, ...], computed: float, blocked: bool, entry: str,
               notes: tuple[str, ...] = ()) -> Why:
    """Kept or blocked, and why: a causal rule (j > i) or another."""
    *_, i, j = cell.index
    if blocked and cell.padded_key(j):
        reason = (f"key {cell.key_token(j)} (position {j}) is padding in batch row "
                  f"{cell.index[0]}: the padding mask blocks it for every query"
                  + (", and it comes after the query (j > i)" if j > i and cell.trace.config.causal
                     else ""))
    elif blocked:
        reason = (f"key {cell.key_token(j)} (position {j}) comes after query {cell.token(i)} "
                  f"(position {i}): j > i, and a causal mask hides the future"
                  if j > i else f"blocked although j <= i ({entry}): not a causal rule")
    else:
        reason = (f"key position {j} <= query position {i}: the query may look at it"
                  if j <= i else f"kept although j > i ({entry}): this mask is not causal")
    return Why(cell.stage.id, "mask", cell.record.name, cell.index, where(cell),
               f"{cell.name}: {'blocked' if blocked else 'kept'}", terms, (reason, entry, *notes),
               computed, cell.recorded)
