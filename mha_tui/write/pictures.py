"""Pictures of a trace for slides and course notes: SVG, HTML and Markdown transcripts.

The same renderables as the text transcript and the app (`render.stage.stage_view`, `render.header.header`),
recorded on a colour Console and exported with Rich's own `export_svg` / `export_html`, in
the app's colours (`APP_THEME`: Textual's "textual-dark" background and foreground, and the
ANSI palette Textual maps named colours to). Markdown puts each stage under a heading: its code
in a fenced `python` block, its explanation as a paragraph, its tensors and checks in a fenced
text block drawn by the same renderables as the text transcript.

Deterministic (no environment, no clock, Rich's content-derived ids) and offline: the SVG
names its font by `local()` only, never a web address. User text (tokens, file names, source
lines) arrives already made visible by `render.text.printable`; Rich escapes it for XML/HTML, and
the few characters XML cannot hold at all are written as `\\uXXXX` here. Markdown text outside
a fence is backslash-escaped, and a fence is always longer than any run of backticks inside it.
Never import textual, typer or torch here.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import CONSOLE_SVG_FORMAT, Console, RenderableType
from rich.terminal_theme import MONOKAI, TerminalTheme
from rich.text import Text

from ..records import Stage, Trace

if TYPE_CHECKING:
    from ..quiz import Question
from ..render.header import module_line, trace_header
from ..render.options import ASCII_GLYPHS, RenderOptions
from ..render.stage import (
    check_lines,
    dims_transition,
    replace_tensors,
    stage_heading,
    stage_tensors,
    stage_view,
)
from ..render.text import printable

# The app's colours: Textual's "textual-dark" theme (background, foreground), and the ANSI
# palette Textual uses under a dark theme to turn named colours ("cyan", "bold red") into
# true colours, which is Rich's MONOKAI. A test compares these with Textual's own values.
APP_BACKGROUND = (0x12, 0x12, 0x12)
APP_FOREGROUND = (0xE0, 0xE0, 0xE0)
APP_THEME = TerminalTheme(
    APP_BACKGROUND, APP_FOREGROUND,
    [tuple(MONOKAI.ansi_colors[i]) for i in range(8)],
    [tuple(MONOKAI.ansi_colors[i]) for i in range(8, 16)],
)
FONT_STACK = "'Fira Code', 'DejaVu Sans Mono', Menlo, Consolas, monospace"

# Rich's SVG template, its web fonts removed: a picture must not reach the internet. The
# font is named by local() only; without Fira Code installed the viewer's monospace is used.
SVG_FORMAT = re.sub(r",\s*url\([^)]*\) format\(\"[a-z0-9]+\"\)", "", CONSOLE_SVG_FORMAT).replace(
    '<svg class="rich-terminal"', '<svg xml:space="preserve" class="rich-terminal"')

# Characters XML 1.0 cannot hold at all (C0 controls are already made visible by printable()).
_NOT_XML = re.compile("[\ufffe\uffff]")


@dataclass(frozen=True)
class Selection:
    """Which stages a picture holds: trace.stages[first:last] (last None: to the end)."""

    first: int = 0
    last: int | None = None

    def stages(self, trace: Trace) -> Sequence[Stage]:
        return trace.stages[self.first:self.last]


def picture_console(width: int) -> Console:
    """A recording colour Console that ignores the environment (TERM, COLUMNS, NO_COLOR)."""
    # `_environ` is private: Rich has no public switch to stop reading os.environ (see
    # dump.transcript_console).
    return Console(
        file=io.StringIO(), record=True, width=width, color_system="truecolor",
        force_terminal=True, force_jupyter=False, force_interactive=False,
        legacy_windows=False, emoji=False, highlight=False, markup=False,
        soft_wrap=False, no_color=False, _environ={},
    )


def _xml_safe(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _ascii(text: str, opts: RenderOptions) -> str:
    """--ascii: the tool's own glyphs as the text transcript maps them (labels are escaped)."""
    return text.translate(ASCII_GLYPHS) if opts.ascii else text


def _head(trace: Trace, opts: RenderOptions) -> list[RenderableType]:
    parts: list[RenderableType] = [trace_header(trace, opts)]
    if trace.module is not None:
        parts.append(module_line(trace.module, opts))
    parts.append(Text(""))
    return parts


def _title(trace: Trace, stages: Sequence[Stage]) -> str:
    """A picture's title: ours only (the stage ids), never user text."""
    if len(stages) == 1:
        return f"mha-tui · {stages[0].id}"
    return "mha-tui"


def to_svg(trace: Trace, opts: RenderOptions, width: int = 100,
           selection: Selection = Selection()) -> str:
    """One SVG: the header, then each selected stage as the text transcript draws it, in colour."""
    console = picture_console(width)
    for shown in trace.steps or (trace,):  # --decode: every step in turn
        for part in _head(shown, opts):
            console.print(part)
        stages = selection.stages(shown)
        for stage in stages:
            console.print(stage_view(shown, stage, opts))
    svg = console.export_svg(title=_title(trace, stages), theme=APP_THEME, code_format=SVG_FORMAT)
    return _xml_safe(_ascii(svg, opts))


def html_fragment(console: Console, renderables: Sequence[RenderableType], opts: RenderOptions) -> str:
    """A `<pre>` of renderables drawn on console (a recording one), styles inline."""
    for part in renderables:
        console.print(part)
    code = console.export_html(theme=APP_THEME, inline_styles=True, code_format="{code}", clear=True)
    return _xml_safe(_ascii(
        f'<pre class="mha-tui" style="margin:0;font-family:{FONT_STACK};line-height:1.25;'
        f'background:{APP_THEME.background_color.hex};color:{APP_THEME.foreground_color.hex}">'
        f"{code.rstrip()}</pre>", opts))


def stage_section(trace: Trace, stage: Stage, opts: RenderOptions, console: Console) -> str:
    """One stage as an HTML `<section>`; its id is the stage's position (ids may repeat)."""
    number = trace.index(stage.id) + 1
    heading = html.escape(stage_heading(trace, stage).plain)
    # --decode: each step's stages, so ids stay unique across steps
    where = f"step-{trace.step.index + 1}-" if trace.step is not None else ""
    return (f'<section id="{where}stage-{number}" data-stage="{html.escape(stage.id)}" '
            f'aria-label="{heading}">\n{html_fragment(console, [stage_view(trace, stage, opts)], opts)}'
            "\n</section>")


def head_section(trace: Trace, opts: RenderOptions, console: Console) -> str:
    return f"<header>\n{html_fragment(console, _head(trace, opts), opts)}\n</header>"


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ background: {background}; color: {foreground}; margin: 1em; }}
section {{ margin: 0 0 1.5em 0; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def to_html(trace: Trace, opts: RenderOptions, width: int = 100,
            selection: Selection = Selection()) -> str:
    """A standalone HTML page: the header, then one `<section>` per selected stage."""
    console = picture_console(width)
    stages = selection.stages(trace)
    body = []
    for shown in trace.steps or (trace,):  # --decode: every step in turn
        body.append(head_section(shown, opts, console))
        body += [stage_section(shown, stage, opts, console) for stage in selection.stages(shown)]
    return _PAGE.format(title=html.escape(_title(trace, stages)),
                        background=APP_THEME.background_color.hex,
                        foreground=APP_THEME.foreground_color.hex, body="\n".join(body))


# ---------------------------------------------------------------- Markdown

# Punctuation that means something anywhere in a paragraph (GitHub adds $ for math, ~ for
# strikethrough, | for tables), and what means something at the start of a line.
_MD_INLINE = re.compile(r"([\\`*_\[\]<>&|~$])")
_MD_LINE_START = re.compile(r"^(\s*)([#+\-=>])")
_MD_ORDERED = re.compile(r"^(\s*\d+)([.)])")


def _escape_line(line: str) -> str:
    line = _MD_INLINE.sub(r"\\\1", printable(line))
    line = _MD_LINE_START.sub(r"\1\\\2", line)
    return _MD_ORDERED.sub(r"\1\\\2", line)


def md_escape(text: str) -> str:
    """Text for a Markdown paragraph, shown literally: controls made visible, every
    character Markdown would read as markup backslash-escaped (CommonMark allows it before
    any ASCII punctuation); a line break stays a line break."""
    return "  \n".join(_escape_line(line) for line in text.split("\n"))


def code_span(text: str) -> str:
    """Inline code that no backtick run inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{printable(text)}{pad}{ticks}"


def fenced(body: str, info: str = "") -> str:
    """A fenced code block that no backtick run inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{body.rstrip(chr(10))}\n{fence}"


def plain_text(renderables: Sequence[RenderableType], opts: RenderOptions, width: int) -> str:
    """Renderables as the plain text transcript draws them (no colour, trailing blanks cut)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, force_terminal=False,
                      force_jupyter=False, force_interactive=False, legacy_windows=False,
                      emoji=False, highlight=False, markup=False, soft_wrap=False,
                      no_color=True, _environ={})
    for part in renderables:
        console.print(part)
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())
    if opts.ascii:
        text = text.translate(ASCII_GLYPHS).encode("ascii", "backslashreplace").decode("ascii")
    return text


def stage_markdown(trace: Trace, stage: Stage, opts: RenderOptions, width: int = 100) -> str:
    parts = [f"## {md_escape(_ascii(stage_heading(trace, stage).plain, opts))}",
             f"shape {code_span(stage.transition)}   {code_span(dims_transition(stage, trace.config))}",
             fenced("\n".join(printable(line) for line in stage.code.split("\n")), "python"),
             md_escape(stage.explanation)]
    if stage.note:
        parts.append(f"**{md_escape(stage.note)}**")
    body: list[RenderableType] = [stage_tensors(trace, stage, opts)]
    if stage.aside and not opts.wrong_view:
        wrong = stage.aside[0].name.split(".", 1)[-1]
        body += [Text(f"Why not one {wrong}?"), stage_tensors(trace, replace_tensors(stage), opts)]
    body += [Text("checks"), check_lines(stage.checks, opts.ascii)]
    parts.append(fenced(plain_text(body, opts, width), "text"))
    return "\n\n".join(parts)


def to_markdown(trace: Trace, opts: RenderOptions, width: int = 100,
                selection: Selection = Selection()) -> str:
    """Course notes: the header in a fenced block, then one `##` section per selected stage."""
    parts = ["# mha-tui transcript"]
    for shown in trace.steps or (trace,):  # --decode: every step in turn
        if shown.step is not None:
            parts.append(f"# decode step {shown.step.index + 1} of {shown.step.steps}")
        parts.append(fenced(plain_text(_head(shown, opts)[:-1], opts, width), "text"))
        parts += [stage_markdown(shown, stage, opts, width) for stage in selection.stages(shown)]
    return "\n\n".join(parts) + "\n"


def worksheet_markdown(trace: Trace, questions: Sequence[Question], opts: RenderOptions,
                       width: int = 100) -> str:
    """`explain --quiz --dump worksheet.md`: for course notes, the run's header in a fenced
    block, the questions as a numbered list (the stage each is about, what to type), then
    the answer key with where each answer comes from in the records."""
    def item(number: int, first: str, *more: str) -> str:
        pad = " " * (len(str(number)) + 2)
        return f"{number}. {first}" + "".join(f"  \n{pad}{line}" for line in more)

    def text(line: str) -> str:  # a line of its own (a continuation line of an item)
        return md_escape(_ascii(line, opts))

    def inline(words: str) -> str:  # after the item's number: only inline markup escaped
        return _MD_INLINE.sub(r"\\\1", printable(_ascii(words, opts)))

    head: list[RenderableType] = [trace_header(trace, opts)]
    if trace.module is not None:
        head.append(module_line(trace.module, opts))
    parts = ["# mha-tui quiz",
             "Questions about this forward pass, answered from its own recorded numbers.",
             fenced(plain_text(head, opts, width), "text"), "## Questions"]
    parts.append("\n".join(item(n, f"{code_span(q.stage)} {inline(q.text)}", f"*answer with {inline(q.how)}*")
                           for n, q in enumerate(questions, 1))
                 or "(no stage of this trace has a question yet)")
    parts.append("## Answer key")
    parts.append("\n".join(item(n, f"**{inline(q.shown)}**", text(q.source))
                           for n, q in enumerate(questions, 1)) or "(none)")
    return "\n\n".join(parts) + "\n"

