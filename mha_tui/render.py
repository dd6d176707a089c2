"""How a stage and its tensors are drawn: pure Rich renderables, shared by app and transcript.

Everything the learner reads is built here, once, so the TUI and `--dump` cannot drift
apart. Values are formatted from the recorded arrays; nothing is recomputed. Only the
visible window of a tensor is formatted, so cost follows the screen, not the tensor.
User text (tokens) enters only as `Text`, after `printable()`, never as markup.
Never import torch, textual or typer here.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from rich import box
from rich.color import Color
from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.rule import Rule
from rich.style import Style
from rich.table import Table
from rich.text import Text

from .config import Config
from .records import Check, ModuleInfo, Stage, TensorRecord, Trace
from .stages import StageInfo

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
# SIMPLE_HEAD drawn with ASCII: one rule under the header, nothing else.
ASCII_SIMPLE_HEAD = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
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


@lru_cache(maxsize=4096)
def printable(text: str) -> str:
    """User text with every control, format and lone-surrogate character made visible.

    Neither Rich nor Textual strips ESC; this is the one gate tokens pass on their way to
    a terminal or a transcript.
    """
    out = []
    for ch in text:
        category = unicodedata.category(ch)
        if category in ("Cc", "Cs") or (
            category == "Cf" and ord(ch) not in _KEEP_FORMAT and not 0xE0000 <= ord(ch) <= 0xE007F
        ):
            out.append(_stand_in(ch))
        else:
            out.append(ch)
    return "".join(out)


def label(text: str, max_cells: int = LABEL_CELLS, *, ascii_only: bool = False,
          style: Style | str = "") -> Text:
    """A token as a label: literal, safe, at most max_cells wide (ellipsis when cut)."""
    safe = printable(text)
    if ascii_only:
        safe = safe.encode("ascii", "backslashreplace").decode("ascii")
    result = Text(safe, style=style, no_wrap=True, end="")
    if result.cell_len > max_cells:
        result.truncate(max_cells, overflow="ellipsis")
        if ascii_only:
            result = Text(result.plain[:-1] + "~", style=style, no_wrap=True, end="")
    return result


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


def _cell_style(value: float, record: TensorRecord, dim: bool) -> Style:
    if not math.isfinite(value):
        return _INF
    if record.kind == "prob":
        ramp, t = _RAMPS["prob"], float(value)
    else:
        ramp, t = _RAMPS["neg" if value < 0 else "pos"], abs(value) / (_magnitude(record) or 1.0)
    step = min(_STEPS - 1, max(0, round(t * (_STEPS - 1))))
    if dim:
        step //= 4
    return ramp[step]


def _fmt(value: float, kind: str, decimals: int) -> str:
    if kind == "int":
        return str(int(value))
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return f"{value:.{decimals}f}"


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


class Matrix:
    """A 2-D slice drawn as a labelled table: values and/or colour, elided to a window."""

    def __init__(self, values: np.ndarray, record: TensorRecord, rows: Axis, cols: Axis,
                 title: Text | None, opts: RenderOptions, head: int | None = None) -> None:
        self.values, self.record, self.rows, self.cols = values, record, rows, cols
        self.title, self.opts, self.head = title, opts, head
        self._built: RenderableType | None = None

    def _dim(self, head: int | None) -> bool:
        return self.opts.focus is not None and head is not None and head != self.opts.focus

    def _axis_label(self, axis: Axis, i: int) -> Text:
        head = self.head if axis.heads is None else axis.heads[i]
        owned = axis.heads is not None
        style = head_style(head, self._dim(head)) if owned and head is not None else Style(bold=True)
        if self._dim(self.head):
            style = _DIM
        text = (label(axis.labels[i], ascii_only=self.opts.ascii, style=style) if axis.literal
                else Text(axis.labels[i], style=style, no_wrap=True, end=""))
        if axis.sub is not None:
            text.append("\n")
            text.append(axis.sub[i], style=style)
        return text

    def elided(self) -> bool:
        r, c = self.values.shape
        return not self.opts.full and (r > self.opts.max_rows or c > self.opts.max_cols)

    def _build(self) -> RenderableType:
        opts = self.opts
        n_rows, n_cols = self.values.shape
        row_idx = _window(n_rows, opts.max_rows, opts.full)
        col_idx = _window(n_cols, opts.max_cols, opts.full)
        gap = "..." if opts.ascii else "…"
        vgap = ":" if opts.ascii else "⋮"
        table = Table(
            box=ASCII_SIMPLE_HEAD if opts.ascii else box.SIMPLE_HEAD,
            title=self.title, title_justify="left", show_edge=False, pad_edge=False,
            padding=(0, 1), collapse_padding=True, safe_box=opts.ascii,
        )
        table.add_column(Text(""), no_wrap=True, justify="right")
        for j in col_idx:
            header = Text(gap) if j is None else self._axis_label(self.cols, j)
            table.add_column(header, justify="right", no_wrap=True)
        for i in row_idx:
            if i is None:
                table.add_row(Text(vgap), *(Text(vgap) for _ in col_idx))
                continue
            cells: list[Text] = [self._axis_label(self.rows, i)]
            row_head = None if self.rows.heads is None else self.rows.heads[i]
            for j in col_idx:
                if j is None:
                    cells.append(Text(gap, style=_DIM))
                    continue
                col_head = None if self.cols.heads is None else self.cols.heads[j]
                head = self.head if self.head is not None else row_head if row_head is not None else col_head
                cells.append(self._cell(float(self.values[i, j]), self._dim(head)))
            table.add_row(*cells)
        if not self.elided():
            return table
        shown_rows = sum(r is not None for r in row_idx)
        shown_cols = sum(c is not None for c in col_idx)
        return Group(table, _summary(self.values, n_rows, n_cols, shown_rows, shown_cols, opts))

    def renderable(self) -> RenderableType:
        if self._built is None:
            self._built = self._build()
        return self._built

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.renderable())

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.renderable()

    def _cell(self, value: float, dim: bool) -> Text:
        kind, opts = self.record.kind, self.opts
        text = _fmt(value, kind, opts.decimals) if opts.numbers else "   "
        if not opts.color or kind == "int":
            return Text(text, style=_DIM if dim else "", end="")
        return Text(text, style=_cell_style(value, self.record, dim), end="")


def _summary(values: np.ndarray, n_rows: int, n_cols: int, shown_rows: int, shown_cols: int,
             opts: RenderOptions) -> Text:
    import numpy as np

    finite = values[np.isfinite(values)]
    stats = (f"min {finite.min():.{opts.decimals}f}  max {finite.max():.{opts.decimals}f}  "
             f"mean {finite.mean():.{opts.decimals}f}") if finite.size else "no finite values"
    return Text(f"  showing {shown_rows} of {n_rows} rows, {shown_cols} of {n_cols} columns · "
                f"{stats}", style="dim")


# ---------------------------------------------------------------- one tensor


def _channel_axis(n: int, d_h: int | None, prefix: str = "c") -> Axis:
    if d_h is None:
        return Axis([f"{prefix}{c}" for c in range(n)])
    heads = [c // d_h for c in range(n)]
    return Axis([f"{prefix}{c}" for c in range(n)], heads=heads, sub=[f"h{h}" for h in heads])


def _token_axis(config: Config, tags: Sequence[str] | None = None,
                tag_heads: Sequence[int] | None = None) -> Axis:
    return Axis(list(tags) if tags is not None else list(config.tokens), heads=tag_heads,
                literal=True)


def _head_title(record: TensorRecord, head: int, opts: RenderOptions) -> Text:
    dim = opts.focus is not None and head != opts.focus
    return Text.assemble((f"head {head}", head_style(head, dim)),
                         (f"  [0, {head}]", _DIM if dim else "dim"))


def _heads_shown(h: int, opts: RenderOptions) -> list[int]:
    if opts.full or h <= opts.max_heads:
        return list(range(h))
    if opts.focus is not None:
        return [opts.focus]
    return [*range(opts.max_heads - 1), h - 1]


def tensor_matrices(record: TensorRecord, config: Config, opts: RenderOptions) -> list[Matrix]:
    """The 2-D slices a learner reads for this tensor, labelled by what its axes mean."""
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
                                   _head_title(record, i, opts), opts, head=i))
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
        ("strides ", "dim"), str(record.strides).replace(",)", ")"), "  ",
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
        h = record.values.shape[1] if record.dims[:2] == ("B", "h") else 0
        shown = len(_heads_shown(h, opts)) if h else 0
        if h and shown < h:
            yield Text(f"  {shown} of {h} heads shown", style="dim")


# ---------------------------------------------------------------- one stage


def _heading(number: int, total: int, stage_id: str, title: str) -> Text:
    return Text.assemble((f"{number}/{total} ", "dim"), (stage_id, "bold"),
                         ("  ·  ", "dim"), (title, "bold"))


def stage_heading(trace: Trace, stage: Stage) -> Text:
    return _heading(trace.index(stage.id) + 1, len(trace.stages), stage.id, stage.title)


class Code:
    """PyTorch line(s): highlighted on a colour console, plain text on a plain one.

    Plain consoles (the default transcript) would get the same characters from Syntax;
    skipping it spares loading Pygments' lexer, a fifth of a transcript's run time.
    """

    def __init__(self, code: str) -> None:
        self.code = code

    def _renderable(self, console: Console) -> RenderableType:
        if console.no_color or console.color_system is None:
            return Text(self.code)
        from rich.syntax import Syntax  # Pygments costs ~0.1 s to import: only when used

        # Token colours only, no background: the code sits on whatever panel holds it.
        text = Syntax(self.code, "python", theme="monokai").highlight(self.code)
        text.rstrip()
        return text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, Text(self.code))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._renderable(console)


def code_block(code: str) -> Padding:
    """The stage's PyTorch line(s), indented under the word "code"."""
    return Padding(Code(code), (0, 0, 0, 2))


def _intro_panel(body: RenderableType, opts: RenderOptions) -> Panel:
    """The app's frame around a stage's shape, code and explanation."""
    folded = None if opts.explain else Text("e explains", style="dim")
    return Panel(body, border_style=HEAD_COLORS[0], box=box.ASCII if opts.ascii else box.ROUNDED,
                 subtitle=folded, subtitle_align="right")


def stage_screen(trace: Trace, stage: Stage, opts: RenderOptions) -> Group:
    """A whole stage as the app shows it: the transcript's parts, the intro in a panel."""
    return Group(
        stage_heading(trace, stage),
        _intro_panel(stage_intro(stage, opts), opts),
        stage_tensors(trace, stage, opts),
        Text("checks", style="dim"),
        check_lines(stage.checks, opts.ascii),
    )


def pending_screen(info: StageInfo, number: int, total: int, message: Text,
                   opts: RenderOptions) -> Group:
    """A stage before its numbers exist (the app while torch loads): code and explanation."""
    # Plain code here: highlighting loads Pygments, which the first frame cannot wait for.
    intro = Group(Text("code", style="dim"), Padding(Text(info.code), (0, 0, 0, 2)),
                  *([Text(info.explanation)] if opts.explain else []))
    return Group(_heading(number, total, info.id, info.title), _intro_panel(intro, opts), message)


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


def stage_view(trace: Trace, stage: Stage, opts: RenderOptions) -> Group:
    """A whole stage as the transcript prints it (the app lays out the same parts)."""
    rule_chars = "-" if opts.ascii else "━"
    parts: list[RenderableType] = [
        Rule(stage_heading(trace, stage), characters=rule_chars, align="left"),
        stage_intro(stage, opts),
        Text(""),
        stage_tensors(trace, stage, opts),
    ]
    if stage.aside and not opts.wrong_view:
        parts.append(Text("Why not one view(B, h, T, d_h)?", style="bold"))
        parts.append(stage_tensors(trace, replace_tensors(stage), opts))
    parts.append(Text("checks", style="dim"))
    parts.append(check_lines(stage.checks, opts.ascii))
    parts.append(Text(""))
    return Group(*parts)


def replace_tensors(stage: Stage) -> Stage:
    """The stage's aside (the wrong view) in place of its tensors."""
    return replace(stage, tensors=stage.aside, aside=())


def header(config: Config, opts: RenderOptions, width: int | None = None) -> Text:
    """Sentence, tokens with their ids, and B, T, C, h, d_h on one line (wraps if narrow)."""
    text = Text.assemble(("sentence ", "dim"))
    text.append_text(label(config.sentence, max_cells=40, ascii_only=opts.ascii))
    text.append("   tokens ", style="dim")
    for i, (token, token_id) in enumerate(zip(config.tokens[:16], config.ids, strict=False)):
        if i:
            text.append(" ")
        text.append_text(label(token, ascii_only=opts.ascii, style="bold"))
        text.append(f"={token_id}", style="dim")
    if len(config.tokens) > 16:
        text.append(f" … (+{len(config.tokens) - 16})" if not opts.ascii
                    else f" ... (+{len(config.tokens) - 16})", style="dim")
    text.append(f"   B=1 T={config.seq_len} C={config.embed_dim} h={config.num_heads} "
                f"d_h={config.head_dim} seed={config.seed} "
                f"{'causal' if config.causal else 'no mask'}", style="cyan")
    return text


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
