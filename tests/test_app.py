"""Pilot tests of the step-through app: keys, greyed keys, heads, help, loading, sizes."""

from __future__ import annotations

import re
import threading
from io import StringIO

import pytest
from rich.console import Console

from mha_tui.app import ExplainApp
from mha_tui.config import Config
from mha_tui.pipeline import run_trace
from mha_tui.stage_view import StageView
from mha_tui.stages import STAGE_IDS
from mha_tui.widgets import HelpScreen, TooSmall

from .conftest import default_trace


def make_app(**kwargs: object) -> ExplainApp:
    trace = default_trace()
    return ExplainApp(trace.config, trace=trace, **kwargs)  # type: ignore[arg-type]


def text_of(app: ExplainApp, selector: str = "#main") -> str:
    """What a widget shows, as plain text."""
    widget = app.query_one(selector)
    if isinstance(widget, StageView):
        return widget.plain
    console = Console(file=StringIO(), width=max(widget.size.width, 40), color_system=None)
    console.print(widget.render() if isinstance(widget, TooSmall) else widget.content)
    return console.file.getvalue()


def stage_id(app: ExplainApp) -> str:
    return STAGE_IDS[app.stage_index]


async def test_next_and_previous_keys() -> None:
    app = make_app()
    async with app.run_test(size=(100, 32)) as pilot:
        assert stage_id(app) == "embed"
        for key, expected in [("right", "project"), ("l", "view"), ("n", "transpose"),
                              ("space", "scores"), ("left", "transpose"), ("h", "view"),
                              ("p", "project")]:
            await pilot.press(key)
            assert stage_id(app) == expected, key


async def test_first_last_and_number_keys() -> None:
    app = make_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("end")
        assert stage_id(app) == "w_o"
        await pilot.press("home")
        assert stage_id(app) == "embed"
        for digit in "1234567890":
            await pilot.press(digit)
            assert app.stage_index == (int(digit) - 1) % 10
        assert stage_id(app) == "concat"


async def test_keys_that_cannot_act_are_greyed_and_do_nothing() -> None:
    app = make_app()
    async with app.run_test(size=(100, 32)) as pilot:
        assert app.check_action("step", (-1,)) is None
        assert app.check_action("jump", (0,)) is None
        assert app.check_action("step", (1,)) is True
        await pilot.press("left", "home")
        assert stage_id(app) == "embed"
        await pilot.press("end")
        assert app.check_action("step", (1,)) is None
        assert app.check_action("jump", (-1,)) is None
        await pilot.press("right")
        assert stage_id(app) == "w_o"
        # the footer shows them disabled, not hidden
        footer_keys = {b.action: enabled for _, b, enabled, _ in app.screen.active_bindings.values()}
        assert footer_keys["step(1)"] is False and footer_keys["step(-1)"] is True


async def test_start_stage_option() -> None:
    app = make_app(start="softmax")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert stage_id(app) == "softmax"
        assert "every row sums to 1" in text_of(app, "#main")


async def test_tab_cycles_the_focused_head_and_a_shows_all() -> None:
    app = make_app(start="softmax")
    async with app.run_test(size=(100, 32)) as pilot:
        assert app.view.focus is None
        await pilot.press("tab")
        assert app.view.focus == 0
        await pilot.press("tab")
        assert app.view.focus == 1
        await pilot.press("tab")
        assert app.view.focus == 0
        await pilot.press("shift+tab")
        assert app.view.focus == 1
        await pilot.press("a")
        assert app.view.focus is None
        assert app.check_action("all_heads", ()) is None


async def test_one_head_greys_the_head_keys() -> None:
    trace = run_trace(Config("I love AI !", num_heads=1))
    app = ExplainApp(trace.config, trace=trace)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert app.check_action("head", (1,)) is None


async def test_numbers_and_decimals() -> None:
    app = make_app(start="w_o")
    out = default_trace().stage("w_o").tensor("out").values[0, 0, 1]  # -0.2523: no signed zero
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert f"{out:.4f}" in text_of(app, "#main")
        await pilot.press("plus", "plus")
        assert app.view.decimals == 6 and f"{out:.6f}" in text_of(app, "#main")
        for _ in range(10):
            await pilot.press("minus")
        assert app.view.decimals == 0
        assert app.check_action("decimals", (-1,)) is None
        await pilot.press("plus", "v")
        assert not app.view.numbers
        assert f"{out:.1f}" not in text_of(app, "#main")
        await pilot.press("v")
        assert app.view.numbers and f"{out:.1f}" in text_of(app, "#main")


async def test_wrong_view_only_at_transpose() -> None:
    app = make_app()
    async with app.run_test(size=(100, 32)) as pilot:
        assert app.check_action("wrong_view", ()) is None
        await pilot.press("4")
        assert app.check_action("wrong_view", ()) is True
        assert "WRONG" not in text_of(app, "#main")
        await pilot.press("w")
        shown = text_of(app, "#main")
        assert "Q.view(B, h, T, d_h)" in shown and "WRONG" in shown
        assert "love·h1" in shown


async def test_help_screen_lists_every_key() -> None:
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        listed = "\n".join(f"{keys} {desc}" for keys, desc in app.screen.rows)
        for key in ("→", "l", "n", "space", "←", "h", "p", "home", "end", "tab", "↓", "j",
                    "↑", "k", "pgdn", "pgup", "g", "G", "shift+tab", "a", "v", "+", "-", "e",
                    "w", "?", "q", "0", "9"):
            assert key in listed, key
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_clicking_the_rail_jumps() -> None:
    app = make_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.click("#rail", offset=(3, 6))
        assert stage_id(app) == "mask"


async def test_keys_pressed_while_loading_are_kept() -> None:
    release = threading.Event()
    config = Config("I love AI !")

    def slow_loader(c: Config):
        release.wait(10)
        return run_trace(c)

    app = ExplainApp(config, loader=slow_loader)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert "loading" in text_of(app, "#main")
        assert "x = embedding(ids)" in text_of(app, "#main")  # the catalogue is there already
        await pilot.press("right", "right")
        assert stage_id(app) == "view"
        release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.trace is not None and stage_id(app) == "view"
        assert "(1, 4, 4) -> (1, 4, 2, 2)" in text_of(app, "#main")


async def test_a_failed_load_is_shown_not_raised() -> None:
    def broken(c: Config):
        raise MemoryError("simulated")

    app = ExplainApp(Config("I love AI !"), loader=broken)
    async with app.run_test(size=(100, 32)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "Could not run the module: MemoryError: simulated" in text_of(app, "#main")


def too_small(app: ExplainApp) -> bool:
    """The notice is up and the stage is not (the breakpoint classes decide both)."""
    notice, body = app.query_one("#too-small").display, app.query_one("#body").display
    assert notice != body
    return notice


@pytest.mark.parametrize("size", [(50, 20), (100, 10)])
async def test_too_small_terminal_shows_a_notice_and_recovers(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        assert too_small(app)
        assert "Make the terminal larger" in text_of(app, "#too-small")
        for w, h in [(30, 8), (120, 40), (40, 10), (90, 30), (61, 17)] * 3:
            await pilot.resize_terminal(w, h)
        await pilot.resize_terminal(100, 32)
        await pilot.pause()
        assert not too_small(app)
        assert "embedding.weight" in text_of(app, "#main")


async def test_the_notice_follows_the_current_size_on_every_resize() -> None:
    """Issue 8 item 3: the notice used the size from before the last resize."""
    app = make_app()
    async with app.run_test(size=(50, 12)) as pilot:
        await pilot.pause()
        assert too_small(app)
        assert "(now 50x12)" in text_of(app, "#too-small")
        await pilot.resize_terminal(100, 32)
        await pilot.pause()
        assert not too_small(app)
        await pilot.resize_terminal(50, 12)
        await pilot.pause()
        assert too_small(app) and "(now 50x12)" in text_of(app, "#too-small")
        await pilot.resize_terminal(59, 30)  # one column too narrow
        await pilot.pause()
        assert too_small(app) and "59x30" in text_of(app, "#too-small")
        await pilot.resize_terminal(60, 16)  # exactly the minimum
        await pilot.pause()
        assert not too_small(app)


async def test_elision_follows_the_pane_width() -> None:
    trace = run_trace(Config(" ".join(f"t{i}" for i in range(20)), embed_dim=64, num_heads=4))
    shown = {}
    for width in (100, 160):
        app = ExplainApp(trace.config, trace=trace, start="project")
        async with app.run_test(size=(width, 40)) as pilot:
            await pilot.pause()
            text = text_of(app)
            match = re.search(r"showing 16 of 20 rows, (\d+) of 64 columns", text)
            assert match, text
            shown[width] = int(match.group(1))
            # every line fits the pane: columns are left out, never cut
            assert max(map(len, text.splitlines())) <= app.query_one(StageView).text_width
    assert 2 < shown[100] < shown[160] < 64


async def test_no_color_keeps_numbers_and_drops_value_colours(monkeypatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(start="softmax")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert app.view.color is False and app.view.numbers
        assert "0.5308" in text_of(app)


# ---------------------------------------------------------------- scrolling (issue 8 item 2)


def visible(app: ExplainApp) -> str:
    """The stage pane's lines that are on screen now."""
    view = app.query_one(StageView)
    top = round(view.scroll_y)
    return "\n".join(strip.text.rstrip() for strip in view.lines[top:top + view.size.height])


async def test_keys_alone_reach_the_last_tensor_and_the_checks_of_every_stage_at_80x24() -> None:
    """Issue 8 item 2: at 80x24 most of every stage was out of reach of the keyboard."""
    app = make_app()
    trace = default_trace()
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.query_one(StageView)
        for stage in trace.stages:
            await pilot.pause()
            assert stage_id(app) == stage.id and view.scroll_y == 0
            assert view.max_scroll_y > 0, "every stage is taller than 80x24: the test must scroll"
            last_check = stage.checks[-1].label[:30]
            assert last_check not in visible(app)
            await pilot.press("G")
            assert view.scroll_y == view.max_scroll_y
            assert last_check in visible(app)
            # Between the window's top and the checks: the last tensor, at least its last rows.
            lines = view.plain.splitlines()
            checks_at = lines.index("checks")
            last_tensor_at = max(i for i, line in enumerate(lines)
                                 if line.startswith(stage.tensors[-1].name + "  shape"))
            assert last_tensor_at < checks_at and view.scroll_y < checks_at - 3, stage.id
            await pilot.press("right")


async def test_line_page_and_edge_keys_scroll_and_grey_out_at_the_ends() -> None:
    app = make_app(start="project")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        view = app.query_one(StageView)
        page = view.scrollable_content_region.height
        assert app.check_action("scroll", (-1,)) is None and app.check_action("edge", (0,)) is None
        assert app.check_action("scroll", (1,)) is True
        for key, expected in [("down", 1), ("j", 2), ("k", 1), ("up", 0), ("pagedown", page),
                              ("f", 2 * page), ("pageup", page), ("b", 0), ("G", None),
                              ("g", 0), ("ctrl+end", None), ("ctrl+home", 0)]:
            await pilot.press(key)
            assert view.scroll_y == (view.max_scroll_y if expected is None
                                     else min(expected, view.max_scroll_y)), key
        await pilot.press("G")
        assert app.check_action("scroll", (1,)) is None and app.check_action("page", (1,)) is None
        assert app.check_action("scroll", (-1,)) is True
        footer = {b.action: enabled for _, b, enabled, _ in app.screen.active_bindings.values()}
        assert footer["scroll(1)"] is False and footer["scroll(-1)"] is True
        await pilot.press("right")  # a new stage starts at its top
        assert stage_id(app) == "view" and view.scroll_y == 0


async def test_at_60x16_the_embed_stage_shows_numbers_and_e_unfolds_the_explanation() -> None:
    import re

    app = make_app()
    explanation = "The sentence is split on whitespace"
    async with app.run_test(size=(60, 16)) as pilot:
        await pilot.pause()
        assert not too_small(app)
        shown = visible(app)
        assert re.search(r"ids\s+0\s+1\s+2\s+3", shown), shown
        assert explanation not in shown and "e explains" in shown
        await pilot.press("e")
        assert explanation in visible(app)
        await pilot.resize_terminal(100, 32)  # the user's choice outlasts a resize
        await pilot.pause()
        assert app.view.explain
        await pilot.press("e")
        assert explanation not in visible(app)


async def test_the_explanation_follows_the_height_until_e_is_pressed() -> None:
    app = make_app()
    async with app.run_test(size=(100, 20)) as pilot:
        await pilot.pause()
        assert not app.view.explain
        await pilot.resize_terminal(100, 32)
        await pilot.pause()
        assert app.view.explain
        await pilot.resize_terminal(80, 23)
        await pilot.pause()
        assert not app.view.explain


async def test_the_rail_gives_way_below_80_columns() -> None:
    app = make_app()
    async with app.run_test(size=(79, 24)) as pilot:
        await pilot.pause()
        assert not app.query_one("#rail").display
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.query_one("#rail").display


# ---------------------------------------------------------------- footer and help (items 8, 16)


@pytest.mark.parametrize("ascii_only", [False, True])
async def test_every_footer_key_is_visible_at_80_columns(ascii_only: bool) -> None:
    from textual.widgets._footer import FooterKey, FooterLabel  # not exported by textual

    app = make_app(ascii_only=ascii_only)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        keys = list(app.query(FooterKey))
        for widget in [*keys, *app.query(FooterLabel)]:
            assert widget.region.right <= 80, widget
        labels = [key.description for key in keys] + [str(label.render()) for label in app.query(FooterLabel)]
        assert {"Help", "Quit", "Stage", "Scroll", "Head", "Nums", "Dec"} <= set(labels)


async def test_the_help_screen_stops_every_key_behind_it() -> None:
    """Issue 8 item 16: right, tab and number keys changed the stage behind the help."""
    app = make_app(start="project")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        before = (app.stage_index, app.view)
        await pilot.press("right", "l", "space", "left", "tab", "shift+tab", "3", "end", "home",
                          "v", "plus", "minus", "a", "w", "e", "G", "down")
        assert (app.stage_index, app.view) == before
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("right", "tab")
        assert stage_id(app) == "view" and app.view.focus == 0


async def test_the_help_names_every_binding() -> None:
    app = make_app()
    helped = {binding_id for ids, _ in app.HELP for binding_id in ids}
    assert {b.id for b in app.BINDINGS} == helped  # type: ignore[union-attr]
    rows = dict((desc, keys) for keys, desc in app.help_rows())
    assert rows["bottom / top of the stage"] == "G ctrl+end / g ctrl+home"
    assert rows["scroll the stage down / up a line"] == "↓ j / ↑ k"


# ---------------------------------------------------------------- ASCII (item 13)


def screen_glyphs(app: ExplainApp) -> set[str]:
    """Every non-ASCII character on the screen, from Textual's own SVG export."""
    import html
    import re

    svg = app.export_screenshot()
    text = html.unescape(re.sub(r"<[^>]+>", "", svg.split("</style>")[-1]))
    return {ch for ch in text if not ch.isascii()} - {"\xa0"}  # the SVG's spaces


async def test_ascii_means_ascii_everywhere_on_screen() -> None:
    app = make_app(ascii_only=True)
    plain = make_app()
    async with plain.run_test(size=(80, 24)) as pilot:
        await pilot.press("G")
        assert screen_glyphs(plain)  # the test can fail: without --ascii there are glyphs
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for index in range(len(STAGE_IDS)):
            for key in ("g", "G", "tab", "w"):
                await pilot.press(key)
                assert screen_glyphs(app) == set(), (STAGE_IDS[index], key)
            await pilot.press("right")
        await pilot.press("question_mark")
        assert screen_glyphs(app) == set()
        assert "right l n space / left h p" in dict((d, k) for k, d in app.help_rows()).values()
        await pilot.press("escape")
        await pilot.resize_terminal(50, 12)
        await pilot.pause()
        assert screen_glyphs(app) == set()


async def test_numbers_off_with_no_color_keeps_the_numbers(monkeypatch) -> None:
    """`v` without colour would blank every table: the numbers stay, there is nothing else."""
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(start="softmax")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("v")
        await pilot.pause()
        assert not app.view.numbers and "0.5308" in text_of(app)


async def test_code_lines_wrap_in_a_narrow_pane() -> None:
    app = make_app(start="transpose")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        joined = " ".join(" ".join(line.strip(" │") for line in text_of(app).splitlines()).split())
        for line in app.trace.stage("transpose").code.splitlines():
            assert " ".join(line.split()) in joined, line


@pytest.mark.parametrize("size", [(80, 24), (60, 16)])
async def test_header_keeps_the_sizes_with_a_long_sentence(size: tuple[int, int]) -> None:
    words = ("the quick brownish foxes jumped gracefully over seventeen extraordinarily "
             "lazy dogs while curious cats watched attentively")
    trace = run_trace(Config(words, embed_dim=8, num_heads=2))
    app = ExplainApp(trace.config, trace=trace)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        shown = app.export_screenshot()
        plain = re.sub(r"<[^>]+>", "", shown).replace("&#160;", " ")
        assert "d_h=4" in plain and f"T={len(words.split())}" in plain
        assert "MultiHeadAttention" in plain  # and the module line below them


def hidden_columns(text: str) -> int:
    """How many columns a stage's tables leave out, from their `c of n columns` lines."""
    return sum(int(n) - int(c) for c, n in re.findall(r"(\d+) of (\d+) columns?", text))


@pytest.mark.parametrize("size", [(100, 32), (80, 24)])
async def test_narrower_cells_never_show_fewer_columns(size: tuple[int, int]) -> None:
    """Issue 15, item 2: `v` (numbers off) or `-` made each head's 4x4 table show 2 of its 4
    columns. By keys: `v` and `-` x3 on the attention stages leave every column on screen.
    Then for every stage, every decimals setting, numbers on and off, at the pane's real
    width (the app's own line cache, without a repaint per setting): narrower cells hide no
    more columns than wider ones."""
    from dataclasses import replace

    app = make_app(start="scores")
    app._cache_disabled = True  # no background warming between the settings
    async with app.run_test(size=size) as pilot:
        for stage in ("scores", "scale", "mask", "softmax"):
            assert stage_id(app) == stage
            await pilot.press("v")
            await pilot.pause()
            assert not app.view.numbers and hidden_columns(text_of(app)) == 0, stage
            await pilot.press("v", "minus", "minus", "minus")
            await pilot.pause()
            assert app.view.decimals == 1 and hidden_columns(text_of(app)) == 0, stage
            await pilot.press("plus", "plus", "plus", "right")
        width = app.query_one(StageView).text_width
        base = app.view
        for index, stage in enumerate(STAGE_IDS):
            hidden: dict[tuple[bool, int], int] = {}
            for decimals in range(9):
                for numbers in (True, False):
                    app.set_reactive(ExplainApp.view,
                                     replace(base, numbers=numbers, decimals=decimals))
                    lines = app._lines(index, width)
                    hidden[numbers, decimals] = hidden_columns(
                        "\n".join(strip.text for strip in lines))
            for decimals in range(9):
                assert hidden[False, decimals] <= hidden[True, decimals], (stage, decimals)
                if decimals:
                    for numbers in (True, False):
                        assert hidden[numbers, decimals - 1] <= hidden[numbers, decimals], (
                            stage, numbers, decimals)
