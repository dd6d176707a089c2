"""One stage drawn: its heading, the box of shape, code and explanation, its tensors and
checks, as the transcript prints it (`stage_view`) and as the app lays it out
(`stage_screen`, `stage_box`; `pending_*` before the numbers exist). `labelled` gives the
names every transcript and the app show. Never import torch, textual or typer here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.padding import Padding
from rich.panel import Panel
from rich.rule import Rule
from rich.text import Text

from ..config import Config
from ..records import Check, Stage, Trace
from ..stages import StageInfo
from .code import Code, code_block
from .header import drawn_config
from .options import RenderOptions
from .tensor import TensorView, shown_dims
from .text import Unbroken
from .values import HEAD_COLORS

# ---------------------------------------------------------------- one stage


def _heading(number: int, total: int, stage_id: str, title: str) -> Text:
    return Text.assemble((f"{number}/{total} ", "dim"), (stage_id, "bold"),
                         ("  ·  ", "dim"), (title, "bold"))


def stage_heading(trace: Trace, stage: Stage) -> Text:
    return _heading(trace.index(stage.id) + 1, len(trace.stages), stage.id, stage.title)


def _intro_panel(body: RenderableType, opts: RenderOptions) -> Panel:
    """The app's frame around a stage's shape, code and explanation."""
    folded = None if opts.explain else Text("e explains", style="dim")
    return Panel(body, border_style=HEAD_COLORS[0], box=box.ASCII if opts.ascii else box.ROUNDED,
                 subtitle=folded, subtitle_align="right")


def stage_box(stage: Stage, opts: RenderOptions, config: Config | None = None) -> Panel:
    """The app's box above a stage's tensors: shape, code and (unless folded) explanation."""
    return _intro_panel(stage_intro(labelled(stage), opts, config), opts)


def stage_screen(trace: Trace, stage: Stage, opts: RenderOptions) -> Group:
    """A whole stage as the app shows it: the transcript's parts, the intro in a panel."""
    stage = labelled(stage)
    return Group(
        stage_heading(trace, stage),
        stage_box(stage, opts, trace.config),
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


def dims_transition(stage: Stage, config: Config | None) -> str:
    """Stage.dims_transition, `(B, T, C) -> (B, T, h, d_h)`, with the axes named as shown
    (render.tensor.shown_dims)."""
    return replace(stage, dims_in=shown_dims(stage.dims_in, config),
                   dims_out=shown_dims(stage.dims_out, config)).dims_transition


def stage_intro(stage: Stage, opts: RenderOptions, config: Config | None = None) -> Group:
    """Shape transition, the PyTorch line (highlighted), the explanation and any note."""
    parts: list[RenderableType] = [
        Text.assemble(("shape  ", "dim"), (stage.transition, "bold"), "   ",
                      (dims_transition(stage, config), "cyan")),
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

    A complex tensor (Meta's `freqs_cis`, FNet's Fourier transform) is shown as its real and
    imaginary parts, two real tensors named as torch spells them (`t.real`, `t.imag`).
    """
    if any(r.values.dtype.kind == "c" for r in (*stage.tensors, *stage.aside)):
        stage = replace(stage, tensors=tuple(p for r in stage.tensors for p in r.complex_parts()),
                        aside=tuple(p for r in stage.aside for p in r.complex_parts()))
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
        parts.append(TensorView(record, drawn_config(trace), opts))
        parts.append(Text(""))
    return Group(*parts)


class HeadingRule:
    """A stage heading on a rule; when the width cannot hold it, the heading wraps above
    a plain rule rather than being cut."""

    def __init__(self, heading: Text, characters: str, *keep: str | re.Pattern[str]) -> None:
        self.heading, self.characters, self.keep = heading, characters, keep

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.heading.cell_len + 4 <= options.max_width:
            yield Rule(self.heading, characters=self.characters, align="left")
        else:
            yield Unbroken(self.heading, *self.keep)  # never split inside a figure
            yield Rule(characters=self.characters)


def stage_view(trace: Trace, stage: Stage, opts: RenderOptions) -> Group:
    """A whole stage as the transcript prints it (the app lays out the same parts)."""
    stage = labelled(stage)
    rule_chars = "-" if opts.ascii else "━"
    parts: list[RenderableType] = [
        HeadingRule(stage_heading(trace, stage), rule_chars),
        stage_intro(stage, opts, trace.config),
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
