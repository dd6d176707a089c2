"""A stage's source line(s): wrapped at Python's own break points (`wrap_code`) and
highlighted (`Code`), the same in the app and the transcripts.
Never import torch, textual or typer here.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.text import Text

_OPEN, _CLOSE = "([{", ")]}"
_ATOMIC = 1 << 16  # the "depth" of a space inside a string or a comment: a break of last resort


_STUB = 4  # a break this close to its bracket's end leaves a stub such as "2)" on a line


def _breaks(line: str) -> list[tuple[int, int]]:
    """Where a line of Python may wrap: (index of the token that would start the next line,
    how bad a break it is). Spaces between tokens only. The badness is the bracket depth
    there; a break that leaves a stub ("2)") or falls inside a string or a comment (each
    one token) is worse than any other."""
    breaks: list[tuple[int, int]] = []
    depth, quote, comment = 0, "", False
    open_at: list[int] = []  # breaks waiting for their bracket to close
    for i, ch in enumerate(line):
        if i and line[i - 1] == " " and ch != " " and line[:i].strip():
            breaks.append((i, _ATOMIC if quote or comment else depth))
            if not (quote or comment) and depth:
                open_at.append(len(breaks) - 1)
        if comment:
            continue
        if quote:
            if ch == quote and line[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            for k in [k for k in open_at if breaks[k][1] == depth]:
                open_at.remove(k)
                if i - breaks[k][0] < _STUB:
                    breaks[k] = (breaks[k][0], _ATOMIC // 2 + depth)
            depth = max(0, depth - 1)
    return breaks


def wrap_code(code: str, width: int, indent: int = 4) -> str:
    """Code lines that fit in width, broken between tokens, never inside a comment or string
    when another break fits: among the breaks that fill at least half the line, the fewest
    open brackets first (a trailing `# (B, h, T, d_h)` moves whole to its own line), then
    as late as the width allows. A continuation is
    indented `indent` more than its line. A token wider than the line is cut as a last resort."""
    out: list[str] = []
    for line in code.splitlines():
        lead = len(line) - len(line.lstrip(" "))
        pad = " " * min(lead + indent, max(0, width // 2))
        breaks = _breaks(line)
        start, prefix = 0, ""
        while cell_len(prefix + line[start:]) > width:
            room = width - len(prefix)
            fits = [(i, d, cell_len(line[start:i].rstrip())) for i, d in breaks if start < i]
            fits = [(i, d, n) for i, d, n in fits if 0 < n <= room]
            if fits:
                # Never inside a comment or string, nor before a stub, if anything else fits;
                # then a break that fills at least half the line ("q =" alone reads worse
                # than a break inside the call's brackets); then the fewest open brackets;
                # then the latest.
                end = min(fits, key=lambda b: (b[1] >= _ATOMIC // 2, b[1] >= _ATOMIC,
                                               2 * b[2] < room, b[1], -b[0]))[0]
            else:
                end = start + max(1, room)  # one unbreakable token wider than the line
            out.append(prefix + line[start:end].rstrip())
            start, prefix = end, pad
            while start < len(line) and line[start] == " ":
                start += 1
        out.append(prefix + line[start:])
    return "\n".join(out)


class Code:
    """PyTorch line(s): highlighted on a colour console, plain text on a plain one; wrapped
    between tokens (wrap_code) to the width they are given.

    Plain consoles (the default transcript) would get the same characters from Syntax;
    skipping it spares loading Pygments' lexer, a fifth of a transcript's run time.
    """

    def __init__(self, code: str, *, highlight: bool = True) -> None:
        self.code = code
        self.highlight = highlight

    def _renderable(self, console: Console, width: int) -> RenderableType:
        code = wrap_code(self.code, width)
        if not self.highlight or console.no_color or console.color_system is None:
            return Text(code, no_wrap=True, overflow="crop")
        from rich.syntax import Syntax  # Pygments costs ~0.1 s to import: only when used

        # Token colours only, no background: the code sits on whatever panel holds it.
        text = Syntax(code, "python", theme="monokai").highlight(code)
        text.rstrip()
        return text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, Text(self.code))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._renderable(console, options.max_width)


def code_block(code: str) -> Padding:
    """The stage's PyTorch line(s), indented under the word "code"."""
    return Padding(Code(code), (0, 0, 0, 2))
