"""Pilot tests of the step-through app: keys, greyed keys, heads, help, loading, sizes."""

from __future__ import annotations

import re
import threading
from functools import partial
from io import StringIO

import pytest
from rich.console import Console

from mha_tui.app.explain import ExplainApp
from mha_tui.app.stage_view import StageView
from mha_tui.app.widgets import HelpScreen, TooSmall
from mha_tui.config import Config
from mha_tui.pipeline import run_trace
from mha_tui.stages import STAGE_IDS

from .conftest import default_trace, settle


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
        await settle(app, pilot, until=lambda: app.trace is not None)
        assert app.trace is not None and stage_id(app) == "view"
        assert "(1, 4, 4) -> (1, 4, 2, 2)" in text_of(app, "#main")


async def test_a_failed_load_is_shown_not_raised() -> None:
    def broken(c: Config):
        raise MemoryError("simulated")

    app = ExplainApp(Config("I love AI !"), loader=broken)
    async with app.run_test(size=(100, 32)) as pilot:
        await settle(app, pilot, until=lambda: "Could not run" in text_of(app, "#main"))
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
            last_check = stage.checks[-1].label[:30]
            if view.max_scroll_y == 0:  # its box folded, the whole stage fits
                assert last_check in visible(app), stage.id
                await pilot.press("right")
                continue
            assert last_check not in visible(app)
            await pilot.press("G")
            assert view.scroll_y == view.max_scroll_y
            assert last_check in visible(app)
            # Between the window's top and the checks: the last tensor, at least its last rows.
            lines = view.plain.splitlines()
            checks_at = lines.index("checks")
            last_tensor_at = max(i for i, line in enumerate(lines)
                                 if line.startswith(stage.tensors[-1].name + "  shape"))
            assert last_tensor_at < checks_at, stage.id
            if len(lines) - checks_at < view.size.height - 3:  # the checks fit the window: the
                assert view.scroll_y < checks_at - 3, stage.id  # tensor's last rows above them
            else:  # checks taller than the window (softmax's head scores at 80x24): G still
                assert view.scroll_y <= checks_at + 1, stage.id  # shows them from their top
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


def box_lines(app: ExplainApp) -> list[str]:
    """The stage's box (shape, code, explanation) as shown, border to border."""
    lines = text_of(app).splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    bottom = next(i for i, line in enumerate(lines) if line.startswith("╰"))
    return lines[top:bottom + 1]


def folded(app: ExplainApp) -> bool:
    return "e explains" in box_lines(app)[-1]


async def test_the_explanation_follows_the_height_until_e_is_pressed() -> None:
    app = make_app()
    async with app.run_test(size=(100, 20)) as pilot:
        await pilot.pause()
        assert folded(app)
        await pilot.resize_terminal(100, 32)
        await pilot.pause()
        assert not folded(app)
        await pilot.resize_terminal(80, 23)
        await pilot.pause()
        assert folded(app)
        await pilot.press("e")
        await pilot.resize_terminal(100, 20)
        await pilot.pause()
        assert not folded(app)  # the user's choice, not the height, from now on


@pytest.mark.parametrize("size", [(100, 32), (80, 24), (120, 40), (60, 16)])
async def test_a_box_taller_than_a_third_of_the_screen_starts_folded(
        size: tuple[int, int]) -> None:
    """Issue 15: at 100x32 transpose's box took half the screen. On every stage, the box
    unfolded takes at most a third of the height, or it is folded and would take more;
    `e` unfolds it."""
    from dataclasses import replace

    from mha_tui.app.stage_view import render_strips
    from mha_tui.render.stage import stage_box

    app = make_app()
    async with app.run_test(size=size) as pilot:
        width = app.query_one(StageView).text_width
        for index, stage in enumerate(STAGE_IDS):
            await pilot.press("end" if index == 10 else str((index + 1) % 10))
            await pilot.pause()
            unfolded = render_strips(app.console, stage_box(
                app.trace.stages[index], replace(app.view, explain=True)), width)
            if folded(app):
                assert 3 * len(unfolded) > size[1], stage
                assert len(box_lines(app)) < len(unfolded), stage
            else:
                assert 3 * len(box_lines(app)) <= size[1], stage
        if size == (100, 32):
            await pilot.press("4")
            assert stage_id(app) == "transpose" and folded(app)
            await pilot.press("e")
            await pilot.pause()
            assert not folded(app) and len(box_lines(app)) > size[1] // 3


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
        for _ in range(40):  # the footer composes its keys after the first frame
            if {"Help", "Quit"} <= {key.description for key in app.query(FooterKey)}:
                break
            await pilot.pause(0.05)
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


def _forward_thread() -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == "mha-tui forward"), None)


@pytest.mark.parametrize(("cls", "quit_key"), [("Waiting", "q"), ("Spinning", "ctrl+c")])
async def test_a_forward_that_never_returns_shows_the_app_and_quits(
        monkeypatch: pytest.MonkeyPatch, cls: str, quit_key: str) -> None:
    """Issue 15, item 4: `explain --module loop.py:M` with a forward that never returns left
    the terminal blank (the CLI ran the forward before starting the app) and q was echoed.
    Built as the CLI builds it: the app is up, says whose forward runs and for how long, the
    stage keys work, and q or ctrl+c quits while the forward still runs."""
    import mha_tui.app.loading
    import mha_tui.app.run
    from mha_tui.cli.explain_app import load_for, whose_forward
    from mha_tui.config import Source
    from mha_tui.load.learner import LoadError
    from mha_tui.records.request import Request
    from tests.fixtures import endless

    monkeypatch.setattr(mha_tui.app.loading, "SHOW_ELAPSED_AFTER", 0)  # the seconds from the start
    # package.module form: the test and the learner import see one module, one RELEASE
    source = Source(module=f"tests.fixtures.endless:{cls}")
    config = Config("I love AI !")
    endless.RELEASE.clear()
    app = mha_tui.app.run.explain_app(config, build=partial(load_for, Request(config, source)),
                                  running=whose_forward(source), refusals=(LoadError,))
    try:
        async with app.run_test(size=(100, 32)) as pilot:
            await pilot.pause()
            shown = text_of(app)
            assert re.search(rf"running {cls}\.forward from tests\.fixtures\.endless… \d+ s",
                             shown), shown
            await pilot.press("right")
            assert stage_id(app) == "project" and app.trace is None
            for _ in range(400):  # a guard, not an assertion: the forward starts once the
                if _forward_thread() is not None:  # waiting screen is painted (slow under load)
                    break
                await pilot.pause(0.025)
            await pilot.press(quit_key)
            await pilot.pause()
            assert not app.is_running
        assert app.return_code == 0 and app.refusal is None and app.trace is None
        forward = _forward_thread()
        assert forward is not None and forward.daemon  # still in the forward: left behind
    finally:
        endless.RELEASE.set()
    forward.join(timeout=30)
    assert not forward.is_alive()


async def test_bad_module_input_ends_the_app_with_the_clis_refusal() -> None:
    """Built in the app's thread, a class that is not in the file ends the app: exit code 2
    and the one line the transcript path prints for the same input."""
    import mha_tui.app.loading
    import mha_tui.app.run
    from mha_tui.cli.explain_app import load_for, whose_forward
    from mha_tui.config import Source
    from mha_tui.load.learner import LoadError
    from mha_tui.records.request import Request

    source = Source(module="tests/fixtures/endless.py:Missing")
    config = Config("I love AI !")
    with pytest.raises(LoadError) as refused:
        load_for(Request(config, source), config)
    app = mha_tui.app.run.explain_app(config, build=partial(load_for, Request(config, source)),
                                  running=whose_forward(source), refusals=(LoadError,))
    async with app.run_test(size=(100, 32)) as pilot:
        await settle(app, pilot, until=lambda: app.return_code is not None)
    assert app.return_code == 2 and app.refusal == str(refused.value)
    assert "Missing" in app.refusal


@pytest.mark.parametrize("size", [(60, 16), (60, 20), (70, 24), (79, 24), (80, 24), (100, 32)])
@pytest.mark.parametrize("ascii_only", [False, True])
async def test_help_and_quit_stay_in_the_footer_at_every_width(size: tuple[int, int],
                                                              ascii_only: bool) -> None:
    """Issue 15: below 80 columns the footer lost `? Help q Quit` (60x20). Their keys are
    drawn whole inside the screen at any size the app accepts; at 60x20 the help takes the
    whole width, so nothing of the screen behind shows beside it."""
    app = make_app(ascii_only=ascii_only)
    async with app.run_test(size=size) as pilot:
        await _settle(app, pilot)
        await pilot.pause()  # the footer recomposes once the keys' states are known
        keys = {key.action: key for key in app.screen.query("FooterKey")}
        for action in ("app.help", "app.quit"):
            key = keys.get(action) or keys[action.split(".")[1]]
            assert key.display and key.region.width > 0, action
            assert key.region.right <= size[0], (action, key.region)
        await pilot.press("question_mark")
        await pilot.pause()
        body = app.screen.query_one("#help-body")
        if size[0] < 80:
            assert body.region.x == 0 and body.region.width == size[0]


def why_panel(app: ExplainApp) -> str:
    return text_of(app, "#why-body")


@pytest.mark.parametrize("size", [(100, 32), (60, 16)])
async def test_the_cursor_reaches_every_cell_of_every_stage_and_head(
        size: tuple[int, int]) -> None:
    """Issue 20, item 1: enter puts a cursor on the stage's result; arrows and hjkl move it
    and stop at the edges, tab changes head, esc leaves. On every stage, at its corners and
    on every head, the panel explains the number under the cursor, computed by mha-tui and
    equal to the module's (✓)."""
    from mha_tui.render.tensor import tensor_index
    from mha_tui.why import main_tensor, why

    app = make_app()
    trace = app.trace
    async with app.run_test(size=size) as pilot:
        for index, stage in enumerate(trace.stages):
            await pilot.press("end" if index == 10 else str((index + 1) % 10))
            await pilot.press("a", "enter")  # every head shown: the cursor starts on head 0
            await pilot.pause()
            assert app.cursor == (0, 0, 0), stage.id
            heads, rows, cols = app._bounds()
            assert app.query_one("#why").display
            for head in range(heads):
                for keys, cell in [((), (head, 0, 0)),
                                   (("down",) * (rows + 2), (head, rows - 1, 0)),
                                   (("l",) * (cols + 2), (head, rows - 1, cols - 1)),
                                   (("k",) * (rows + 2), (head, 0, cols - 1)),
                                   (("left",) * (cols + 2), (head, 0, 0))]:
                    await pilot.press(*keys)
                    await pilot.pause()
                    assert app.cursor == cell, (stage.id, keys)
                    record = main_tensor(stage)
                    expected = why(trace, stage.id, tensor_index(record, *cell))
                    shown = why_panel(app)
                    assert "computed by mha-tui" in shown and "✓ equal" in shown, shown
                    assert f"why {record.name}[{', '.join(map(str, expected.index))}]" in shown
                await pilot.press("tab")
            assert stage_id(app) == stage.id  # moving the cursor never changed stage
            await pilot.press("escape")
            await pilot.pause()
            assert app.cursor is None and not app.query_one("#why").display


async def test_a_click_on_a_cell_moves_the_cursor_there() -> None:
    app = make_app(start="scores")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("enter")
        await pilot.pause()
        app.action_cursor_to(1, 3, 2)  # what a click's @click meta runs
        await pilot.pause()
        assert app.cursor == (1, 3, 2) and "why scores[0, 1, 3, 2]" in why_panel(app)
        view = app.query_one(StageView)
        # the cell itself carries the click: find it in the drawn lines and click it
        for y, strip in enumerate(view.lines):
            x = 0
            for seg in strip:
                meta = seg.style.meta if seg.style is not None else {}
                if meta.get("@click") == "app.cursor_to(0, 1, 3)":
                    await pilot.click(StageView, offset=(x + 1 - view.scroll_x,
                                                         y - view.scroll_y))
                    await pilot.pause()
                    assert app.cursor == (0, 1, 3), app.cursor
                    return
                x += seg.cell_length
        raise AssertionError("no clickable cell (0, 1, 3) on screen")


async def _settle(app: ExplainApp, pilot) -> None:
    await pilot.pause()
    await settle(app, pilot)


async def test_s_runs_the_module_on_a_typed_sentence_and_keeps_stage_and_cursor() -> None:
    """Issue 20, item 2: `s` opens a line for a sentence; enter runs the forward again in the
    background (a progress line meanwhile, the old trace on screen until the new one is
    ready), on the same stage with the cursor on the same cell."""
    release = threading.Event()

    def loader(config: Config):
        release.wait(30)
        return run_trace(config)

    app = make_app(start="softmax", loader=loader)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("enter", "down", "down", "right")
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("end", *"space t h e space c a t".split(), "enter")
        await pilot.pause()
        assert app.query_one("#progress").display and "the cat" in text_of(app, "#progress")
        assert app.config.sentence == "I love AI !"  # the old trace stays meanwhile
        assert "weights[0, 0, 2, 1]" in why_panel(app)
        release.set()
        await _settle(app, pilot)
        assert app.config.tokens == ("I", "love", "AI", "!", "the", "cat")
        assert not app.query_one("#progress").display
        assert stage_id(app) == "softmax" and app.cursor == (0, 2, 1)
        assert app.trace.stage("softmax").tensors[-1].values.shape == (1, 2, 6, 6)
        assert "why weights[0, 0, 2, 1]" in why_panel(app) and "✓ equal" in why_panel(app)


async def test_H_cycles_valid_head_counts_and_c_toggles_the_mask() -> None:
    app = make_app(start="mask", loader=run_trace)
    async with app.run_test(size=(100, 32)) as pilot:
        for heads in (4, 1, 2):
            await pilot.press("H")
            await _settle(app, pilot)
            assert app.config.num_heads == heads == app.trace.config.num_heads
            assert stage_id(app) == "mask"
        import numpy as np

        def blocked() -> int:
            return int(np.isneginf(app.trace.stage("mask").tensors[-1].values).sum())

        assert blocked() == 12
        await pilot.press("c")
        await _settle(app, pilot)
        assert not app.config.causal and not app.trace.config.causal and blocked() == 0
        await pilot.press("c")
        await _settle(app, pilot)
        assert app.config.causal and blocked() == 12


@pytest.mark.parametrize(("sentence", "message"), [
    (" ".join(["word"] * 70), "the sentence has 70 tokens but --max-seq-len is 64; raise it "
                              "with --max-seq-len 70"),
    ("   ", "the sentence is empty"),
])
async def test_a_sentence_the_cli_would_refuse_is_refused_with_its_message(
        sentence: str, message: str) -> None:
    from mha_tui.config import ConfigError

    with pytest.raises(ConfigError) as cli:  # what `explain SENTENCE` says for it
        Config(sentence)
    assert message in str(cli.value)
    app = make_app(loader=run_trace)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("s")
        await pilot.pause()
        app.screen.query_one("#sentence-input").value = sentence
        await pilot.press("enter")
        await _settle(app, pilot)
        (said,) = [n.message for n in app._notifications]
        assert said.startswith(str(cli.value))  # the CLI's words, and for a flag the way out
        assert said.endswith("quit with q and run it again with it; the app cannot change "
                             "it)") == ("--" in message)
        assert app.config.sentence == "I love AI !" and app.trace is default_trace()


async def test_hostile_text_is_shown_literally() -> None:
    """Markup and control characters typed (or pasted) into the sentence: shown as they
    are, never interpreted."""
    hostile = "[bold red]x[/] a\x1b[2J b\x07 [link=file:///etc]y[/link]"
    app = make_app(loader=run_trace)
    async with app.run_test(size=(120, 32)) as pilot:
        await pilot.press("s")
        await pilot.pause()
        app.screen.query_one("#sentence-input").value = hostile
        await pilot.press("enter")
        await _settle(app, pilot)
        assert app.config.sentence == hostile
        header = text_of(app, "#header")
        assert "[bold" in header and "red]x[/]" in header and "␛[2J" in header
        assert "\x1b" not in app.export_screenshot() and "\x07" not in header


async def test_c_on_a_module_with_its_own_mask_is_refused_with_the_clis_message() -> None:
    import mha_tui.app.loading
    import mha_tui.app.run
    from mha_tui.cli.explain_app import load_for, whose_forward
    from mha_tui.config import Source
    from mha_tui.load.learner import LoadError
    from mha_tui.records.request import Request

    source = Source(model="raschka")
    config = Config("I love AI !")
    with pytest.raises(LoadError) as cli:
        load_for(Request(Config("I love AI !", causal=False), source), Config("I love AI !", causal=False))
    app = mha_tui.app.run.explain_app(config, build=partial(load_for, Request(config, source)),
                                  running=whose_forward(source), refusals=(LoadError,))
    async with app.run_test(size=(100, 32)) as pilot:
        await _settle(app, pilot)
        first = app.trace
        await pilot.press("c")
        await _settle(app, pilot)
        assert [n.message for n in app._notifications] == [str(cli.value)]
        assert app.trace is first and app.config.causal and app.return_code is None
