"""The whole model at a glance: every layer x head as a small heatmap with its label, the
scores behind each label, the model's predictions and what removing a head changed.

Pure Rich renderables drawn from a `roles.ModelView` (computed before anything is drawn): the
app's heads screen, `mha-tui heads --dump` in every format and the README's picture draw these
same objects. A heatmap has one character per weight, shaded by its value; when the sentence
has more tokens than a cell has room for, the weights are pooled (each character the mean of
a block of weights) and the grid says so. Never import torch, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from ..roles import KINDS, LABEL_THRESHOLD, HeadRole, ModelView, Predictions, score_line
from .options import RenderOptions
from .text import label as token_label

SHADES = " ·░▒▓█"
ASCII_SHADES = " .:-=#"
SHORT = {"previous-token": "prev", "induction": "ind", "duplicate-token": "dup",
         "first-token": "first", "current-token": "self", "mixed": "mixed"}
LABEL_STYLE = {"previous-token": "bold cyan", "induction": "bold magenta",
               "duplicate-token": "bold yellow", "first-token": "bold blue",
               "current-token": "bold green", "mixed": "dim"}
LAYER_LABEL = 4  # "L11 "
LARGEST_CELL = 16  # characters a side, at most


def cell_size(T: int, heads: int, width: int) -> int:
    """Characters a side of one head's heatmap: T when it fits, else what the width allows
    (a gap of one column between heads and the layer's label on the left)."""
    room = (width - LAYER_LABEL) // max(heads, 1) - 1
    return max(2, min(T, room, LARGEST_CELL))


def layer_top(view: ModelView, layer: int, width: int) -> int:
    """The line of HeadsGrid on which `layer` starts (its title and pooled notes above), for
    the app to scroll the layer under the cursor into view."""
    T = len(view.tokens)
    n = cell_size(T, view.num_heads, width)
    return 1 + (n < T) + layer * (n + 2)


def pooled(weights: np.ndarray, n: int) -> np.ndarray:
    """(T, T) -> (n, n): each entry the mean of a block of weights (rows and columns split
    as evenly as np.array_split splits them). n >= T: the weights themselves."""
    T = weights.shape[-1]
    if n >= T:
        return weights
    bins = np.array_split(np.arange(T), n)
    return np.array([[weights[np.ix_(rows, cols)].mean() for cols in bins] for rows in bins])


def shade(value: float, ascii_only: bool) -> str:
    ramp = ASCII_SHADES if ascii_only else SHADES
    if not np.isfinite(value) or value <= 0:
        return ramp[0]
    return ramp[min(len(ramp) - 1, 1 + int(value * (len(ramp) - 1)))]


def _color(value: float) -> str:
    level = round(60 + 195 * float(np.clip(value, 0, 1))) if value > 0 else 40
    return f"rgb({level // 3},{level // 2},{level})"


def short_label(role: HeadRole, width: int) -> Text:
    """`ind 0.93` (or `ind` where there is no room), styled by the label."""
    best = role.score(role.label).value if role.label != "mixed" else None
    words = SHORT[role.label] + (f" {best:.2f}" if best is not None else "")
    if len(words) > width:
        words = SHORT[role.label][:width]
    return Text(words.ljust(width), style=LABEL_STYLE[role.label])


class HeadsGrid:
    """Every layer x head as a heatmap of its weights (row: query, column: key) with its label.

    selected: the (layer, head) the app's cursor is on, drawn in reverse. A renderable: its
    size follows the width it is given.
    """

    def __init__(self, view: ModelView, opts: RenderOptions | None = None,
                 selected: tuple[int, int] | None = None) -> None:
        self.view, self.opts, self.selected = view, opts or RenderOptions(), selected

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        view, ascii_only = self.view, self.opts.ascii
        T, h = len(view.tokens), view.num_heads
        n = cell_size(T, h, options.max_width)
        yield Text(f"{view.n_layers} layers x {h} heads; each square: one head's weights, row = "
                   f"query token, column = key token ({T} tokens)", style="dim")
        if n < T:
            yield Text(f"pooled to fit: {T} tokens in {n} x {n} characters, each the mean of a "
                       f"block of about {T / n:.1g} x {T / n:.1g} weights", style="yellow")
        for layer in range(view.n_layers):
            maps = [pooled(view.weights[layer][head].astype(np.float64), n) for head in range(h)]
            for row in range(n):
                line = Text(f"L{layer}".ljust(LAYER_LABEL) if row == 0 else " " * LAYER_LABEL)
                for head, square in enumerate(maps):
                    for value in square[row]:
                        line.append(shade(float(value), ascii_only),
                                    style=_color(float(value)) if self.opts.color else "")
                    line.append(" " if head < h - 1 else "")
                yield line
            labels = Text(" " * LAYER_LABEL)
            for head in range(h):
                role = view.role(layer, head)
                text = short_label(role, n)
                if self.selected == (layer, head):
                    text.stylize("reverse")
                labels.append_text(text)
                labels.append(" " if head < h - 1 else "")
            yield labels
            names = Text(" " * LAYER_LABEL, style="dim")
            for head in range(h):
                names.append(f"{layer}.{head}".ljust(n) + (" " if head < h - 1 else ""),
                             style="reverse" if self.selected == (layer, head) else "dim")
            yield names
        ramp = ASCII_SHADES if ascii_only else SHADES
        yield Text(f"shade: weight 0 '{ramp[0]}' … 1 '{ramp[-1]}'; label: the head's highest "
                   f"score when it is at least {LABEL_THRESHOLD}", style="dim")


def roles_table(view: ModelView, opts: RenderOptions,
                heads: Sequence[tuple[int, int]] | None = None) -> Table:
    """Every head's five scores and its label (or only `heads`)."""
    table = Table(title="head scores, from this run's weights", title_justify="left",
                  show_edge=False, pad_edge=False, box=None)
    table.add_column("head")
    table.add_column("label")
    for kind in KINDS:
        table.add_column(SHORT[kind], justify="right")
    chosen = heads if heads is not None else [(layer, head) for layer in range(view.n_layers)
                                              for head in range(view.num_heads)]
    for layer, head in chosen:
        role = view.role(layer, head)
        cells = ["-" if role.score(kind).value is None else f"{role.score(kind).value:.3f}"
                 for kind in KINDS]
        table.add_row(role.name, Text(role.label, style=LABEL_STYLE[role.label]), *cells)
    return table


def formulas(view: ModelView) -> Group:
    """Which entries each score averages, for this sentence (the same for every head)."""
    first = view.roles[0][0] if view.roles and view.roles[0] else None
    lines: list[RenderableType] = [Text("each score averages entries of a head's weights "
                                        "w[i, k] (query row i, key column k):", style="bold")]
    if first is not None:
        for score in first.scores:
            lines.append(Text(f"  {score.kind} = {score.formula}; {score.entries_text()}"))
    if not view.repeated:
        lines.append(Text("  no token of this sentence occurs twice: induction and duplicate-token "
                          "scores need a repeat (--repeat runs the sentence twice)", style="yellow"))
    return Group(*lines)


def head_detail(view: ModelView, layer: int, head: int) -> Group:
    """One head: its scores and label, and the entries of its own weights behind each."""
    role = view.role(layer, head)
    lines: list[RenderableType] = [Text.assemble((f"head {role.name}", "bold"),
                                                 f" (layer {layer}, head {head}): ",
                                                 (role.label, LABEL_STYLE[role.label]))]
    lines.append(Text("  " + score_line(role)))
    w = view.weights[layer][head]
    for score in role.scores:
        if score.value is None:
            continue
        shown = [" + ".join(f"{w[i, k]:.2f}" for k in keys) for i, keys in score.entries[:6]]
        more = ", …" if len(score.entries) > 6 else ""
        lines.append(Text(f"  {score.kind} {score.value:.3f} = mean of {len(score.entries)}: "
                          f"{', '.join(shown)}{more}", style="dim"))
    return Group(*lines)


def predictions_table(view: ModelView, opts: RenderOptions) -> RenderableType:
    """Each position's token, the next one, the top prediction (and after the ablation)."""
    before = view.predictions
    if before is None:
        return Text(f"{view.name} is an encoder: it predicts no next token", style="dim")
    after = view.ablation.after if view.ablation is not None else None
    table = Table(show_edge=False, pad_edge=False, box=None, title_justify="left",
                  title="next-token predictions (position t predicts the token at t + 1)")
    table.add_column("t", justify="right")
    table.add_column("token")
    table.add_column("next")
    table.add_column("predicted")
    if after is not None:
        table.add_column(f"without {view.ablation.layer}.{view.ablation.head}")  # type: ignore[union-attr]
    table.add_column("repeat")
    T = len(view.tokens)
    for t in range(T):
        nxt = view.tokens[t + 1] if t + 1 < T else ""
        row: list[RenderableType] = [str(t), _token(view.tokens[t], opts), _token(nxt, opts)]
        row.append(_prediction(before, t, view, opts))
        if after is not None:
            row.append(_prediction(after, t, view, opts, changed=after.top[t] != before.top[t]))
        row.append("copy" if t in before.copyable else "")
        table.add_row(*row)
    return Group(table, _summary(view, before, after))


def _token(text: str, opts: RenderOptions) -> Text:
    return token_label(text, 12, ascii_only=opts.ascii)


def _prediction(p: Predictions, t: int, view: ModelView, opts: RenderOptions,
                changed: bool = False) -> Text:
    right = t + 1 < len(view.ids) and p.top[t] == view.ids[t + 1]
    text = _token(p.top_words[t], opts)
    text.append(f" {p.top_probability[t]:.2f}", style="dim")
    text.append(" ✓" if right else (" ✗" if t in p.copyable else ""),
                style="green" if right else "red")
    if changed:
        text.stylize("bold")
    return text


def _summary(view: ModelView, before: Predictions, after: Predictions | None) -> Text:
    def acc(p: Predictions) -> str:
        return "-" if p.accuracy is None else f"{p.accuracy:.0%}"

    text = Text(f"loss {before.loss:.4f} nats; accuracy on the repeat ({len(before.copyable)} "
                f"positions marked copy) {acc(before)}")
    if after is not None and view.ablation is not None:
        a = view.ablation
        to = "zero" if a.method == "zero" else "its mean over the positions"
        text.append(f"\nhead {a.layer}.{a.head} removed ({a.method}: its slice of the input to "
                    f"{a.projection} set to {to}): "
                    f"loss {after.loss:.4f} ({after.loss - before.loss:+.4f}), accuracy on the "
                    f"repeat {acc(after)}; top prediction changed at "
                    f"{sum(x != y for x, y in zip(before.top, after.top, strict=True))} of "
                    f"{len(before.top)} positions", style="bold")
    if not before.copyable:
        text.append("\nno position can be predicted by copying an earlier repeat "
                    "(--repeat runs the sentence twice)", style="yellow")
    return text


def heads_header(view: ModelView, opts: RenderOptions) -> Text:
    text = Text.assemble(("model ", "dim"), view.name, (f" ({view.class_name})", "dim"),
                         f"  layers={view.n_layers} h={view.num_heads} T={len(view.tokens)}\n",
                         ("tokens ", "dim"))
    for i, token in enumerate(view.tokens):
        text.append_text(_token(token, opts))
        text.append(f"·{i} ", style="dim")
    return text


def heads_view(view: ModelView, opts: RenderOptions,
               selected: tuple[int, int] | None = None) -> Group:
    """What `mha-tui heads --dump` writes: header, grid, scores, formulas, predictions."""
    parts: list[RenderableType] = [heads_header(view, opts), Text(), HeadsGrid(view, opts, selected),
                                   Text(), roles_table(view, opts), Text(), formulas(view)]
    if selected is not None:
        parts += [Text(), head_detail(view, *selected)]
    parts += [Text(), predictions_table(view, opts)]
    return Group(*parts)
