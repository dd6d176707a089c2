"""How `explain --against` is drawn: the learner's stage beside the reference's, pure Rich
renderables shared by the transcript (and the app).

Every tensor shown is a module's own, drawn by `render` exactly as the walk-through draws it;
the differences between them (|yours - reference's|, which cells are beyond the tolerance,
the largest) are computed by mha-tui (`judge.compare`) and say so wherever they appear.
User text (file names, source lines, tokens) enters as Text after `printable`.
Never import torch, textual or typer here.
"""

from __future__ import annotations

import re
from pathlib import Path

from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from ..judge.compare import TOLERANCE, Comparison, Mismatch, StagePair, TensorPair
from ..records import Stage, TensorRecord
from .header import display_path, drawn_config
from .matrix import MARK, Matrix, share_columns
from .options import RenderOptions
from .stage import HeadingRule
from .tensor import TensorView, mark_cells, tensor_matrices, tensor_meta
from .text import Unbroken, label, printable

STATUS_WORDS = {
    "agree": "same numbers",
    "differ": "differs",
    "mine": "only in yours",
    "reference": "only in the reference",
    "not compared": "not compared",
    "reordered": "same steps, another order",
}
CELLS_LISTED = 8
LARGEST = re.compile(r"(?:largest|difference|numbers),? [-+]?(?:\d[\d.]*(?:e[-+]?\d+)?|inf|nan)")
"""`largest, 0`, `difference 0.3100`, `numbers, 0.6162`: the largest difference and the word
before it, kept on one line when the text wraps (`Unbroken`), as are indices such as
`[0, 1, 3, 0]`."""


def marks(ascii_only: bool) -> dict[str, str]:
    """The rail's and the headings' mark for each status."""
    if ascii_only:
        return {"agree": "+", "differ": "x", "mine": "<", "reference": ">", "not compared": ".",
                "reordered": "~"}
    return {"agree": "✓", "differ": "✗", "mine": "◧", "reference": "◨", "not compared": "·",
            "reordered": "≈"}


STATUS_STYLES = {"agree": "green", "differ": "bold red", "mine": "yellow", "reference": "yellow",
                 "not compared": "dim", "reordered": "cyan"}


def _index(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, index)) + "]"


def _number(value: float) -> str:
    return f"{value:.4g}" if value < 1e-3 or value >= 1e4 else f"{value:.4f}"


def shown_label(text: str) -> str:
    """A module's label as a reader finds its file: `tests/x.py:Attention`, `mygpt`."""
    where, colon, cls = text.rpartition(":")
    if colon and where.endswith(".py"):
        return printable(f"{display_path(where)}:{cls}")
    return printable(text)


def comparison_header(c: Comparison, opts: RenderOptions) -> Group:
    """Which two modules, how the weights were copied, the tolerance, where they part."""
    def module(who: str, name: str, stage_file: str) -> Text:
        text = Text.assemble((f"{who:<10} ", "dim"), (shown_label(name), "bold"))
        if display_path(stage_file) not in shown_label(name):  # a --module label names it
            text.append("  file ", style="dim")
            text.append_text(label(display_path(stage_file), max_cells=200, ascii_only=opts.ascii))
        return text

    mine_file = c.mine.module.file if c.mine.module else ""
    theirs_file = c.theirs.module.file if c.theirs.module else ""
    parts: list[RenderableType] = [
        module("yours", c.mine_label, mine_file),
        module("reference", c.theirs_label, theirs_file),
        Text("same x for both; your weights copied into the reference by role by mha-tui:",
             style="dim"),
    ]
    parts += [Text("  " + printable(line), style="dim") for line in c.weights] or \
        [Text("  (none: your forward raised before its weights could be found)", style="dim")]
    parts.append(Text(f"differences computed by mha-tui: a cell differs when |yours - "
                      f"reference's| exceeds {TOLERANCE}", style="dim"))
    orders = dict.fromkeys(row.order for row in c.rows if row.order)
    parts += [Text(f"a different but equivalent order: {order}", style="cyan") for order in orders]
    parted = c.parted
    differing = [row.kind for row in c.rows if row.status == "differ"]
    if parted is None and not differing:
        parts.append(Text("they never part: every stage both have gives the same numbers" +
                          (", or the same after both orders" if orders else ""), style="green"))
    elif parted is None:
        parts.append(Text(f"they never part for good: they differ at {', '.join(differing)} "
                          "and give the same numbers again after them", style="green"))
    else:
        assert c.parting is not None
        parts.append(Unbroken(Text.assemble(
            ("they part at ", "bold"), (f"{c.parting + 1}/{len(c.rows)} {parted.kind}", "bold red"),
            f": {_status_words(parted)}"), LARGEST))
    return Group(*parts)


def mismatch_words(m: Mismatch) -> str:
    """`16 cells -inf in yours (blocked), a number in the reference's (kept), first at [..]`"""
    def side(what: str, other: str) -> str:
        if what == "-inf" and other == "a number":
            return "-inf (blocked)"
        if what == "a number" and other == "-inf":
            return "a number (kept)"
        return what

    cells = "1 cell" if m.count == 1 else f"{m.count} cells"
    return (f"{cells} {side(m.yours, m.reference)} in yours, {side(m.reference, m.yours)} in "
            f"the reference's, first at {_index(m.first)}")


def _status_words(row: StagePair) -> str:
    words = STATUS_WORDS[row.status]
    if row.status == "differ":
        odd = sum(m.count for t in row.tensors for m in t.mismatches)
        numbers = [t for t in row.tensors if t.diff is not None and t.max_diff]
        parts = []
        if odd:
            parts.append(f"{odd} {'cell' if odd == 1 else 'cells'} -inf or NaN on one side only")
        if numbers or not odd:
            parts.append(f"largest difference {_number(row.max_diff or 0.0)}")
        words += f" (computed by mha-tui): {'; '.join(parts)}"
    if row.status == "not compared":
        note = next((t.note for t in row.tensors if t.note), "")
        words = note or words
    return words


def row_heading(c: Comparison, k: int, opts: RenderOptions) -> Text:
    """`6/12 scale  ✗ differs, largest difference 0.31  <- they part here`."""
    row = c.rows[k]
    stage = row.mine or row.theirs
    assert stage is not None
    text = Text.assemble((f"{k + 1}/{len(c.rows)} ", "dim"), (row.kind, "bold"), ("  ·  ", "dim"),
                         (stage.title, "bold"), "  ",
                         (marks(opts.ascii)[row.status], STATUS_STYLES[row.status]), " ",
                         (_status_words(row), STATUS_STYLES[row.status]))
    if k == c.parting:
        text.append("  <- they part here", style="bold red")
    return text


PACKAGE = Path(__file__).resolve().parents[1]
"""mha-tui's own code (the lookup that makes x, the same for both sides), the tutorials'
modules in examples/ aside."""


def _where(stage: Stage) -> str:
    source = stage.source
    if source is None:
        return ""
    path = Path(source.file).resolve()
    if path.is_relative_to(PACKAGE) and not path.is_relative_to(PACKAGE / "examples"):
        return "mha-tui's lookup" if stage.kind == "embed" else "mha-tui's code"
    return f"{display_path(source.file).rsplit('/', 1)[-1]} line {source.line}"


def _missing(c: Comparison, k: int) -> str:
    """`your module has none: it would go between your scale (line 31) and softmax (line 32)`"""
    before, after = c.neighbours(k)
    places = [f"{s.kind} (line {s.source.line})" for s in (before, after)
              if s is not None and s.source is not None]
    if not places:
        return "your module has no such stage"
    where = " and your ".join(places)
    return (f"your module has no such stage; it would go "
            f"{'between your ' if len(places) == 2 else 'next to your '}{where}")


def _line(who: str, stage: Stage | None, other: str, opts: RenderOptions) -> Table:
    """`yours      mask.py line 33: scores = ...`, a long line wrapped under its code."""
    line = Table.grid(padding=(0, 1))
    line.add_column(no_wrap=True, width=10)  # as the header's `yours      ` and `reference  `
    line.add_column(ratio=1, overflow="fold")
    if stage is None:
        line.add_row(Text(who, style="dim"), Text(other, style="italic"))
        return line
    where = f"{_where(stage)}: " if stage.source else ""
    code = stage.code.splitlines()[0] if stage.code else ""
    text = Text()  # label()'s Text does not wrap: the code after it must
    text.append_text(label(where, max_cells=200, ascii_only=opts.ascii))
    text.append(printable(code))
    line.add_row(Text(who, style="dim"), text)
    return line


def _difference_record(pair: TensorPair) -> TensorRecord:
    """The cell-by-cell difference as a tensor to draw in the learner's layout; mha-tui's."""
    assert pair.mine is not None and pair.theirs is not None and pair.diff is not None
    return TensorRecord(name="|yours - reference's|", dims=pair.mine.dims,
                        values=pair.diff, strides=(), contiguous=True, kind="signed",
                        head_split=pair.mine.head_split)


MIN_SIDE = 24
"""Narrower than this a side's metadata wraps word by word: the two sides are stacked."""


class SideBySide:
    """Two columns of parts, part beside part, each column half the width whatever it holds:
    a line that wraps on one side moves both, and two matrices beside each other show the
    same columns (`share_columns`: the width the wider numbers leave), so heads, rows and
    columns line up."""

    GAP = 3

    def __init__(self, rows: list[tuple[RenderableType, RenderableType]]) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        half = max(1, (options.max_width - self.GAP) // 2)
        matrices = [m for row in self.rows for m in row if isinstance(m, Matrix)]
        needs = [m.whole_width() for m in matrices]
        if any(n > half for n in needs) or options.max_width < 2 * MIN_SIDE + self.GAP:
            # Beside each other they would each show part of their columns (2 of 4 at 80
            # columns): yours above the reference's instead, each at the full width (whole
            # where it fits in it).
            share_columns(matrices, options.max_width)
            blank = Text("")
            yield Group(*(left for left, _ in self.rows), blank,
                        *(right for _, right in self.rows))
            return
        grid = Table.grid(padding=(0, self.GAP))
        grid.add_column(width=half)
        grid.add_column(width=half)
        for left, right in self.rows:
            if isinstance(left, Matrix) and isinstance(right, Matrix):
                share_columns([left, right], half)
            grid.add_row(left, right)
        yield grid


def _sides(c: Comparison, pair: TensorPair, opts: RenderOptions) -> SideBySide:
    """Yours and the reference's, part beside part (title, metadata, caption, then each
    head's matrix)."""
    columns: list[list[RenderableType]] = []
    for who, record, config in (("yours", pair.mine, drawn_config(c.mine)),
                                ("reference", pair.theirs, drawn_config(c.theirs))):
        if record is None:
            columns.append([Text(f"{who}: nothing to set beside it", style="italic")])
            continue
        parts: list[RenderableType] = [Text(who, style="bold"), Unbroken(tensor_meta(record, config))]
        if record.caption:
            parts.append(Unbroken(Text(record.caption, style="italic dim")))
        matrices = tensor_matrices(record, config, opts)
        if pair.differs is not None and pair.count:  # the differing cells, on both sides
            mark_cells(matrices, record, pair.differs.reshape(record.values.shape))
        parts += matrices
        h = record.values.shape[1] if record.dims[:2] == ("B", "h") else 0
        if h and len(matrices) < h:
            parts.append(Text(f"  {len(matrices)} of {h} heads shown", style="dim"))
        columns.append(parts)
    mine, theirs = columns
    if pair.mine is not None and pair.theirs is not None and pair.mine.caption and \
            not pair.theirs.caption:
        theirs.insert(2, Text(""))  # keep the matrices level
    elif pair.theirs is not None and pair.mine is not None and pair.theirs.caption and \
            not pair.mine.caption:
        mine.insert(2, Text(""))
    blank = Text("")
    return SideBySide([(mine[k] if k < len(mine) else blank, theirs[k] if k < len(theirs) else blank)
                       for k in range(max(len(mine), len(theirs)))])


def pair_view(c: Comparison, pair: TensorPair, opts: RenderOptions) -> Group:
    """Yours beside the reference's (each the module's own), then the difference
    (mha-tui's): how many cells differ, the largest and where, the cells, the table."""
    config = drawn_config(c.mine)
    parts: list[RenderableType] = [_sides(c, pair, opts)]
    if pair.diff is None:
        parts.append(Unbroken(Text(pair.note, style="italic dim")))
        return Group(*parts)
    assert pair.differs is not None and pair.at is not None
    ok, bad = marks(opts.ascii)["agree"], marks(opts.ascii)["differ"]
    if not pair.count:
        parts.append(Unbroken(Text.assemble((f"{ok} ", "green"), "difference, computed by mha-tui: ",
                                            ("every cell within the tolerance", "green"),
                                            f"; the largest, {_number(pair.max_diff or 0.0)}"),
                              LARGEST))
        return Group(*parts)
    summary = Text.assemble((f"{bad} ", "bold red"), "difference, computed by mha-tui: ",
                            (f"{pair.count} of {pair.differs.size} cells differ", "bold red"))
    numeric = pair.count - sum(m.count for m in pair.mismatches)
    if numeric or not pair.mismatches:
        summary.append(f"; the largest difference between two numbers, "
                       f"{_number(pair.max_diff or 0.0)}, at {_index(pair.at)}")
    parts.append(Unbroken(summary, LARGEST))
    parts += [Unbroken(Text(f"  {mismatch_words(m)}", style="red")) for m in pair.mismatches]
    cells = [tuple(int(i) for i in where) for where in zip(*pair.differs.nonzero(), strict=True)]
    listed = " ".join(_index(cell) for cell in cells[:CELLS_LISTED])
    more = f" (+{len(cells) - CELLS_LISTED} more)" if len(cells) > CELLS_LISTED else ""
    parts.append(Unbroken(Text(f"  cells that differ: {listed}{more} ({MARK} before each in the "
                               "tables)", style="red")))
    record = _difference_record(pair)
    matrices = tensor_matrices(record, config, opts)
    mark_cells(matrices, record, pair.differs)
    caption = f"{record.name}, computed by mha-tui"
    if pair.mismatches:
        caption += "; nan where only one side is a number (said above)"
    parts.append(Text(caption, style="italic dim"))
    parts.append(matrices[0] if len(matrices) == 1 else Columns(matrices, padding=(0, 3)))
    return Group(*parts)


def row_view(c: Comparison, k: int, opts: RenderOptions) -> Group:
    """One row of the comparison as the transcript prints it."""
    row = c.rows[k]
    parts: list[RenderableType] = [
        HeadingRule(row_heading(c, k, opts), "-" if opts.ascii else "━", LARGEST),
        _line("yours", row.mine, _missing(c, k), opts),
        _line("reference", row.theirs, "the reference has no such stage", opts),
        Text(""),
    ]
    if row.mine is None or row.theirs is None:
        stage = row.mine or row.theirs
        assert stage is not None
        who = "your module's" if row.mine is not None else "the reference's"
        if stage.kind == "error":  # what raised, in torch's words (user text: never markup)
            raised = (c.mine if row.mine is not None else c.theirs).error_type
            parts.append(Unbroken(Text(f"{who} forward raised {raised}: "
                                       f"{printable(stage.explanation)}", style="bold red")))
        if stage.tensors:
            parts.append(Text(f"{who} own tensors:", style="dim"))
            config = drawn_config(c.mine if row.mine is not None else c.theirs)
            parts += [TensorView(t, config, opts) for t in stage.tensors[-1:]]
        parts.append(Text(""))
        return Group(*parts)
    for pair in row.tensors:
        parts.append(pair_view(c, pair, opts))
        parts.append(Text(""))
    return Group(*parts)


def compare_screen(c: Comparison, k: int, opts: RenderOptions) -> Group:
    """One row as the app shows it: who is compared with whom and where they part (the
    weights copied, on the first row), then the row itself."""
    parted = c.parted
    where = (Text.assemble(("they part at ", "bold"),
                           (f"{(c.parting or 0) + 1} {parted.kind}", "bold red"))
             if parted is not None else Text("they never part", style="green"))
    lead = Text.assemble(("yours ", "dim"), (shown_label(c.mine_label), "bold"),
                         ("  against  ", "dim"), (shown_label(c.theirs_label), "bold"), "  ·  ")
    lead.append_text(where)
    parts: list[RenderableType] = [lead]
    if k == 0:
        parts.append(Text("same x for both; your weights copied into the reference by role "
                          "by mha-tui:", style="dim"))
        parts += [Text("  " + printable(line), style="dim") for line in c.weights]
        parts.append(Text(f"a cell differs when |yours - reference's| (computed by mha-tui) "
                          f"exceeds {TOLERANCE}", style="dim"))
    parts.append(Text(""))
    parts.append(row_view(c, k, opts))
    return Group(*parts)


def rail_label(c: Comparison, k: int, ascii_only: bool = False) -> Text:
    """A row on the app's rail: its mark, its kind, and where the two part."""
    row = c.rows[k]
    text = Text.assemble((marks(ascii_only)[row.status], STATUS_STYLES[row.status]), " ", row.kind)
    if k == c.parting:
        text.append(" <" if ascii_only else " ◀", style="bold red")
    return text
