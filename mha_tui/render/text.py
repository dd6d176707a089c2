"""User text made safe: every control, format and lone-surrogate character made visible
(`printable`), and a token cut to a label's width without splitting an escape (`label`).

Tokens, file names and source lines are the learner's text: they reach a terminal or a
transcript only through here, and enter Rich only as `Text`, never as markup.
Never import torch, textual or typer here.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

LABEL_CELLS = 12


# ---------------------------------------------------------------- user text, made safe

_KEEP_FORMAT = {0x200C, 0x200D}  # ZWNJ, ZWJ: part of scripts and emoji sequences


def _stand_in(ch: str) -> str:
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # Unicode Control Pictures: ESC -> ␛
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _visible(ch: str) -> str:
    category = unicodedata.category(ch)
    if category in ("Cc", "Cs") or (
        category == "Cf" and ord(ch) not in _KEEP_FORMAT and not 0xE0000 <= ord(ch) <= 0xE007F
    ):
        return _stand_in(ch)
    return ch


@lru_cache(maxsize=4096)
def printable(text: str) -> str:
    """User text with every control, format and lone-surrogate character made visible.

    Neither Rich nor Textual strips ESC; this is the one gate tokens pass on their way to
    a terminal or a transcript.
    """
    return "".join(_visible(ch) for ch in text)


@lru_cache(maxsize=4096)
def _units(text: str, ascii_only: bool) -> tuple[str, ...]:
    """The shown text of each character: a stand-in such as `\\x9b` is one unit, never split."""
    units = (_visible(ch) for ch in text)
    if ascii_only:
        units = (u.encode("ascii", "backslashreplace").decode("ascii") for u in units)
    return tuple(units)


def label(text: str, max_cells: int = LABEL_CELLS, *, ascii_only: bool = False,
          style: Style | str = "") -> Text:
    """A token as a label: literal, safe, at most max_cells wide (ellipsis when cut).

    A cut falls between characters as shown: an escape such as `\\u202e` is kept whole or
    left out whole, never cut in the middle.
    """
    units = _units(text, ascii_only)
    safe = "".join(units)
    if cell_len(safe) > max_cells:
        kept, used = [], 0
        for unit in units:
            width = cell_len(unit)
            if used + width > max_cells - 1:
                break
            kept.append(unit)
            used += width
        safe = "".join(kept) + ("~" if ascii_only else "…")
    return Text(safe, style=style, no_wrap=True, end="")
