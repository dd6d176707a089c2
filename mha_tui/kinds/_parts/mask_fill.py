"""mask: what a mask op writes into the entries it blocks, read from its arguments, and the
stage's claim that every blocked entry holds it.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...ops.vocab import LARGE_NEGATIVE
from ...records import Check, OpRecord

if TYPE_CHECKING:
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
    fill = fill_of(m, groups[0][0]) if groups and groups[0] else None
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
            expected = before + np.asarray(number, dtype=values.dtype)
            label = "hold the score plus the mask's {number:.3g}"
        else:
            expected = np.asarray(number, dtype=values.dtype)
            label = ("are exactly -inf" if number == -np.inf else
                     "hold the fill value {number:.3g}")
        n_ok = int(np.count_nonzero(blocked & (values == expected)))
    return Check(f"{n_ok} of {n_total} entries {where} " + label.format(number=number),
                 n_ok == n_total)


def fill_of(m: StageMaker, op: OpRecord) -> tuple[str, float] | None:
    """What the mask op puts in a blocked entry, read from its arguments: ("value", F) when
    masked_fill or where writes one number F, ("added", V) when an added mask holds one mask
    value V (subtracted: -V); None when the arguments do not say one number."""
    how = op.name.rstrip("_")
    others = [m.snap(r).values for r in m.g.other_inputs(op)]
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
