"""How to draw: the options the app changes with keys and the transcripts leave at their
defaults, and the tool's own glyphs with their ASCII stand-ins (`--ascii`).
Never import torch, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass

# The tool's own one-cell glyphs and their one-cell ASCII stand-ins (alignment survives).
ASCII_GLYPHS = str.maketrans({"·": ".", "━": "-", "─": "-", "⋮": ":", "✓": "+", "✗": "x",
                              "…": "~", "→": ">", "␛": "^"})


@dataclass(frozen=True)
class RenderOptions:
    """How to draw; the app changes these with keys, the transcript uses the defaults."""

    decimals: int = 4
    numbers: bool = True
    color: bool = True
    focus: int | None = None
    max_rows: int = 12
    max_cols: int = 10
    max_heads: int = 4
    full: bool = False
    ascii: bool = False
    wrong_view: bool = False
    width: int | None = None
    # The app's drill-down: the tensor (by name) the cursor is on and its index there.
    cursor: tuple[str, tuple[int, ...]] | None = None
    explain: bool = True  # the app folds the explanation away on short terminals
    # A padded batch (--batch): the batch row drawn (the app's key moves it); None draws
    # every row one after the other (the transcripts).
    row: int | None = None
