"""mask: what a mask op writes into the entries it blocks, read from its arguments, and the
stage's claim that every blocked entry holds it.

A mask is what the mask op wrote (the tensor it added, the positions it filled), never a
threshold on its result: `scores + (1 - tril) * -10000.0` (BERT, Hugging Face) leaves a
blocked score at -9999.3 or -10000.8 depending on the score's sign, but the entries it
blocks are the ones where the added tensor holds -10000.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...ops.numeric import rounded
from ...ops.vocab import LARGE_NEGATIVE, MASK_OPS
from ...records import Check, OpRecord, Ref, TensorArg

if TYPE_CHECKING:
    from ...ops.graph import Graph
    from .maker import StageMaker


def fill_value(op: OpRecord) -> float | None:
    """masked_fill's value, given by keyword or as the first number among its arguments."""
    value = op.kwarg("value")
    if value is None:
        numbers = [a for a in op.scalars() if isinstance(a, int | float) and not isinstance(a, bool)]
        value = numbers[0] if numbers else None
    return float(value) if isinstance(value, int | float) else None


def fill_check(m: StageMaker, groups: list[list[OpRecord]], values: np.ndarray,
                before: np.ndarray, blocked: np.ndarray, n_total: int, n_inf: int,
                where: str) -> Check:
    """The claim that every blocked entry holds what the mask op writes there: its fill value
    (masked_fill, where), or the score plus the additive mask's value; a plain count when the
    op does not say one number, or when nothing is blocked."""
    if not n_total:
        return Check("the mask blocks no entry (none holds -1e4 or below)", None)
    chain = [op for op in groups[0] if op.name in MASK_OPS] if len(groups) == 1 else []
    if len(chain) > 1:
        return _chain_check(m.g, chain, values, before, blocked, n_total, where)
    fill = fill_of(m.g, groups[0][0]) if groups and groups[0] else None
    if fill is None:
        return Check(f"{n_inf} of {n_total} entries {where} are exactly -inf" if n_inf else
                     f"{n_total} entries {where} hold a large negative number "
                     f"({float(values[blocked].max()):.3g})", None)
    how, number = fill
    with np.errstate(over="ignore", invalid="ignore"):
        if how == "added" and number != -np.inf:
            if before.shape != values.shape:
                return Check(f"{n_total} entries {where} hold the score plus the mask's "
                             f"{number:.3g}", None)
            subtracted = groups[0][0].name.startswith("sub")
            expected = before - np.asarray(-number, dtype=values.dtype) if subtracted else \
                before + np.asarray(number, dtype=values.dtype)
            label = ("hold the score minus the mask's {minus:.3g}" if subtracted else
                     "hold the score plus the mask's {number:.3g}")
        else:
            expected = np.asarray(number, dtype=values.dtype)
            label = ("are exactly -inf" if number == -np.inf else
                     "hold the fill value {number:.3g}")
        # a bfloat16 or float16 op rounds its result to its dtype: so does the expectation
        expected = rounded(expected, groups[0][0].out.dtype) if values.dtype == np.float32 \
            else expected
        n_ok = int(np.count_nonzero(blocked & (values == expected)))
    return Check(f"{n_ok} of {n_total} entries {where} " + label.format(number=number,
                                                                         minus=-number),
                 n_ok == n_total)


def _chain_check(g: Graph, chain: list[OpRecord], values: np.ndarray, before: np.ndarray,
                 blocked: np.ndarray, n_total: int, where: str) -> Check:
    """Two mask ops one after the other (GPT-Neo's local layer: torch.where with its window's
    fill, then the added causal mask): each blocked entry holds what the ops wrote there, in
    their order (a fill, then the added mask's value on top of it). Replayed from the ops'
    own arguments; a plain count when one of them does not say what it writes."""
    said = []
    expected = before
    with np.errstate(over="ignore", invalid="ignore"):
        for op in chain:
            fill, mark = fill_of(g, op), written(g, op)
            if fill is None or mark is None or expected.shape != values.shape or \
                    mark.shape != values.shape:
                return Check(f"{n_total} entries {where} hold a mask value, written by "
                             f"{len(chain)} ops", None)
            how, number = fill
            if how == "value":
                expected = np.where(mark, np.asarray(number, dtype=values.dtype), expected)
            else:  # the added (subtracted) tensor, as the op adds it
                added = np.asarray(g.snap(g.other_inputs(op)[0]).values, dtype=values.dtype)
                expected = expected - added if op.name.startswith("sub") else expected + added
            said.append(f"{op.name.rstrip('_')} {'writes' if how == 'value' else 'adds'} "
                        f"{number:.3g}")
        n_ok = int(np.count_nonzero(blocked & (values == expected)))
    return Check(f"{n_ok} of {n_total} entries {where} hold what the {len(chain)} mask ops "
                 f"wrote, in order ({'; '.join(said)})", n_ok == n_total)


def fill_of(g: Graph, op: OpRecord) -> tuple[str, float] | None:
    """What the mask op puts in a blocked entry, read from its arguments: ("value", F) when
    masked_fill or where writes one number F, ("added", V) when an added mask holds one mask
    value V (subtracted: -V); None when the arguments do not say one number."""
    how = op.name.rstrip("_")
    others = [g.snap(r).values for r in g.other_inputs(op)]
    if how == "masked_fill":
        value = fill_value(op)
        scalars = [v for v in others if v.size == 1 and v.dtype.kind == "f"]
        if value is None and scalars:
            value = float(scalars[0].reshape(-1)[0])
        return ("value", value) if value is not None else None
    if how == "where":
        numbers = [float(a) for a in op.scalars() if isinstance(a, int | float)
                   and not isinstance(a, bool)]
        fills = [v for v in others if v.dtype.kind == "f" and v.size]
        if numbers:
            return "value", numbers[0]
        if fills and bool((fills[0] == fills[0].reshape(-1)[0]).all()):
            return "value", float(fills[0].reshape(-1)[0])
        return None
    if how in {"add", "sub"} and others and others[0].dtype.kind == "f":
        sign = -1.0 if how == "sub" else 1.0
        masked = sign * others[0][sign * others[0] <= LARGE_NEGATIVE]
        if masked.size and bool((masked == masked[0]).all()):
            return "added", float(masked[0])
    return None


def written(g: Graph, op: OpRecord) -> np.ndarray | None:
    """The entries of the op's output that the mask op wrote a mask value into (-inf, -1e4
    and below), broadcast to its output's shape: where the added tensor holds one (the
    subtracted tensor its negative; baddbmm's added bias), where masked_fill's condition is
    True and its value is one, where torch.where takes a mask value instead of the scores.
    None when the op does not say (both operands made from x, a fill that is no mask value)."""
    how = op.name.rstrip("_")
    shape = op.out.shape
    mark: np.ndarray | None = None
    if how in {"add", "sub"}:
        others = [r for r in op.inputs if not g.is_x(r)]
        if len(others) != 1 or len(op.inputs) != 2:
            return None
        added = np.asarray(g.snap(others[0]).values)
        if added.dtype.kind != "f":
            return None
        mark = (-added if how == "sub" else added) <= LARGE_NEGATIVE
    elif how == "baddbmm":
        operands = g.tensor_operands(op)
        if not operands or g.is_x(operands[0]):
            return None
        beta = op.kwarg("beta", 1)
        bias = np.asarray(g.snap(operands[0]).values)
        if bias.dtype.kind != "f" or not isinstance(beta, int | float) or beta <= 0:
            return None
        mark = bias <= LARGE_NEGATIVE
    elif how == "masked_fill":
        conditions = [r for r in op.inputs if g.snap(r).dtype == "bool"]
        value = fill_value(op)
        if value is None:
            scalars = [np.asarray(g.snap(r).values) for r in op.inputs
                       if not g.is_x(r) and g.snap(r).values.size == 1 and g.snap(r).dtype != "bool"]
            value = float(scalars[0].reshape(-1)[0]) if scalars else None
        if len(conditions) != 1 or value is None or value > LARGE_NEGATIVE:
            return None
        mark = np.asarray(g.snap(conditions[0]).values)
    elif how == "where":
        mark = _where_written(g, op)
    if mark is None:
        return None
    try:
        return np.broadcast_to(mark, shape)
    except ValueError:
        return None


# Ops after the mask that keep every entry where it is (and a blocked one blocked): a scale
# by a positive number, a dtype change, a copy.
_KEEPS_PLACES = {"div", "mul", "div_", "mul_", "true_divide", "to", "float", "type_as",
                 "contiguous", "clone", "detach", "double", "half"}


def written_upstream(g: Graph, ref: Ref) -> np.ndarray | None:
    """The entries of `ref` a mask op wrote a mask value into (mask_fill.written), followed
    from the mask op to ref through ops that keep every entry in place (a later scale, a
    dtype change): what softmax receives blocked. None when no mask op is found so."""
    shape = g.snap(ref).shape
    for _ in range(8):
        op = g.producer(ref)
        if op is None:
            return None
        if g.kind.get(op.index) == "mask":
            mark = written(g, op)
            return mark if mark is not None and mark.shape == shape else None
        xs = g.x_inputs(op)
        if op.name not in _KEEPS_PLACES or len(xs) != 1 or g.snap(xs[0]).shape != shape:
            return None
        ref = xs[0]
    return None


def _where_written(g: Graph, op: OpRecord) -> np.ndarray | None:
    """torch.where(cond, scores, fill) writes the fill where cond is False; where(cond,
    fill, scores) where it is True: a mask value there is a blocked entry."""
    if len(op.args) < 3 or not isinstance(op.args[0], TensorArg):
        return None
    condition = np.asarray(g.snap(op.inputs[op.args[0].index]).values)
    if condition.dtype != bool:
        return None

    def scores(arg: object) -> bool:
        return isinstance(arg, TensorArg) and g.is_x(op.inputs[arg.index])

    def fill(arg: object) -> np.ndarray | None:
        if isinstance(arg, TensorArg):
            return np.asarray(g.snap(op.inputs[arg.index]).values)
        return np.asarray(float(arg)) if isinstance(arg, int | float) else None

    kept, other = op.args[1], op.args[2]
    if scores(kept) and not scores(other):
        values, takes = fill(other), ~condition
    elif scores(other) and not scores(kept):
        values, takes = fill(kept), condition
    else:
        return None
    if values is None or values.dtype.kind not in "fi":
        return None
    return takes & (values <= LARGE_NEGATIVE)
