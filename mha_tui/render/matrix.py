"""One matrix drawn: `Axis` (the labels of rows or columns), `Matrix` (the cells that fit
the width, elided rows and columns, the cursor's cell) and the summary line under it.

Values are formatted from the recorded array; only the visible window is formatted, so the
cost follows the screen, not the tensor. Never import torch, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from ..records import TensorRecord
from .options import RenderOptions
from .text import LABEL_CELLS, label
from .values import DIM_STYLE, INF_STYLE, RAMPS, STEPS, format_column, format_value, head_style, magnitude

if TYPE_CHECKING:
    import numpy as np  # NumPy arrives with torch; the app's first frame must not wait for it


# ---------------------------------------------------------------- one matrix


def _window(n: int, limit: int, full: bool, keep: int | None = None) -> list[int | None]:
    """Indices to draw along an axis of length n: all, or both ends around a gap (None).
    keep: an index that must be drawn (the drill-down's cursor); where it falls in the gap it
    takes the place of the last index before the gap, between two gaps."""
    if full or n <= limit:
        return list(range(n))
    head = (limit + 1) // 2
    tail = limit - head
    chosen = [*range(head), *range(n - tail, n)]
    if keep is not None and 0 <= keep < n and keep not in chosen:
        chosen = sorted({*chosen[:head - 1], keep, *chosen[head:]})
    return _with_gaps(chosen)


def _with_gaps(chosen: Sequence[int]) -> list[int | None]:
    """Sorted indices with a gap (None) wherever some are left out between two of them."""
    out: list[int | None] = []
    for k, i in enumerate(chosen):
        if k and i != chosen[k - 1] + 1:
            out.append(None)
        out.append(i)
    return out


def _gaps(indices: Sequence[int | None], n: int) -> list[int]:
    """How many indices each gap (None) of a window stands for, in order."""
    counts = []
    for k, i in enumerate(indices):
        if i is None:
            before = indices[k - 1] if k else -1
            after = indices[k + 1] if k + 1 < len(indices) else n
            counts.append(int(after) - int(before) - 1)  # type: ignore[arg-type]
    return counts


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
# Plain lines (no colour) go to Rich a few at a time, as one segment: each segment passes
# through every level of Rich's rendering (--full draws 280,000 lines), and where Rich crops
# a line to the width it splits a segment at each newline, copying what follows each time.
_PLAIN_LINES = 16
MARK = "*"  # in the gap before a marked cell (explain --against: it differs); one cell wide
_MARK_STYLE = Style(color="red", bold=True)
_BOLD = Style(bold=True)
_MARKED_STYLE = Style(bold=True, underline=True)


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
        self._text_widths: dict[int, int] = {}  # the widest of each column's texts
        self._drawn: dict[tuple[int, bool], list[str | list[Segment]]] = {}
        self._headers: dict[tuple[int, bool], list[_Cell]] = {}
        self._layouts: dict[int, list[list[int | None]]] = {}
        self._row_labels: list[_Cell] | None = None
        # The app's drill-down: ((row, column) of the cursor or None, the matrix's number
        # in the click action); None outside it. Set with drill_at().
        self.drill: tuple[tuple[int, int] | None, int] | None = None
        # Cells (row, column) marked with MARK before them (`explain --against`: the cells
        # that differ from the other module's); set by the caller before drawing.
        self.marked: frozenset[tuple[int, int]] = frozenset()
        # At most this many columns drawn (in full mode: per block); None: what the width
        # holds. Set with limit_columns() (`explain --against`: both sides the same columns).
        self.column_limit: int | None = None

    def limit_columns(self, limit: int | None) -> None:
        """Draw at most `limit` columns (both ends of the axis, as the width would choose
        them), or per block with `full`; None: as many as the width holds."""
        if limit != self.column_limit:
            self.column_limit = limit
            self._layouts.clear()
            self._drawn.clear()

    def drill_at(self, cursor: tuple[int, int] | None, number: int) -> None:
        """Put the drill-down's cursor on (row, column) (None: on another matrix); an
        elided row or column under it is drawn, in place of one next to the gap."""
        self.drill = (cursor, number)
        if cursor is not None:
            self.row_idx = _window(self.values.shape[0], self.opts.max_rows, self.opts.full,
                                   keep=cursor[0])
            self._shown_rows = [i for i in self.row_idx if i is not None]
            self._columns.clear()
            self._text_widths.clear()
            self._drawn.clear()
            self._layouts.clear()
            self._row_labels = None

    # ------------------------------------------------------------ labels and cells

    def _dim(self, head: int | None) -> bool:
        return self.opts.focus is not None and head is not None and head != self.opts.focus

    def _label_style(self, axis: Axis, i: int) -> Style:
        if self._dim(self.head):
            return DIM_STYLE
        head = self.head if axis.heads is None else axis.heads[i]
        owned = axis.heads is not None
        return head_style(head, self._dim(head)) if owned and head is not None else _BOLD

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
        """Column j's shown values, formatted once; with `full`, every column at once."""
        texts = self._columns.get(j)
        if texts is None and self.opts.full and self.numbers and not self._columns:
            self._columns = self._every_column()
            texts = self._columns.get(j)
        if texts is None:
            values = self.values[self._shown_rows, j]
            texts = (format_column(values, self.record.kind, self.opts.decimals) if self.numbers
                     else ["   "] * len(values))
            self._columns[j] = texts
        return texts

    def _every_column(self) -> dict[int, list[str]]:
        """Every column's shown values, formatted in one call (--full draws them all:
        millions of values in thousands of columns, most of them a few values long)."""
        import numpy as np

        columns = np.ascontiguousarray(self.values[self._shown_rows].T)  # one column a row
        texts = format_column(columns.reshape(-1), self.record.kind, self.opts.decimals)
        n = len(self._shown_rows)
        return {j: texts[j * n:(j + 1) * n] for j in range(columns.shape[0])}

    def _text_width(self, j: int) -> int:
        """The widest of column j's shown texts (0 when no row is shown)."""
        width = self._text_widths.get(j)
        if width is None:
            width = self._text_widths[j] = max(map(len, self._texts(j)), default=0)
        return width

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
            return [DIM_STYLE if dim else None for dim in dims]
        values = self.values[self._shown_rows, j].astype(np.float64)
        finite = np.isfinite(values)
        safe = np.where(finite, values, 0.0)
        if record.kind == "prob":
            t = safe
        else:
            t = np.abs(safe) / (magnitude(record) or 1.0)
        steps = np.clip(np.rint(t * (STEPS - 1)), 0, STEPS - 1).astype(np.int64).tolist()
        ramps = ([RAMPS["prob"]] * len(steps) if record.kind == "prob"
                 else [RAMPS["neg"] if v < 0 else RAMPS["pos"] for v in safe.tolist()])
        return [INF_STYLE if not ok else ramp[step // 4 if dim else step]
                for ok, ramp, step, dim in zip(finite.tolist(), ramps, steps, dims, strict=True)]

    def _width(self, j: int, elided: bool) -> int:
        return max(self._text_width(j), max(c.cells for c in self._header(j, elided)))

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
                if block and (used + need > room or len(block) == self.column_limit):
                    blocks.append(block)
                    block, used = [], 0
                block.append(j)
                used += need
            blocks.append(block)
        else:
            keep = self.drill[0][1] if self.drill is not None and self.drill[0] else None
            candidates = [j for j in _window(n, self.opts.max_cols, False, keep=keep)
                          if j is not None]
            best: list[int | None] = candidates[:1] + ([None] if n > 1 else [])
            # Adding a column to an elided window only widens it, so the first k that does
            # not fit ends the search; but every column shown needs neither the gap column
            # nor the positions an elided axis adds to its tokens (`love·1`), so with narrow
            # cells (numbers off, few decimals) all n can fit where n - 1 did not.
            def window(k: int) -> tuple[list[int | None], int]:
                """The first k candidates (both ends), and the cells they take."""
                left = candidates[:(k + 1) // 2]
                chosen = left + (candidates[-(k // 2):] if k // 2 else [])
                if k == n:
                    return list(chosen), sum(_GAP + self._width(j, False) for j in chosen)
                if keep is not None and keep not in chosen:  # the cursor's column is drawn
                    chosen = sorted({*left[:-1], keep, *chosen[len(left):]})
                gap = len("..." if self.opts.ascii else "…")
                cols = _with_gaps(chosen)
                return (cols, sum(_GAP + max(gap, len(self._gap_header(hidden)))
                                  for hidden in _gaps(cols, n))
                        + sum(_GAP + self._width(j, True) for j in chosen))

            most = len(candidates) if self.column_limit is None else \
                max(1, min(len(candidates), self.column_limit))
            for k in range(1, most + 1):
                cols, used = window(k)
                if used > room and k > 1:
                    if k < n == most:
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
        hidden_at = iter(_gaps(block, n))
        headers = [[_Cell(self._gap_header(g := next(hidden_at)), DIM_STYLE, len(self._gap_header(g)))]
                   if j is None else self._header(j, elided) for j in block]
        texts = [[gap] * len(labels) if j is None else self._texts(j) for j in block]
        label_width = max((c.cells for c in labels), default=0)
        widths = [max(max(map(len, col), default=1) if j is None else
                      self._text_width(j) if col else 1, *(c.cells for c in head))
                  for j, col, head in zip(block, texts, headers, strict=True)]
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
            # No marked cell: each row one `%` (--full writes millions of cells; blanks +
            # text is the text right-aligned in _GAP + w, as %*s aligns it).
            row_format = "".join(f"%{_GAP + w}s" for w in widths)
            rows = None if self.marked else [row_format % row
                                             for row in zip(*texts, strict=True)]
            r = 0
            for i in self.row_idx:
                if i is None:
                    out.append(vgap.rjust(label_width) + "".join(sep + vgap.rjust(w) for w in widths))
                    continue
                cell = labels[r]
                out.append(" " * (label_width - cell.cells) + cell.text + (
                    rows[r] if rows is not None else "".join(
                        self._gap(i, j, w, col[r]) + col[r] for j, w, col in
                        zip(block, widths, texts, strict=True))))
                r += 1
            return out
        styles = [[DIM_STYLE] * len(labels) if j is None else self._styles(j) for j in block]
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
                if j is not None and (i, j) in self.marked:
                    line += [Segment(self._gap(i, j, w, col[r])[:-1]), Segment(MARK, _MARK_STYLE),
                             Segment(col[r], (style or Style()) + _MARKED_STYLE)]
                    continue
                line += [Segment(" " * (_GAP + w - len(col[r]))), Segment(col[r], style)]
            out.append(line)
            r += 1
        return out

    def _gap(self, i: int, j: int | None, width: int, text: str) -> str:
        """The blanks before a cell's text; MARK just before it when the cell is marked."""
        blanks = " " * (_GAP + width - len(text))
        return blanks[:-1] + MARK if j is not None and (i, j) in self.marked else blanks

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

    def whole_width(self) -> int:
        """The cells it needs to show every column (SideBySide stacks two matrices that do
        not fit beside each other)."""
        limit = self.column_limit
        self.limit_columns(None)
        try:
            return self._natural_width(100_000)
        finally:
            self.limit_columns(limit)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        width = min(self._natural_width(options.max_width), options.max_width)
        return Measurement(width, width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.title is not None:
            yield self.title
        color = not (console.no_color or console.color_system is None)
        newline = Segment.line()
        plain: list[str] = []  # lines without colour, handed over _PLAIN_LINES at a time
        for line in self._lines(width, color):
            if isinstance(line, str):
                plain.append(line)
                if len(plain) == _PLAIN_LINES:
                    yield Segment("\n".join(plain) + "\n")
                    plain.clear()
                continue
            if plain:
                yield Segment("\n".join(plain) + "\n")
                plain.clear()
            yield from line
            yield newline
        if plain:
            yield Segment("\n".join(plain) + "\n")
        rows, cols = self.shown(width)
        n_rows, n_cols = self.values.shape
        if rows < n_rows or cols < n_cols:
            yield _summary(self.values, self.record, n_rows, n_cols, rows, cols, self.opts,
                           width)
        elif len(self._layout(width)) > 1:
            yield newline  # column blocks: a blank line before the next head's title


def share_columns(matrices: Sequence[Matrix], width: int) -> None:
    """Draw the same columns in matrices of one shape side by side, each `width` wide: as many
    as the one with the widest numbers shows (`explain --against`: yours and the reference's
    elided alike, so that a column left out on one side is left out on the other). With
    `full`, the same blocks of columns."""
    if len(matrices) < 2 or len({m.values.shape[1] for m in matrices}) != 1:
        return
    for matrix in matrices:
        matrix.limit_columns(None)
    if any(m.opts.full for m in matrices):
        def blocks() -> list[list[int]]:
            """Each matrix's block lengths but its last (a last block may be short)."""
            return [[len(b) for b in m._layout(width)[:-1]] for m in matrices]

        lengths = [k for each in blocks() for k in each]
        if not lengths:  # one block each: every column in one table
            return
        limit = min(lengths)
        while limit > 1:
            for matrix in matrices:
                matrix.limit_columns(limit)
            if all(k == limit for each in blocks() for k in each):
                return
            limit -= 1
        for matrix in matrices:
            matrix.limit_columns(1)
        return
    shown = [m.shown(width)[1] for m in matrices]
    while len(set(shown)) > 1:
        limit = min(shown)
        for matrix in matrices:
            matrix.limit_columns(limit)
        shown = [m.shown(width)[1] for m in matrices]  # each at most limit


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
            stats = [f"min {format_value(float(finite.min()), 'signed', d)}",
                     f"max {format_value(float(finite.max()), 'signed', d)}",
                     f"mean {format_value(float(finite.mean(dtype=np.float64)), 'signed', d)}"]
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
