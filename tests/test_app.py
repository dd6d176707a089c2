"""Pilot tests of the step-through app: keys, greyed keys, heads, help, loading, sizes."""

from __future__ import annotations

import re
import threading
from io import StringIO

import pytest
from rich.console import Console

from mha_tui.app import ExplainApp, HelpScreen
from mha_tui.config import Config
from mha_tui.stage_view import StageView
from mha_tui.stages import STAGE_IDS
from mha_tui.tracing import run_trace

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
    console.print(widget.content)
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
        for key in ("right", "l", "n", "space", "left", "h", "p", "home", "end", "tab",
                    "shift+tab", "a", "v", "+", "-", "w", "?", "q", "0", "9"):
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


@pytest.mark.parametrize("size", [(50, 20), (100, 10)])
async def test_too_small_terminal_shows_a_notice_and_recovers(size: tuple[int, int]) -> None:
    app = make_app()
    async with app.run_test(size=size) as pilot:
        assert app.screen.has_class("-too-small")
        assert "Make the terminal larger" in text_of(app, "#too-small")
        for w, h in [(30, 8), (120, 40), (40, 10), (90, 30), (61, 17)] * 3:
            await pilot.resize_terminal(w, h)
        await pilot.resize_terminal(100, 32)
        await pilot.pause()
        assert not app.screen.has_class("-too-small")
        assert "embedding.weight" in text_of(app, "#main")


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
