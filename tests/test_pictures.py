"""Pictures for slides and notes: SVG, HTML and Markdown transcripts (`--format svg|html|md`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from markdown_it import MarkdownIt

from mha_tui.config import Config
from mha_tui.render.options import RenderOptions
from mha_tui.render.stage import stage_heading
from mha_tui.write.pictures import APP_THEME, SVG_FORMAT, Selection, md_escape, to_html, to_markdown, to_svg

from .conftest import ROOT, default_trace, run_cli

SVG_NS = "{http://www.w3.org/2000/svg}"
# Tokens a learner may type: Rich markup, an ANSI escape, HTML, Markdown's own syntax.
HOSTILE = ["[bold]x[/bold]", "\x1b[31mred", "<script>", "&amp;", "```", "$x$", "**b**", "|"]


@cache
def hostile_trace():
    from mha_tui.pipeline import run_trace

    return run_trace(Config(" ".join(HOSTILE), embed_dim=4, num_heads=2))


def svg_text(svg: str) -> str:
    """The characters an SVG shows (Rich writes a space as a no-break space)."""
    root = ET.fromstring(svg)
    return "".join(root.itertext()).replace("\xa0", " ")


class _Sections(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sections: list[dict[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self.sections.append(dict(attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_html(page: str) -> _Sections:
    parser = _Sections()
    parser.feed(page)
    parser.close()
    return parser


def test_pictures_use_the_apps_colours() -> None:
    """Background and foreground are textual-dark's; named colours map as the app maps them."""
    from rich.terminal_theme import MONOKAI
    from textual.theme import BUILTIN_THEMES

    colours = BUILTIN_THEMES["textual-dark"].to_color_system().generate()
    assert APP_THEME.background_color.hex.upper() == colours["background"].upper()
    assert APP_THEME.foreground_color.hex.upper() == colours["foreground"].upper()
    assert [APP_THEME.ansi_colors[i] for i in range(16)] == [MONOKAI.ansi_colors[i] for i in range(16)]


def test_svg_parses_and_holds_every_stage() -> None:
    trace = default_trace()
    svg = to_svg(trace, RenderOptions())
    text = svg_text(svg)
    for stage in trace.stages:
        assert stage_heading(trace, stage).plain in text
    # The module's numbers, in the app's colours: softmax's first weight row of head 1.
    weights = trace.stage("softmax").tensor("weights").values[0, 1]
    row = r"\s*".join(re.escape(f"{token}") for token in ["love", *(f"{v:.4f}" for v in weights[1])])
    assert re.search(row, text[text.index("8/11 softmax"):])
    assert "#121212" in svg  # the app's background


def test_pictures_load_nothing_from_the_internet() -> None:
    """Rich's template fetches Fira Code from a CDN; ours names the font by local() only."""
    assert not re.search(r"url\((?!#)", SVG_FORMAT) and "https://cdn" not in SVG_FORMAT
    trace = default_trace()
    for draw in (to_svg, to_html):
        page = draw(trace, RenderOptions())
        addresses = set(re.findall(r"https?://[^\s\"')]+", page))
        assert addresses <= {"http://www.w3.org/2000/svg", "https://www.textualize.io"}, addresses
        assert not re.search(r"url\((?!#)", page)
        assert "<script" not in page and "<link" not in page


def test_svg_converts_with_rsvg_convert(tmp_path: Path) -> None:
    rsvg = shutil.which("rsvg-convert")
    if rsvg is None:
        pytest.skip("rsvg-convert is not installed (apt-get install librsvg2-bin)")
    source = tmp_path / "softmax.svg"
    source.write_text(to_svg(default_trace(), RenderOptions(), 100, Selection(7, 8)), "utf-8")
    png = tmp_path / "softmax.png"
    subprocess.run([rsvg, "-o", str(png), str(source)], check=True, timeout=60)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_holds_every_stage_title_one_section_each() -> None:
    trace = default_trace()
    page = parse_html(to_html(trace, RenderOptions()))
    assert [s["data-stage"] for s in page.sections] == [stage.id for stage in trace.stages]
    text = "".join(page.text)
    for stage in trace.stages:
        assert stage.title in text
        assert stage_heading(trace, stage).plain in text


def _fences(md: str) -> list[tuple[str, str]]:
    """(info, content) of every fenced block, as a CommonMark parser reads the document."""
    return [(t.info, t.content) for t in MarkdownIt("commonmark").parse(md) if t.type == "fence"]


def test_markdown_sections_and_numbers_round_trip() -> None:
    """Each stage a `##` section; the numbers in its text block are the module's, at 4 decimals."""
    trace = default_trace()
    md = to_markdown(trace, RenderOptions(full=True))
    tokens = MarkdownIt("commonmark").parse(md)
    headings = ["".join(child.content for child in tokens[i + 1].children or [])
                for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"]
    assert headings == [stage_heading(trace, s).plain for s in trace.stages]
    fences = _fences(md)
    assert [info for info, _ in fences] == ["text"] + ["python", "text"] * len(trace.stages)
    softmax = fences[2 + 2 * trace.index("softmax")][1]
    weights = trace.stage("softmax").tensor("weights").values[0]  # (h, T, T)
    rows = [line.split() for line in softmax.splitlines()
            if len(line.split()) == 10 and line.split()[0] in ("I", "love", "AI", "!")]
    assert len(rows) == 4
    for head in range(2):  # heads side by side: each row holds head 0's then head 1's
        parsed = np.array([[float(v) for v in row[1 + 5 * head: 5 + 5 * head]] for row in rows])
        np.testing.assert_array_equal(parsed, np.round(weights[head].astype(np.float64), 4))
    # The code block is the module's own line, character for character.
    assert fences[1 + 2 * trace.index("softmax")][1].rstrip("\n") == trace.stage("softmax").code


def test_user_text_is_shown_literally_in_all_three() -> None:
    trace = hostile_trace()
    svg = to_svg(trace, RenderOptions())
    page = to_html(trace, RenderOptions())
    md = to_markdown(trace, RenderOptions())
    assert "\x1b" not in svg + page + md
    shown = [token.replace("\x1b", "␛") for token in HOSTILE]
    svg_shown = svg_text(svg)
    html_shown = "".join(parse_html(page).text)
    md_fenced = "".join(content for _, content in _fences(md))
    for token in shown:
        assert token in svg_shown
        assert token in html_shown
        assert token in md_fenced
    # The ``` token cannot close the header's fence: every stage still has its two blocks.
    assert len(_fences(md)) == 1 + 2 * len(trace.stages)


def test_markdown_escape_renders_literally() -> None:
    text = "*not bold* [a](b) <b>x</b> # h\n1. not a list & $m$ |t|"
    html = MarkdownIt("commonmark").render(md_escape(text))
    assert "<em>" not in html and "<a " not in html and "<b>" not in html and "<ol>" not in html
    assert "*not bold* [a](b) &lt;b&gt;x&lt;/b&gt; # h" in html


def test_cli_format_from_extension_and_one_stage_slide(tmp_path: Path) -> None:
    """`--dump x.svg` writes SVG; `--stage softmax --only` gives exactly that one stage."""
    result = run_cli("explain", "I love AI !", "--dump", str(tmp_path / "s.svg"),
                     "--stage", "softmax", "--only")
    assert result.returncode == 0, result.stderr
    text = svg_text((tmp_path / "s.svg").read_text("utf-8"))
    assert "8/11 softmax" in text and "7/11 mask" not in text and "9/11 attend" not in text
    fast = ("--model", "blueprint")  # NumPy: no torch to import, the same writers
    result = run_cli("explain", "I love AI !", *fast, "--dump", str(tmp_path / "notes.md"))
    md = (tmp_path / "notes.md").read_text("utf-8")
    assert result.returncode == 0 and md.startswith("# mha-tui transcript\n")
    result = run_cli("explain", "I love AI !", *fast, "--dump", str(tmp_path / "page.svg"),
                     "--format", "html")
    assert (tmp_path / "page.svg").read_text("utf-8").startswith("<!DOCTYPE html>")
    assert "--color changes nothing" not in result.stderr.decode()
    result = run_cli("explain", "I love AI !", *fast, "--dump", str(tmp_path / "c.md"), "--color")
    assert result.returncode == 0 and "--color changes nothing" in result.stderr.decode()
    result = run_cli("explain", "I love AI !", *fast, "--dump", "-", "--stage", "mask", "--only")
    shown = result.stdout.decode()
    assert shown.count("/11 ") == 1 and " mask  " in shown and "softmax  " not in shown


def test_a_numpy_picture_never_imports_torch(tmp_path: Path) -> None:
    """`explain --model blueprint --dump x.svg`, the whole CLI run: torch stays out."""
    code = ("import sys, runpy, os\n"
            "os._exit = lambda code: (sys.stdout.flush(), "
            "sys.stderr.write('TORCH ' + str('torch' in sys.modules) + '\\n'), sys.exit(code))\n"
            "sys.argv = ['mha-tui', 'explain'] + sys.argv[1:]\n"
            "runpy.run_module('mha_tui', run_name='__main__')\n")
    for name in ("bp.svg", "bp.md"):
        done = subprocess.run([sys.executable, "-c", code, "I love AI !", "--model", "blueprint",
                               "--dump", str(tmp_path / name)], capture_output=True, cwd=ROOT,
                              timeout=120)
        assert done.returncode == 0 and b"TORCH False" in done.stderr, done.stderr.decode()
        assert "mha_tui/examples/blueprint.py" in (tmp_path / name).read_text("utf-8").replace("\xa0", " ")


@pytest.mark.parametrize(("argv", "message"), [
    (["--dump", "x.svg", "--only"], "--only writes the one stage --stage names"),
    (["--stage", "softmax", "--only"], "--only writes the one stage --stage names"),
    (["--dump", "KEEP", "--stage", "w_o", "--only", "--model", "raschka-wrapper"],
     "this forward has no 'w_o' stage"),
])
def test_only_refusals_are_one_line_and_leave_the_file(tmp_path: Path, argv, message) -> None:
    keep = tmp_path / "keep.svg"
    keep.write_text("old", "utf-8")
    argv = [str(keep) if a == "KEEP" else a for a in argv]
    result = run_cli("explain", "I love AI !", *argv)
    assert result.returncode == 2
    assert message in result.stderr.decode() and len(result.stderr.decode().splitlines()) == 1
    assert keep.read_text("utf-8") == "old"
