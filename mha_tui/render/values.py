"""Colours and numbers as printed: the head colours, the value ramps a cell is coloured
with (one scale per tensor, from its largest finite value) and one value's text.
Never import torch, textual or typer here.
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import TYPE_CHECKING

from rich.color import Color
from rich.style import Style

from ..records import TensorRecord

if TYPE_CHECKING:
    import numpy as np  # NumPy arrives with torch; the app's first frame must not wait for it


# Tableau 10: distinguishable, and readable on dark and light backgrounds.
HEAD_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1",
               "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac")
NEUTRAL = (32, 32, 36)
NEGATIVE = (59, 111, 217)
POSITIVE = (217, 75, 59)
PROBABILITY = (44, 162, 95)
STEPS = 16


# ---------------------------------------------------------------- colours


def _blend(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> Color:
    return Color.from_rgb(*(round(x + (y - x) * t) for x, y in zip(a, b, strict=True)))


def _ramp(target: tuple[int, int, int], fg: str) -> tuple[Style, ...]:
    return tuple(Style(color=fg, bgcolor=_blend(NEUTRAL, target, i / (STEPS - 1)))
                 for i in range(STEPS))


RAMPS = {
    "neg": _ramp(NEGATIVE, "#f4f4f4"),
    "pos": _ramp(POSITIVE, "#f4f4f4"),
    "prob": _ramp(PROBABILITY, "#f4f4f4"),
}
DIM_STYLE = Style(color="#6c6c6c")
INF_STYLE = Style(color="#9a9a9a", italic=True)


def head_style(head: int, dim: bool = False) -> Style:
    return _head_style(head % len(HEAD_COLORS), dim)


@cache
def _head_style(colour: int, dim: bool) -> Style:
    """One Style per colour (a Style is never changed once made; --full labels thousands)."""
    return Style(color="#6c6c6c" if dim else HEAD_COLORS[colour], bold=not dim)


@lru_cache(maxsize=256)
def magnitude(record: TensorRecord) -> float:
    """Largest finite |value| of the whole tensor: one colour scale for every head."""
    import numpy as np

    values = record.values
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    return float(np.abs(finite).max()) if finite.size else 1.0


LARGE = 1e6  # from here on a value is written in scientific notation


def format_value(value: float, kind: str, decimals: int) -> str:
    """One value as printed: whole, never a signed zero ("-0.0000" is "0.0000")."""
    if kind == "int":
        return str(int(value))
    if LARGE <= abs(value) < float("inf"):
        return f"{value:.2e}"  # a mask's finfo.min would be 40 digits wide
    text = f"{value:.{decimals}f}"  # nan, inf and -inf come out as themselves
    if text[0] == "-" and not text.strip("-0."):
        return text[1:]
    return text


def format_column(values: np.ndarray, kind: str, decimals: int) -> list[str]:
    """A column's values formatted at once (--full writes millions)."""
    if kind == "int":
        return [str(int(v)) for v in values.tolist()]
    spec = f".{decimals}f"
    if values.dtype.kind != "f":  # complex, object: value by value
        out = [format(v, ".2e" if LARGE <= abs(v) < float("inf") else spec) for v in values.tolist()]
        for i, text in enumerate(out):
            if text[0] == "-" and not text.strip("-0."):
                out[i] = text[1:]
        return out
    # Floats, as format_value writes them, with NumPy finding the few values that need more
    # than the plain format (--full writes millions): the large ones, and the negative ones
    # closer to zero than twice the last decimal's unit (and -0.0), a superset of those that
    # can print as a signed zero. The plain format is one `%` for the whole column: the same
    # correctly rounded text as format(), without a call per value.
    import numpy as np  # here, not at the top: the app's first frame does not wait for it

    numbers = values.tolist()
    out = (f"%{spec}\n" * len(numbers) % tuple(numbers)).split("\n")[:-1]
    large = np.isfinite(values) & (np.abs(values) >= np.float64(LARGE))
    for i in np.flatnonzero(large).tolist():
        out[i] = format(numbers[i], ".2e")
    for i in np.flatnonzero(np.signbit(values) & (values > -2 * 10.0 ** -decimals)).tolist():
        text = out[i]
        if text[0] == "-" and not text.strip("-0."):
            out[i] = text[1:]
    return out
