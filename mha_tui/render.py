"""How a stage and its tensors are drawn: pure Rich renderables, shared by app and transcript.

Everything the learner reads is built here, once, so the TUI and `--dump` cannot drift
apart. Values are formatted from the recorded arrays; nothing is recomputed. Only the
visible window of a tensor is formatted, so cost follows the screen, not the tensor.
User text (tokens) enters only as `Text`, after `printable()`, never as markup.
Never import torch, textual or typer here.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from rich import box
from rich.cells import cell_len
from rich.color import Color
from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.rule import Rule
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from .config import Config
from .records import Check, ModuleInfo, Stage, TensorRecord, Trace
from .stages import StageInfo

if TYPE_CHECKING:
    from .why import Why

if TYPE_CHECKING:  # NumPy arrives with torch; the app's first frame must not wait for it
    import numpy as np

# Tableau 10: distinguishable, and readable on dark and light backgrounds.
HEAD_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1",
               "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac")
_NEUTRAL = (32, 32, 36)
_NEGATIVE = (59, 111, 217)
_POSITIVE = (217, 75, 59)
_PROBABILITY = (44, 162, 95)
_STEPS = 16
LABEL_CELLS = 12
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


# ---------------------------------------------------------------- colours


def _blend(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> Color:
    return Color.from_rgb(*(round(x + (y - x) * t) for x, y in zip(a, b, strict=True)))


def _ramp(target: tuple[int, int, int], fg: str) -> tuple[Style, ...]:
    return tuple(Style(color=fg, bgcolor=_blend(_NEUTRAL, target, i / (_STEPS - 1)))
                 for i in range(_STEPS))


_RAMPS = {
    "neg": _ramp(_NEGATIVE, "#f4f4f4"),
    "pos": _ramp(_POSITIVE, "#f4f4f4"),
    "prob": _ramp(_PROBABILITY, "#f4f4f4"),
}
_DIM = Style(color="#6c6c6c")
_INF = Style(color="#9a9a9a", italic=True)


def head_style(head: int, dim: bool = False) -> Style:
    return Style(color="#6c6c6c" if dim else HEAD_COLORS[head % len(HEAD_COLORS)], bold=not dim)


@lru_cache(maxsize=256)
def _magnitude(record: TensorRecord) -> float:
    """Largest finite |value| of the whole tensor: one colour scale for every head."""
    import numpy as np

    values = record.values
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    return float(np.abs(finite).max()) if finite.size else 1.0


LARGE = 1e6  # from here on a value is written in scientific notation


def _fmt(value: float, kind: str, decimals: int) -> str:
    """One value as printed: whole, never a signed zero ("-0.0000" is "0.0000")."""
    if kind == "int":
        return str(int(value))
    if LARGE <= abs(value) < float("inf"):
        return f"{value:.2e}"  # a mask's finfo.min would be 40 digits wide
    text = f"{value:.{decimals}f}"  # nan, inf and -inf come out as themselves
    if text[0] == "-" and not text.strip("-0."):
        return text[1:]
    return text


def _fmt_column(values: np.ndarray, kind: str, decimals: int) -> list[str]:
    """A column's values formatted at once (a list comprehension: fast enough for --full)."""
    if kind == "int":
        return [str(int(v)) for v in values.tolist()]
    spec = f".{decimals}f"
    out = [format(v, ".2e" if LARGE <= abs(v) < float("inf") else spec) for v in values.tolist()]
    for i, text in enumerate(out):
        if text[0] == "-" and not text.strip("-0."):
            out[i] = text[1:]
    return out


# ---------------------------------------------------------------- one matrix


def _window(n: int, limit: int, full: bool) -> list[int | None]:
    """Indices to draw along an axis of length n: all, or both ends around a gap (None)."""
    if full or n <= limit:
        return list(range(n))
    head = (limit + 1) // 2
    tail = limit - head
    return [*range(head), None, *range(n - tail, n)]


@dataclass(frozen=True)
class Axis:
    """Labels along one side of a matrix, and which head (if any) owns each entry."""

    labels: Sequence[str]
    heads: Sequence[int] | None = None
    literal: bool = False  # labels are user text (tokens): truncate and sanitise
    sub: Sequence[str] | None = None  # a second header line (e.g. the head of a channel)
    # Token positions: a repeated token, or every token of an elided axis, shows its index.
    positions: bool = False


_GAP = 2  # blanks between two columns


@dataclass(frozen=True)
class _Cell:
    text: str
    style: Style | str
    cells: int  # terminal cells (tokens may hold wide characters)


class Matrix:
    """A 2-D slice drawn as a labelled table: values and/or colour, elided to a window.

    A number is printed whole or its column is left out (the gap column says how many),
    never cut: the columns shown are chosen from the width the matrix is given and the
    widest formatted cell. With `full`, every column is shown, in blocks that fit the
    width ("columns 0-7 of 16"), the way torch and NumPy print wide arrays. Lines are
    built as segments directly: a table of half a million numbers takes about a second.
    """

    def __init__(self, values: np.ndarray, record: TensorRecord, rows: Axis, cols: Axis,
                 title: Text | None, opts: RenderOptions, head: int | None = None) -> None:
        self.values, self.record, self.rows, self.cols = values, record, rows, cols
        self.title, self.opts, self.head = title, opts, head
        n_rows = values.shape[0]
        self.row_idx = _window(n_rows, opts.max_rows, opts.full)
        self._shown_rows = [i for i in self.row_idx if i is not None]
        # Numbers stay whenever colour cannot stand in for them (no colour, integer ids).
        self.numbers = opts.numbers or not opts.color or record.kind == "int"
        self._columns: dict[int, list[str]] = {}
        self._drawn: dict[tuple[int, bool], list[str | list[Segment]]] = {}
        self._headers: dict[tuple[int, bool], list[_Cell]] = {}
        self._layouts: dict[int, list[list[int | None]]] = {}
        self._row_labels: list[_Cell] | None = None
        # The app's drill-down: ((row, column) of the cursor or None, the matrix's number
        # in the click action); None outside it.
        self.drill: tuple[tuple[int, int] | None, int] | None = None

    # ------------------------------------------------------------ labels and cells

    def _dim(self, head: int | None) -> bool:
        return self.opts.focus is not None and head is not None and head != self.opts.focus

    def _label_style(self, axis: Axis, i: int) -> Style:
        if self._dim(self.head):
            return _DIM
        head = self.head if axis.heads is None else axis.heads[i]
        owned = axis.heads is not None
        return head_style(head, self._dim(head)) if owned and head is not None else Style(bold=True)

    def _repeated(self, axis: Axis) -> set[str]:
        seen: set[str] = set()
        repeated: set[str] = set()
        for text in axis.labels:
            (repeated if text in seen else seen).add(text)
        return repeated

    def _axis_labels(self, axis: Axis, indices: Sequence[int], elided: bool) -> list[_Cell]:
        repeated = self._repeated(axis) if axis.positions else set()
        dot = "." if self.opts.ascii else "·"
        out = []
        for i in indices:
            style = self._label_style(axis, i)
            if axis.literal:
                suffix = (f"{dot}{i}" if axis.positions and (elided or axis.labels[i] in repeated)
                          else "")
                text = label(axis.labels[i], max(1, LABEL_CELLS - len(suffix)),
                             ascii_only=self.opts.ascii).plain + suffix
                out.append(_Cell(text, style, cell_len(text)))
            else:
                out.append(_Cell(axis.labels[i], style, cell_len(axis.labels[i])))
        return out

    def _row_label_cells(self) -> list[_Cell]:
        if self._row_labels is None:
            elided = None in self.row_idx
            self._row_labels = self._axis_labels(self.rows, self._shown_rows, elided)
        return self._row_labels

    def _header(self, j: int, elided: bool) -> list[_Cell]:
        """The header line(s) of column j: its label, and its sub-label if the axis has one."""
        key = (j, elided)
        if key not in self._headers:
            cells = self._axis_labels(self.cols, [j], elided)
            if self.cols.sub is not None:
                sub = self.cols.sub[j]
                cells.append(_Cell(sub, cells[0].style, cell_len(sub)))
            self._headers[key] = cells
        return self._headers[key]

    def _texts(self, j: int) -> list[str]:
        """Column j's shown values, formatted once."""
        texts = self._columns.get(j)
        if texts is None:
            values = self.values[self._shown_rows, j]
            texts = (_fmt_column(values, self.record.kind, self.opts.decimals) if self.numbers
                     else ["   "] * len(values))
            self._columns[j] = texts
        return texts

    def _styles(self, j: int) -> list[Style | None]:
        """Column j's cell styles: the value's colour, dimmed outside the focused head.

        Probabilities on the green ramp from 0 to 1; other values blue (negative) or red
        (positive) by |value| over the tensor's largest finite |value|, so every head shares
        one scale; -inf/nan grey italic. Steps computed for the whole column at once.
        """
        import numpy as np

        record, opts = self.record, self.opts
        col_head = None if self.cols.heads is None else self.cols.heads[j]
        dims = [False] * len(self._shown_rows)
        if opts.focus is not None:
            row_heads = self.rows.heads
            for k, i in enumerate(self._shown_rows):
                row_head = None if row_heads is None else row_heads[i]
                head = (self.head if self.head is not None
                        else row_head if row_head is not None else col_head)
                dims[k] = self._dim(head)
        if not opts.color or record.kind == "int":
            return [_DIM if dim else None for dim in dims]
        values = self.values[self._shown_rows, j].astype(np.float64)
        finite = np.isfinite(values)
        safe = np.where(finite, values, 0.0)
        if record.kind == "prob":
            t = safe
        else:
            t = np.abs(safe) / (_magnitude(record) or 1.0)
        steps = np.clip(np.rint(t * (_STEPS - 1)), 0, _STEPS - 1).astype(np.int64).tolist()
        ramps = ([_RAMPS["prob"]] * len(steps) if record.kind == "prob"
                 else [_RAMPS["neg"] if v < 0 else _RAMPS["pos"] for v in safe.tolist()])
        return [_INF if not ok else ramp[step // 4 if dim else step]
                for ok, ramp, step, dim in zip(finite.tolist(), ramps, steps, dims, strict=True)]

    def _width(self, j: int, elided: bool) -> int:
        return max(max(map(len, self._texts(j)), default=0),
                   max(c.cells for c in self._header(j, elided)))

    def _gap_header(self, hidden: int) -> str:
        return f"+{hidden}"

    # ------------------------------------------------------------ choosing columns

    def _layout(self, width: int) -> list[list[int | None]]:
        """Blocks of column indices (None: the gap) that fit in width."""
        if width in self._layouts:
            return self._layouts[width]
        n = self.values.shape[1]
        label_width = max((c.cells for c in self._row_label_cells()), default=0)
        room = width - label_width
        blocks: list[list[int | None]]
        if self.opts.full:
            blocks, block, used = [], [], 0
            for j in range(n):
                need = _GAP + self._width(j, False)
                if block and used + need > room:
                    blocks.append(block)
                    block, used = [], 0
                block.append(j)
                used += need
            blocks.append(block)
        else:
            candidates = [j for j in _window(n, self.opts.max_cols, False) if j is not None]
            best: list[int | None] = candidates[:1] + ([None] if n > 1 else [])
            # Adding a column to an elided window only widens it, so the first k that does
            # not fit ends the search; but every column shown needs neither the gap column
            # nor the positions an elided axis adds to its tokens (`love·1`), so with narrow
            # cells (numbers off, few decimals) all n can fit where n - 1 did not.
            def window(k: int) -> tuple[list[int | None], int]:
                """The first k candidates (both ends), and the cells they take."""
                chosen = candidates[:(k + 1) // 2] + (candidates[-(k // 2):] if k // 2 else [])
                if k == n:
                    return list(chosen), sum(_GAP + self._width(j, False) for j in chosen)
                gap = len("..." if self.opts.ascii else "…")
                return ([*chosen[:(k + 1) // 2], None, *chosen[(k + 1) // 2:]],
                        _GAP + max(gap, len(self._gap_header(n - k)))
                        + sum(_GAP + self._width(j, True) for j in chosen))

            for k in range(1, len(candidates) + 1):
                cols, used = window(k)
                if used > room and k > 1:
                    if k < n == len(candidates):
                        every, used = window(n)
                        if used <= room:
                            best = every
                    break
                best = cols
            blocks = [best]
        self._layouts[width] = blocks
        return blocks

    def shown(self, width: int) -> tuple[int, int]:
        """How many rows and columns are drawn at this width."""
        return len(self._shown_rows), sum(j is not None for b in self._layout(width) for j in b)

    # ------------------------------------------------------------ drawing

    def _block(self, block: list[int | None], color: bool) -> list[str | list[Segment]]:
        """One block: header line(s), rule, rows; plain strings unless drawn in colour."""
        n = self.values.shape[1]
        hidden = n - sum(j is not None for j in block)
        elided = hidden > 0
        gap = "..." if self.opts.ascii else "…"
        vgap = ":" if self.opts.ascii else "⋮"
        labels = self._row_label_cells()
        gap_header = _Cell(self._gap_header(hidden), _DIM, len(self._gap_header(hidden)))
        headers = [[gap_header] if j is None else self._header(j, elided) for j in block]
        texts = [[gap] * len(labels) if j is None else self._texts(j) for j in block]
        label_width = max((c.cells for c in labels), default=0)
        widths = [max(max(map(len, col), default=1), *(c.cells for c in head))
                  for col, head in zip(texts, headers, strict=True)]
        total = label_width + sum(_GAP + w for w in widths)
        blank = _Cell("", "", 0)
        header_lines = [[h[k] if k < len(h) else blank for h in headers]
                        for k in range(max(len(h) for h in headers))]
        rule = ("-" if self.opts.ascii else "─") * total
        out: list[str | list[Segment]] = []
        if not color:
            sep = " " * _GAP
            for cells in header_lines:
                out.append(" " * label_width + "".join(
                    sep + " " * (w - c.cells) + c.text for w, c in zip(widths, cells, strict=True)))
            out.append(rule)
            r = 0
            for i in self.row_idx:
                if i is None:
                    out.append(vgap.rjust(label_width) + "".join(sep + vgap.rjust(w) for w in widths))
                    continue
                cell = labels[r]
                out.append(" " * (label_width - cell.cells) + cell.text + "".join(
                    sep + col[r].rjust(w) for w, col in zip(widths, texts, strict=True)))
                r += 1
            return out
        styles = [[_DIM] * len(labels) if j is None else self._styles(j) for j in block]
        for cells in header_lines:
            line = [Segment(" " * label_width)]
            for w, c in zip(widths, cells, strict=True):
                line += [Segment(" " * (_GAP + w - c.cells)), Segment(c.text, c.style or None)]
            out.append(line)
        out.append([Segment(rule)])
        r = 0
        for i in self.row_idx:
            if i is None:
                out.append([Segment(vgap.rjust(label_width) + "".join(
                    " " * _GAP + vgap.rjust(w) for w in widths))])
                continue
            cell = labels[r]
            line = [Segment(" " * (label_width - cell.cells)), Segment(cell.text, cell.style or None)]
            for j, w, col, sty in zip(block, widths, texts, styles, strict=True):
                style = sty[r]
                if j is not None and self.drill is not None:
                    style = self._drilled(style, i, j)
                line += [Segment(" " * (_GAP + w - len(col[r]))), Segment(col[r], style)]
            out.append(line)
            r += 1
        return out

    def _drilled(self, style: Style | None, i: int, j: int) -> Style | None:
        """In the app's drill-down: the cursor's cell reversed; every cell a click target."""
        assert self.drill is not None
        cursor, target = self.drill
        click = Style(meta={"@click": f"app.cursor_to({target}, {i}, {j})"})
        if cursor == (i, j):
            click += Style(reverse=True, bold=True, underline=True)
        return (style or Style()) + click

    def _lines(self, width: int, color: bool) -> list[str | list[Segment]]:
        key = (width, color)
        if key in self._drawn:
            return self._drawn[key]
        out: list[str | list[Segment]] = []
        blocks = self._layout(width)
        for number, block in enumerate(blocks):
            if len(blocks) > 1:
                if number:
                    out.append("")
                caption = f"columns {block[0]}-{block[-1]} of {self.values.shape[1]}"
                out.append([Segment(caption, Style(dim=True))] if color else caption)
            out.extend(self._block(block, color))
        self._drawn[key] = out
        return out

    def _natural_width(self, width: int) -> int:
        lines = self._lines(width, False)
        table = max((cell_len(line) for line in lines if isinstance(line, str)), default=0)
        return max(table, self.title.cell_len if self.title is not None else 0)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        width = min(self._natural_width(options.max_width), options.max_width)
        return Measurement(width, width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.title is not None:
            yield self.title
        color = not (console.no_color or console.color_system is None)
        newline = Segment.line()
        for line in self._lines(width, color):
            if isinstance(line, str):  # one segment per line: what makes --full fast
                yield Segment(line)
            else:
                yield from line
            yield newline
        rows, cols = self.shown(width)
        n_rows, n_cols = self.values.shape
        if rows < n_rows or cols < n_cols:
            yield _summary(self.values, self.record, n_rows, n_cols, rows, cols, self.opts,
                           width)
        elif len(self._layout(width)) > 1:
            yield newline  # column blocks: a blank line before the next head's title


def _summary(values: np.ndarray, record: TensorRecord, n_rows: int, n_cols: int,
             shown_rows: int, shown_cols: int, opts: RenderOptions,
             width: int | None = None) -> Text:
    """What the window leaves out: how much is hidden, and the range of every value.

    Its parts go on as few lines of width as they fit, a part never broken in two.
    """
    import numpy as np

    rows = f"{shown_rows} of {n_rows} row{'s' if n_rows > 1 else ''}"
    cols = f"{shown_cols} of {n_cols} column{'s' if n_cols > 1 else ''}"
    # (separator before, words that stay together): " · " between facts, "  " within one
    pieces = [("", f"showing {rows},"), (" ", cols)]
    if record.kind == "int":
        pieces += [(" · ", f"min {int(values.min())}"), ("  ", f"max {int(values.max())}")]
    else:
        finite = values[np.isfinite(values)]
        if finite.size:
            d = opts.decimals
            stats = [f"min {_fmt(float(finite.min()), 'signed', d)}",
                     f"max {_fmt(float(finite.max()), 'signed', d)}",
                     f"mean {_fmt(float(finite.mean(dtype=np.float64)), 'signed', d)}"]
            if finite.size < values.size:
                stats[0] = "finite values: " + stats[0]
            pieces += [(" · ", stats[0]), ("  ", stats[1]), ("  ", stats[2])]
        counts = [(int(np.isneginf(values).sum()), "-inf"), (int(np.isposinf(values).sum()), "inf"),
                  (int(np.isnan(values).sum()), "nan")]
        pieces += [(" · ", f"{count} {'is' if count == 1 else 'are'} {name}")
                   for count, name in counts if count]
    lines = ["  " + pieces[0][1]]
    for sep, words in pieces[1:]:
        if width is None or len(lines[-1]) + len(sep) + len(words) <= width:
            lines[-1] += sep + words
        else:
            lines.append("  " + words)
    return Text("\n".join(lines), style="dim")


# ---------------------------------------------------------------- one tensor


def _channel_axis(n: int, d_h: int | None, prefix: str = "c") -> Axis:
    if d_h is None:
        return Axis([f"{prefix}{c}" for c in range(n)])
    heads = [c // d_h for c in range(n)]
    return Axis([f"{prefix}{c}" for c in range(n)], heads=heads, sub=[f"h{h}" for h in heads])


def _token_axis(config: Config, tags: Sequence[str] | None = None,
                tag_heads: Sequence[int] | None = None) -> Axis:
    if tags is not None:  # rows that are not tokens (the wrong view): already unambiguous
        return Axis(list(tags), heads=tag_heads, literal=True)
    return Axis(list(config.tokens), literal=True, positions=True)


def _head_title(record: TensorRecord, head: int, opts: RenderOptions, batched: bool = True) -> Text:
    dim = opts.focus is not None and head != opts.focus
    # The index that selects this matrix from the tensor: batch 0, head `head`.
    return Text.assemble((f"head {head}", head_style(head, dim)),
                         (f"  {record.name}[0, {head}]" if batched else f"  {record.name}[{head}]",
                          _DIM if dim else "dim"))


# Dims of a tensor with no batch axis (NumPy's (T, C)): drawn as the batched layout's one
# batch entry, labelled without the B.
_UNBATCHED = {("T",), ("T", "C"), ("T", "h", "d_h"), ("h", "T", "d_h"), ("h", "T", "T")}


def _heads_shown(h: int, opts: RenderOptions) -> list[int]:
    if opts.full or h <= opts.max_heads:
        return list(range(h))
    if opts.focus is not None:
        return [opts.focus]
    return [*range(opts.max_heads - 1), h - 1]


def tensor_matrices(record: TensorRecord, config: Config, opts: RenderOptions) -> list[Matrix]:
    """The 2-D slices a learner reads for this tensor, labelled by what its axes mean."""
    if record.dims in _UNBATCHED and record.values.ndim == len(record.dims):
        batched = replace(record, values=record.values[None], dims=("B", *record.dims))
        return _tensor_matrices(batched, config, opts, batched=False)
    matrices = _tensor_matrices(record, config, opts)
    if opts.cursor is not None and opts.cursor[0] == record.name:
        _place_cursor(matrices, record, opts.cursor[1])
    return matrices


def matrix_cell(record: TensorRecord, index: tuple[int, ...]) -> tuple[int, int, int] | None:
    """Where a tensor index is drawn: (the head's matrix or 0, row, column), or None for a
    layout without a drill-down. The inverse is tensor_index."""
    dims = record.dims
    if len(index) != len(dims):
        return None
    if dims in (("B", "h", "T", "d_h"), ("B", "h", "T", "T")):
        return index[1], index[2], index[3]
    if dims == ("B", "T", "C"):
        return 0, index[1], index[2]
    if dims == ("B", "T", "h", "d_h"):
        return 0, index[1], index[2] * record.values.shape[3] + index[3]
    return None


def tensor_index(record: TensorRecord, head: int, row: int, col: int) -> tuple[int, ...]:
    """The tensor index drawn at (head's matrix, row, column): matrix_cell's inverse."""
    dims = record.dims
    if dims == ("B", "T", "C"):
        return 0, row, col
    if dims == ("B", "T", "h", "d_h"):
        return (0, row, *divmod(col, record.values.shape[3]))
    return 0, head, row, col


def _place_cursor(matrices: list[Matrix], record: TensorRecord, index: tuple[int, ...]) -> None:
    place = matrix_cell(record, index)
    if place is None:
        return
    head, row, col = place
    for matrix in matrices:
        number = matrix.head if matrix.head is not None else 0
        matrix.drill = ((row, col) if number == head else None, number)


def _tensor_matrices(record: TensorRecord, config: Config, opts: RenderOptions,
                     batched: bool = True) -> list[Matrix]:
    v, dims, d_h = record.values, record.dims, config.head_dim
    split = d_h if record.head_split is not None else None
    if dims == ("B", "T"):
        return [Matrix(v, record, Axis(["ids"]), _token_axis(config), None, opts)]
    if dims == ("vocab", "C"):
        return [Matrix(v, record, Axis(list(config.vocab), literal=True), _channel_axis(v.shape[1], None),
                       None, opts)]
    if dims == ("B", "T", "C"):
        return [Matrix(v[0], record, _token_axis(config), _channel_axis(v.shape[2], split),
                       None, opts)]
    if dims == ("C_out", "C_in"):
        rows = _channel_axis(v.shape[0], split if record.head_split == 0 else None, "out ")
        cols = _channel_axis(v.shape[1], split if record.head_split == 1 else None, "in ")
        if record.head_split == 0:  # a head's rows: show which head beside the channel
            rows = Axis([f"out {c} h{c // d_h}" for c in range(v.shape[0])], heads=rows.heads)
        return [Matrix(v, record, rows, cols, None, opts)]
    if dims == ("C_in", "C_out"):  # stored as (in, out): x @ W (Conv1D, raw parameters)
        rows = _channel_axis(v.shape[0], split if record.head_split == 0 else None, "in ")
        cols = _channel_axis(v.shape[1], split if record.head_split == 1 else None, "out ")
        return [Matrix(v, record, rows, cols, None, opts)]
    if dims == ("C",):
        return [Matrix(v.reshape(1, -1), record, Axis(["bias"]), _channel_axis(v.shape[0], None), None,
                       opts)]
    if dims == ("T", "T"):
        return [Matrix(v, record, _token_axis(config), _token_axis(config), None, opts)]
    if dims == ("B", "T", "h", "d_h"):
        h = v.shape[2]
        flat = v[0].reshape(v.shape[1], h * d_h)  # memory order: head-major within a token
        heads = [c // d_h for c in range(h * d_h)]
        cols = Axis([f"h{c // d_h}" for c in range(h * d_h)], heads=heads,
                    sub=[f"d{c % d_h}" for c in range(h * d_h)])
        return [Matrix(flat, record, _token_axis(config), cols, None, opts)]
    if dims in (("B", "h", "T", "d_h"), ("B", "h", "T", "T")):
        matrices = []
        for i in _heads_shown(v.shape[1], opts):
            tags = record.row_tags[i] if record.row_tags is not None else None
            tag_heads = record.row_tag_heads[i] if record.row_tag_heads is not None else None
            cols = (_token_axis(config) if dims[-1] == "T"
                    else Axis([f"d{j}" for j in range(v.shape[3])]))
            matrices.append(Matrix(v[0, i], record, _token_axis(config, tags, tag_heads), cols,
                                   _head_title(record, i, opts, batched), opts, head=i))
        return matrices
    return _generic_matrices(record, opts)


def _generic_matrices(record: TensorRecord, opts: RenderOptions) -> list[Matrix]:
    """Any other tensor (an op no rule placed, a bias, a (in, out) weight): its last axis as
    columns, every leading index as one row, labelled by that index."""
    import numpy as np

    v = record.values
    if v.ndim == 0:
        v = v.reshape(1, 1)
    if v.ndim == 1:
        return [Matrix(v.reshape(1, -1), record, Axis([""]),
                       Axis([f"{record.dims[0] if record.dims else 'c'}{c}" for c in range(v.shape[0])]),
                       None, opts)]
    rows = [", ".join(map(str, index)) for index in np.ndindex(*v.shape[:-1])]
    flat = v.reshape(-1, v.shape[-1])
    row_prefix = record.dims[-2] if len(record.dims) == 2 else ""
    labels = [f"{row_prefix} {r}".strip() if row_prefix else f"[{r}]" for r in rows]
    return [Matrix(flat, record, Axis(labels), Axis([f"{record.dims[-1]} {c}" for c in range(v.shape[-1])]),
                   None, opts)]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def tensor_meta(record: TensorRecord) -> Text:
    """shape and dims, then strides, contiguity and storage sharing on a second line."""
    text = Text.assemble(
        (record.name, "bold"), "  ",
        ("shape ", "dim"), str(record.shape).replace(",)", ")"), "  ",
        ("dims ", "dim"), "(" + ", ".join(record.dims) + ")", "\n  ",
        ("strides ", "dim"), str(record.strides).replace(",)", ")"),
        (" bytes" if record.stride_unit == "bytes" else "", "dim"),
        # one head's: the heads were separate tensors, stacked by mha-tui (see the caption)
        (" per head" if len(record.strides) == len(record.shape) - 1 else "", "dim"), "  ",
        ("contiguous ", "dim"), _yes(record.contiguous),
    )
    if record.shares_storage is not None:
        text.append_text(Text.assemble("  ", (f"shares storage with {record.shares_with}: ", "dim"),
                                       _yes(record.shares_storage)))
    return text


class TensorView:
    """One tensor: its metadata line, caption, and matrices (side by side when they fit)."""

    def __init__(self, record: TensorRecord, config: Config, opts: RenderOptions) -> None:
        self.record, self.config, self.opts = record, config, opts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        record, opts = self.record, self.opts
        yield tensor_meta(record)
        if record.caption:
            yield Text(record.caption, style="italic dim")
        matrices = tensor_matrices(record, self.config, opts)
        if len(matrices) == 1:
            yield matrices[0]
        else:
            yield Columns(matrices, padding=(0, 3))
        h = record.values.shape[1] if record.dims[:2] == ("B", "h") else \
            record.values.shape[0] if record.dims[:1] == ("h",) else 0
        shown = len(_heads_shown(h, opts)) if h else 0
        if h and shown < h:
            yield Text(f"  {shown} of {h} heads shown", style="dim")


# ---------------------------------------------------------------- one stage


def _heading(number: int, total: int, stage_id: str, title: str) -> Text:
    return Text.assemble((f"{number}/{total} ", "dim"), (stage_id, "bold"),
                         ("  ·  ", "dim"), (title, "bold"))


def stage_heading(trace: Trace, stage: Stage) -> Text:
    return _heading(trace.index(stage.id) + 1, len(trace.stages), stage.id, stage.title)


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


def _intro_panel(body: RenderableType, opts: RenderOptions) -> Panel:
    """The app's frame around a stage's shape, code and explanation."""
    folded = None if opts.explain else Text("e explains", style="dim")
    return Panel(body, border_style=HEAD_COLORS[0], box=box.ASCII if opts.ascii else box.ROUNDED,
                 subtitle=folded, subtitle_align="right")


def stage_box(stage: Stage, opts: RenderOptions) -> Panel:
    """The app's box above a stage's tensors: shape, code and (unless folded) explanation."""
    return _intro_panel(stage_intro(labelled(stage), opts), opts)


def stage_screen(trace: Trace, stage: Stage, opts: RenderOptions) -> Group:
    """A whole stage as the app shows it: the transcript's parts, the intro in a panel."""
    stage = labelled(stage)
    return Group(
        stage_heading(trace, stage),
        stage_box(stage, opts),
        stage_tensors(trace, stage, opts),
        Text("checks", style="dim"),
        check_lines(stage.checks, opts.ascii),
    )


def pending_box(info: StageInfo, opts: RenderOptions) -> Panel:
    """The box of a stage before its numbers exist: the catalogue's code and explanation."""
    # Plain code here: highlighting loads Pygments, which the first frame cannot wait for.
    intro = Group(Text("code", style="dim"), Padding(Code(info.code, highlight=False), (0, 0, 0, 2)),
                  *([Text(info.explanation)] if opts.explain else []))
    return _intro_panel(intro, opts)


def pending_screen(info: StageInfo, number: int, total: int, message: Text,
                   opts: RenderOptions) -> Group:
    """A stage before its numbers exist (the app while torch loads): code and explanation."""
    return Group(_heading(number, total, info.id, info.title), pending_box(info, opts), message)


def stage_intro(stage: Stage, opts: RenderOptions) -> Group:
    """Shape transition, the PyTorch line (highlighted), the explanation and any note."""
    parts: list[RenderableType] = [
        Text.assemble(("shape  ", "dim"), (stage.transition, "bold"), "   ",
                      (stage.dims_transition, "cyan")),
        Text("code", style="dim"),
        code_block(stage.code),
    ]
    if not opts.explain:  # folded (the app on a short terminal): shape and code only
        return Group(*parts)
    parts.append(Text(stage.explanation))
    if stage.note:
        parts.append(Text(stage.note, style="bold yellow"))
    return Group(*parts)


def check_lines(checks: Iterable[Check], ascii_only: bool = False) -> Group:
    """Each invariant with what the computation said: ✓ held, ✗ broke, · a measurement."""
    marks = ({True: "[ok]", False: "[FAIL]", None: "[--]"} if ascii_only
             else {True: "✓", False: "✗", None: "·"})
    styles = {True: "green", False: "bold red", None: "dim"}
    return Group(*(Text.assemble((marks[c.ok], styles[c.ok]), " ", c.label) for c in checks))


def labelled(stage: Stage) -> Stage:
    """The stage as every transcript and the app show it: no two of its tensors alike.

    A name that occurs more than once among the stage's tensors and aside (the two inputs
    of the add in `v = (v * 0.5) + (v * 0.5)` are both `v`) keeps its first occurrence as it
    is and numbers the others in the order shown: `v`, `v (2)`. The app, the text and the
    JSON transcript (whose keys are these names) all call this, so they agree.
    """
    names = [r.name for r in (*stage.tensors, *stage.aside)]
    if len(set(names)) == len(names):
        return stage
    taken = set(names)
    seen: dict[str, int] = {}
    renamed = []
    for record in (*stage.tensors, *stage.aside):
        seen[record.name] = count = seen.get(record.name, 0) + 1
        if count == 1:
            renamed.append(record)
            continue
        label = f"{record.name} ({count})"
        while label in taken:  # a tensor already called `v (2)`: take the next number
            count += 1
            label = f"{record.name} ({count})"
        seen[record.name] = count
        taken.add(label)
        renamed.append(replace(record, name=label))
    split = len(stage.tensors)
    return replace(stage, tensors=tuple(renamed[:split]), aside=tuple(renamed[split:]))


def stage_tensors(trace: Trace, stage: Stage, opts: RenderOptions) -> Group:
    parts: list[RenderableType] = []
    records = list(stage.tensors)
    if opts.wrong_view and stage.aside:
        # The wrong reshape right above the right one, so the scrambled heads stand out.
        records = [*stage.aside, stage.tensors[0]]
    for record in records:
        parts.append(TensorView(record, trace.config, opts))
        parts.append(Text(""))
    return Group(*parts)


class HeadingRule:
    """A stage heading on a rule; when the width cannot hold it, the heading wraps above
    a plain rule rather than being cut."""

    def __init__(self, heading: Text, characters: str) -> None:
        self.heading, self.characters = heading, characters

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.heading.cell_len + 4 <= options.max_width:
            yield Rule(self.heading, characters=self.characters, align="left")
        else:
            yield self.heading
            yield Rule(characters=self.characters)


def stage_view(trace: Trace, stage: Stage, opts: RenderOptions) -> Group:
    """A whole stage as the transcript prints it (the app lays out the same parts)."""
    stage = labelled(stage)
    rule_chars = "-" if opts.ascii else "━"
    parts: list[RenderableType] = [
        HeadingRule(stage_heading(trace, stage), rule_chars),
        stage_intro(stage, opts),
        Text(""),
        stage_tensors(trace, stage, opts),
    ]
    if stage.aside and not opts.wrong_view:
        wrong = stage.aside[0].name.split(".", 1)[-1]  # view(B, h, T, d_h); NumPy: reshape(h, T, d_h)
        parts.append(Text(f"Why not one {wrong}?", style="bold"))
        parts.append(stage_tensors(trace, replace_tensors(stage), opts))
    parts.append(Text("checks", style="dim"))
    parts.append(check_lines(stage.checks, opts.ascii))
    parts.append(Text(""))
    return Group(*parts)


def replace_tensors(stage: Stage) -> Stage:
    """The stage's aside (the wrong view) in place of its tensors."""
    return replace(stage, tensors=stage.aside, aside=())


def _sizes(config: Config, batched: bool = True) -> Text:
    if config.model is not None:  # C, h and d_h are on the model's line
        return Text(f"{'B=1 ' if batched else ''}T={config.seq_len}", style="cyan", end="")
    return Text(f"{'B=1 ' if batched else ''}T={config.seq_len} C={config.embed_dim} h={config.num_heads} "
                f"d_h={config.head_dim} seed={config.seed} "
                f"{'causal' if config.causal else 'no mask'}", style="cyan", end="")


def _token_list(config: Config, opts: RenderOptions, room: int) -> Text:
    """`the=0 cat=1 …`, as many tokens as fit in room cells, then how many are left out."""
    tokens = list(zip(config.tokens, config.ids, strict=True))
    gap = "..." if opts.ascii else "…"
    text = Text(no_wrap=True, end="")
    for i, (token, token_id) in enumerate(tokens):
        item = Text.assemble(label(token, ascii_only=opts.ascii, style="bold"),
                             (f"={token_id}", "dim"))
        rest = len(tokens) - i - 1
        marker = f" {gap} (+{rest})" if rest else ""
        need = text.cell_len + (1 if i else 0) + item.cell_len
        # Keep this token if it fits with the marker the tokens after it would need.
        if need + len(marker) > room and not (rest == 0 and need <= room):
            text.append(f"{' ' if i else ''}{gap} (+{len(tokens) - i})", style="dim")
            return text
        if i:
            text.append(" ")
        text.append_text(item)
    return text


def header(config: Config, opts: RenderOptions, width: int | None = None, *,
           batched: bool = True, max_lines: int = 3) -> RenderableType:
    """Sentence, tokens with their ids, and B, T, C, h, d_h, at most max_lines of width.

    The sizes are always shown whole; the sentence and the token list give way (cut with an
    ellipsis, tokens elided with a count). Without a width, the header is laid out at the
    width it is drawn at (the app's header follows the terminal's size). batched: False for
    a module whose x has no batch axis (NumPy's (T, C)): no B then.
    """
    if width is None:
        return Header(config, opts, batched, max_lines)
    if config.model is None:
        return _sentence_and_sizes(config, opts, width, batched, max_lines)
    body = _sentence_and_sizes(config, opts, width, batched, max(1, max_lines - 1))
    return Text("\n").join([model_line(config, opts, width), body])


def model_line(config: Config, opts: RenderOptions, width: int | None = None) -> Text:
    """`--hf`: the model, its attention module, the layer shown and the model's sizes.

    When it does not fit the width, the layer and sizes come first and the names are cut."""
    model = config.model
    assert model is not None
    names = Text("model ", style="dim", end="")
    name = model.name
    if len(name) > 40:  # a long path: its end names the model
        names.append("..." if opts.ascii else "…", style="bold")
        name = name[-39:]
    names.append_text(label(name, max_cells=40, ascii_only=opts.ascii, style="bold"))
    names.append(f" ({model.class_name})", style="dim")
    if model.attention:
        names.append(f"  {model.attention}", style="dim")
    sizes = Text.assemble((f"layer {model.layer}", "bold"), (f" of 0-{model.n_layers - 1}", "dim"),
                          (f"  C={config.embed_dim} h={config.num_heads} d_h={config.head_dim} "
                           f"vocab={model.vocab_size} layers={model.n_layers}", "cyan"), end="")
    line = Text.assemble(names, "  ", sizes, no_wrap=True, end="")
    if width is None or line.cell_len <= width:
        return line
    line = Text.assemble(sizes, "  ", names, no_wrap=True, end="")
    line.truncate(width, overflow="ellipsis")
    return line


def _sentence_and_sizes(config: Config, opts: RenderOptions, width: int, batched: bool,
                        max_lines: int) -> Text:
    sizes = _sizes(config, batched)
    sentence = Text("sentence ", style="dim", no_wrap=True, end="")
    sentence.append_text(label(config.sentence, max_cells=max(1, min(40, width - 9)),
                               ascii_only=opts.ascii))
    tokens = Text("tokens ", style="dim", no_wrap=True, end="")
    tokens.append_text(_token_list(config, opts, max(1, width - 7)))
    one = Text.assemble(sentence, "   ", tokens, "   ", sizes, no_wrap=True)
    if one.cell_len <= width:
        return one
    lines = [sentence, tokens]
    if tokens.cell_len + 3 + sizes.cell_len <= width:
        lines[1] = Text.assemble(tokens, "   ", sizes, no_wrap=True, end="")
    elif sentence.cell_len + 3 + sizes.cell_len <= width:
        lines[0] = Text.assemble(sentence, "   ", sizes, no_wrap=True, end="")
    elif sizes.cell_len <= width:
        lines.append(sizes)
    else:  # the sizes need two lines: the token list already spells out the sentence
        lines = [tokens, sizes]
    if len(lines) > max_lines and lines[0] is sentence:
        lines = lines[1:]  # the token list already spells out the sentence
    return Text("\n").join(lines)


class Header:
    """The header laid out at the width it is given when drawn."""

    def __init__(self, config: Config, opts: RenderOptions, batched: bool = True,
                 max_lines: int = 3) -> None:
        self.config, self.opts, self.batched, self.max_lines = config, opts, batched, max_lines

    def _text(self, width: int) -> RenderableType:
        return header(self.config, self.opts, width, batched=self.batched,
                      max_lines=self.max_lines)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._text(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._text(options.max_width))


def display_path(path: str) -> str:
    """A module's file as a reader finds it: inside mha-tui's package, under the current
    folder, or absolute. Deterministic for the built-in modules wherever mha-tui is installed."""
    import os

    package = os.path.dirname(os.path.abspath(__file__))
    absolute = os.path.abspath(path) if path else ""
    if absolute.startswith(package + os.sep):
        return "mha_tui/" + os.path.relpath(absolute, package).replace(os.sep, "/")
    cwd = os.getcwd()
    if absolute.startswith(cwd + os.sep):
        return os.path.relpath(absolute, cwd)
    return absolute


def module_line(info: ModuleInfo, opts: RenderOptions) -> Text:
    """Which module was explained: its class and the file its forward came from."""
    text = Text.assemble(("module ", "dim"), (info.class_name, "bold"), ("  file ", "dim"))
    text.append_text(label(display_path(info.file), max_cells=200, ascii_only=opts.ascii))
    if info.per_head_modules:
        text.append("  (each head ran as its own module)", style="dim")
    return text


# ---------------------------------------------------------------- why this number


_MATH_ASCII = str.maketrans({"×": "*", "Σ": "sum ", "√": "sqrt ", "÷": "/", "·": ".",
                             "≤": "<=", "≥": ">="})
"""--ascii: the drill-down's mathematics in ASCII."""


def _why_number(value: float, decimals: int) -> str:
    return _fmt(value, "signed", decimals)


def why_view(why: Why, opts: RenderOptions) -> Group:
    """How one cell was made (mha_tui.why): the formula, each step with the recorded numbers,
    and the module's own number beside mha-tui's, ✓ or ✗ with the difference. Shared by the
    app's side panel and `explain --why`. Labels hold tokens: printable() and Text only."""
    from rich.table import Table

    d = max(opts.decimals, 4)

    def say(text: str) -> str:
        return printable(text.translate(_MATH_ASCII) if opts.ascii else text)

    ok, bad = ("[ok]", "[FAIL]") if opts.ascii else ("✓", "✗")
    head = Text.assemble(("why ", "bold"), (say(f"{why.tensor}[{', '.join(map(str, why.index))}]"),
                                            "bold cyan"), ("  " + say(why.where), "dim"))
    steps = Table.grid(padding=(0, 1))
    steps.add_column(no_wrap=False)
    steps.add_column(justify="right", no_wrap=True)
    steps.add_column(no_wrap=True)
    steps.add_column(justify="right", no_wrap=True)
    for term in why.terms:
        parts = " ".join(say(p) if isinstance(p, str) else _why_number(p, d) for p in term.parts)
        steps.add_row(Text(say(term.label)), Text(parts, style="dim"),
                      "=" if term.value is not None else "",
                      Text(_why_number(term.value, d) if term.value is not None else "",
                           style="bold" if term.label == "sum" else ""))
    verdict = Text.assemble(
        ("the module's own ", "dim"), say(f"{why.tensor}[{', '.join(map(str, why.index))}]"),
        ": ", (_why_number(why.recorded, d), "bold"), "  ")
    if why.agrees:
        rounding = f" (difference {why.difference:.1e}: float32 rounding)" if why.difference else ""
        verdict.append_text(Text.assemble((ok, "green"), " equal" + rounding))
    else:
        verdict.append_text(Text.assemble((bad, "bold red"), f" differs from mha-tui's "
                                          f"{_why_number(why.computed, d)} by {why.difference:.3g}"))
    return Group(
        head,
        Text(say(why.formula)),
        Text("computed by mha-tui from the recorded tensors:", style="italic dim"),
        Padding(steps, (0, 0, 0, 2)),
        verdict,
        *(Text(say(note), style="dim") for note in why.notes),
    )
