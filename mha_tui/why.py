"""Why this number? How one cell of a stage's result was made from the numbers before it.

For a cell of a stage's main tensor (its last: the stage's result), the stage kind's module
(`kinds/<kind>.py`, its `why`) recomputes the value from what the forward
recorded, step by step, with the real values, and sets it beside the module's own number.
Everything in a Why is computed by mha-tui, never by the module, and says so; the module's
number is read, never recomputed. Plain data out: the app and the CLI draw it with
`render.why.why_view`.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from .kinds import sdpa
from .kinds._parts.cell import Cell, Term, Why, WhyError, expanded_from, main_tensor
from .kinds.registry import FORWARD
from .ops.numeric import HALF
from .records import Trace

__all__ = ["KINDS", "Term", "Why", "WhyError", "main_tensor", "parse_cell", "why"]

KINDS: dict[str, Callable[[Cell], Why]] = {
    row.kind: row.why for row in FORWARD if row.why is not None
}
"""Stage kind -> its module's why: the kinds whose cells mha-tui explains."""


def parse_cell(text: str) -> tuple[str, tuple[int, ...]]:
    """`softmax[0, 1, 2, 1]` -> ("softmax", (0, 1, 2, 1))."""
    match = re.fullmatch(r"\s*([A-Za-z_][\w.-]*)\s*\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*,?\s*\]\s*", text)
    if match is None:
        raise WhyError(f"--why takes STAGE[i, j, ...], e.g. \"softmax[0, 1, 2, 1]\"; got {text!r}")
    return match.group(1), tuple(int(n) for n in match.group(2).split(","))


def why(trace: Trace, stage_id: str, index: tuple[int, ...]) -> Why:
    """How the cell `index` of the stage's main tensor was made."""
    try:
        stage = trace.stage(stage_id)
    except KeyError:
        raise WhyError(f"no stage {stage_id!r}; this trace has: "
                       f"{', '.join(s.id for s in trace.stages)}") from None
    record = main_tensor(stage)
    shape = record.values.shape
    if len(index) != len(shape) or not all(0 <= i < n for i, n in zip(index, shape, strict=True)):
        raise WhyError(f"{stage.id}[{', '.join(map(str, index))}] is outside {record.name}, "
                       f"shape ({', '.join(map(str, shape))}): give {len(shape)} indices, each "
                       "from 0 to its size - 1")
    # scores ... attend expanded from one fused F.scaled_dot_product_attention: sdpa explains
    # them, with the same arithmetic as the kinds' own why
    explain = sdpa.expansion_why if expanded_from(stage) is not None else KINDS.get(stage.kind)
    if explain is None:
        raise WhyError(f"mha-tui does not explain the cells of a {stage.kind!r} stage yet; it "
                       f"does for: {', '.join(KINDS)}")
    try:
        made = explain(Cell(trace, stage, record, index))
        # a bfloat16 or float16 module: the cell's number is one, and its rounding is allowed
        return replace(made, dtype=record.dtype) if record.dtype in HALF else made
    except WhyError:
        raise
    except (IndexError, KeyError, TypeError, ValueError) as error:
        # a layout no kind's why expected (a stage whose ops hold its numbers in another
        # order): one line in the panel and on stderr, never a traceback or a crashed app
        raise WhyError(f"mha-tui cannot explain {record.name}[{', '.join(map(str, index))}] "
                       f"of stage {stage.id} yet ({type(error).__name__}: {error})") from error
