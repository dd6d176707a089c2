"""User text made safe: every control, format and lone-surrogate character made visible
(`printable`), and a token cut to a label's width without splitting an escape (`label`).

Tokens, file names and source lines are the learner's text: they reach a terminal or a
transcript only through here, and enter Rich only as `Text`, never as markup.
Never import torch, textual or typer here.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rich.cells import cell_len
from rich.measure import Measurement
from rich.style import Style
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.containers import Lines

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
    if ch == "\ufe0f":
        # VARIATION SELECTOR-16 asks for an emoji's picture: Rich counts `❤️` 2 cells wide,
        # tmux 3.3 and many terminals draw it in 1, and every column after it shifts. Without
        # it, `❤` is 1 cell for Rich and the terminal alike (an emoji already 2 wide stays so).
        return ""
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


# ---------------------------------------------------------------- figures kept whole

FIGURES = re.compile(r"[\w.]*\[[-\d:, ]*\d[-\d:, ]*\]|\(\d+(?:, \d+)*,?\)")
"""What a line never breaks inside: an index (`scores[0, 1, 3, 0]`, `[0, :, 1]`) and a
shape (`(1, 2, 4, 2)`)."""

_GLUE = "\ue000\ue001\ue002\ue003"  # private use: one cell, not whitespace to Rich


class Unbroken:
    """Text that wraps only outside its figures (`FIGURES`, and whatever the patterns given
    match, such as `largest, 0`): at a width too narrow for the whole line, an index or a number moves
    to the next line whole, with the words it is glued to.

    Rich wraps a Text at every space (`Text.wrap`); here the spaces inside a kept span stand
    in for a character Rich does not break at while it wraps, and are spaces again in every
    line it returns. A span wider than the whole width is folded, as Rich folds a long word.
    A renderable of its own, not a Text: `Console.print` joins the Texts it is given into one.
    """

    def __init__(self, text: Text, *patterns: str | re.Pattern[str]) -> None:
        self.text = text
        self.kept = [m.span() for pattern in (FIGURES, *patterns)
                     for m in re.finditer(pattern, text.plain)]

    def _glued(self, glue: str) -> str:
        chars = list(self.text.plain)
        for start, end in self.kept:
            for k in range(start, end):
                if chars[k] == " ":
                    chars[k] = glue
        return "".join(chars)

    def wrap(self, console: Console, width: int, **kwargs: Any) -> Lines:
        """The lines `Text.wrap` gives, with no kept span split between two of them."""
        glue = next((ch for ch in _GLUE if ch not in self.text.plain), None)
        if not self.kept or glue is None:
            return self.text.wrap(console, width, **kwargs)
        glued = self.text.copy()
        glued.plain = self._glued(glue)  # the same length: the styles stay where they were
        lines = glued.wrap(console, width, **kwargs)
        for line in lines:
            line.plain = line.plain.replace(glue, " ")
        return lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text = self.text  # as Text.__rich_console__ lays itself out
        lines = self.wrap(console, options.max_width,
                          justify=text.justify or options.justify or "default",
                          overflow=text.overflow or options.overflow or "fold",
                          tab_size=text.tab_size or console.tab_size or 8,
                          no_wrap=bool(options.no_wrap if text.no_wrap is None else text.no_wrap))
        yield from Text("\n").join(lines).render(console, end=text.end)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = Measurement.get(console, options, self.text).maximum
        units = self._glued("\0").split()
        return Measurement(max((cell_len(u) for u in units), default=widest), widest)


def unbroken(text: Text | str, *patterns: str | re.Pattern[str], style: Style | str = ""
             ) -> Unbroken:
    """text as `Unbroken`: its indices, shapes and what the patterns match never split by a
    wrap."""
    return Unbroken(text if isinstance(text, Text) else Text(text, style=style), *patterns)
