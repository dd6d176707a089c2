"""Every output mha-tui writes, and where: one FORMATS table (a row per format: its name,
the --dump extensions that choose it, what it allows, its writer), the writers it names
(`dump.py`: text and JSON transcripts, worksheets, --why; `pictures.py`: SVG, HTML and
Markdown; `heads.py`: `mha-tui heads`' model view in each format; `quiz_view.py`: the quiz's
words; `floats.py`: float32 text), and safe
destinations (`destination.py`: a file replaced only once complete, devices and FIFOs
written through).

A new format is one writer and one row here. Importing this package is cheap: a writer
imports its drawing (rich) when it writes, so the CLI can read the table before anything
heavy is imported. Never import textual, typer or torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from ..judge.compare import Comparison
    from ..kinds._parts.cell import Why
    from ..kinds._parts.quizzing import Question
    from ..records import Trace
    from ..render.options import RenderOptions
    from ..roles import ModelView


@dataclass(frozen=True)
class Page:
    """What a transcript writer is asked to write: the stages from `first` up to `last`
    (None: to the end), drawn `width` columns wide, in colour or not."""

    trace: Trace
    options: RenderOptions
    width: int
    color: bool
    first: int
    last: int | None


def _text(page: Page, out: IO[bytes]) -> None:
    from .dump import to_text

    text = to_text(page.trace, page.options, width=page.width, color=page.color,
                   first=page.first, last=page.last)
    # UTF-8 whatever the locale says: the transcript's bytes do not depend on LANG.
    out.write(text.encode("utf-8"))


def _json(page: Page, out: IO[bytes]) -> None:
    from dataclasses import replace

    from .dump import write_json

    write_json(replace(page.trace, stages=page.trace.stages[:page.last]), out, first=page.first,
               ascii_only=page.options.ascii)


def _picture(writer: str) -> Callable[[Page, IO[bytes]], None]:
    """A picture's writer: `pictures.<writer>`, imported when it writes."""

    def write(page: Page, out: IO[bytes]) -> None:
        from . import pictures

        drawn = getattr(pictures, writer)(page.trace, page.options, page.width,
                                          pictures.Selection(page.first, page.last))
        out.write(drawn.encode("utf-8"))

    return write


HeadsWriter = Callable[["ModelView", "RenderOptions", int, bool, "tuple[int, int] | None"], str]
"""`mha-tui heads --dump`: the model view, the render options, the width, --color and the
head selected (--ablate's), as the format's text."""


def _heads(writer: str) -> HeadsWriter:
    """The model view's writer: `heads.<writer>`, imported when it writes."""

    def write(view: ModelView, options: RenderOptions, width: int, color: bool,
              selected: tuple[int, int] | None) -> str:
        from . import heads

        return getattr(heads, writer)(view, options, width, color, selected)  # type: ignore[no-any-return]

    return write


def _plain(page: Page) -> RenderOptions:
    """A worksheet's and a cell's drawing: --ascii only (they are never elided)."""
    from ..render.options import RenderOptions

    return RenderOptions(ascii=page.options.ascii)


def _worksheet_text(page: Page, asked: tuple[Question, ...]) -> str:
    from .dump import worksheet_text

    return worksheet_text(page.trace, asked, _plain(page), width=page.width)


def _worksheet_json(page: Page, asked: tuple[Question, ...]) -> str:
    from .dump import worksheet_json

    return worksheet_json(page.trace, asked, page.options.ascii)


def _worksheet_md(page: Page, asked: tuple[Question, ...]) -> str:
    from .pictures import worksheet_markdown

    return worksheet_markdown(page.trace, asked, _plain(page), page.width)


def _cell_text(page: Page, why: Why) -> str:
    from .dump import why_text

    return why_text(why, _plain(page), width=page.width, color=page.color)


def _comparison_text(compared: Comparison, options: RenderOptions, width: int, color: bool,
                     out: IO[bytes]) -> None:
    from .dump import comparison_text

    out.write(comparison_text(compared, options, width=width, color=color).encode("utf-8"))


def _comparison_json(compared: Comparison, options: RenderOptions, width: int, color: bool,
                     out: IO[bytes]) -> None:
    from .dump import write_comparison_json

    write_comparison_json(compared, out, ascii_only=options.ascii)


@dataclass(frozen=True)
class OutputFormat:
    """One row of FORMATS: a transcript format of `explain --dump`."""

    name: str
    extensions: tuple[str, ...]
    """--dump's extensions that choose it when --format is not given."""
    write: Callable[[Page, IO[bytes]], None]
    colours: bool = False
    """Whether --color changes it (ANSI codes in text; pictures are always in colour)."""
    sized: bool = True
    """Whether --width and --full apply (JSON is always complete and has no width)."""
    worksheet: Callable[[Page, tuple[Question, ...]], str] | None = None
    """--quiz's worksheet (the questions and the answer key) in it; None: not in this format."""
    comparison: Callable[[Comparison, RenderOptions, int, bool, IO[bytes]], None] | None = None
    """--against's comparison in it (drawn `width` columns wide, in colour or not)."""
    cell: Callable[[Page, Why], str] | None = None
    """--why's explanation of one cell in it."""
    heads: HeadsWriter | None = None
    """`mha-tui heads --dump`'s model view in it."""


FORMATS: dict[str, OutputFormat] = {row.name: row for row in (
    OutputFormat("text", (), _text, colours=True, worksheet=_worksheet_text,
                 comparison=_comparison_text, cell=_cell_text, heads=_heads("to_text")),
    OutputFormat("json", (".json",), _json, sized=False, worksheet=_worksheet_json,
                 comparison=_comparison_json, heads=_heads("to_json")),
    OutputFormat("svg", (".svg",), _picture("to_svg"), heads=_heads("to_svg")),
    OutputFormat("html", (".html", ".htm"), _picture("to_html"), heads=_heads("to_html")),
    OutputFormat("md", (".md", ".markdown"), _picture("to_markdown"), worksheet=_worksheet_md,
                 heads=_heads("to_markdown")),
)}
"""Every transcript format, by name (--format's choices, in this order)."""


def format_of(path: str) -> str:
    """The format --dump's extension chooses (text for any other)."""
    from pathlib import PurePath

    suffix = PurePath(path).suffix.lower()
    return next((row.name for row in FORMATS.values() if suffix in row.extensions), "text")
