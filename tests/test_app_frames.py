"""A step between stages is one repaint: what a key changes is changed before the frame is
drawn (the footer's greyed keys, the stage's scrollbar), not left to a later frame.

These check the state right after the action, without awaiting anything in between: no
timing, only what is already true when the screen next draws.
"""

from __future__ import annotations

import pytest

import mha_tui.app.explain
from mha_tui.app.explain import ExplainApp
from mha_tui.app.stage_view import StageView
from mha_tui.config import Config
from mha_tui.records import Trace

from .conftest import default_trace, settle


def make_app(**kwargs: object) -> ExplainApp:
    trace = default_trace()
    return ExplainApp(trace.config, trace=trace, **kwargs)  # type: ignore[arg-type]


def footer_disabled(app: ExplainApp) -> dict[str, bool]:
    """Each footer key's action -> greyed, as drawn (FooterKey is not exported by textual)."""
    return {key.action: key.has_class("-disabled")  # type: ignore[attr-defined]
            for key in app.screen.query("FooterKey")}


async def test_the_footer_greys_a_key_in_the_step_that_greys_it() -> None:
    """Footer runs its bindings_changed on its own next idle, after the step's repaint had
    reached the screen: a greyed key took a second frame. KeyFooter greys keys at once."""
    app = make_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert footer_disabled(app)["step(-1)"] is True  # the first stage: no previous one
        app.action_step(1)
        assert footer_disabled(app)["step(-1)"] is False  # nothing awaited in between
        app.action_jump(-1)
        assert footer_disabled(app)["step(1)"] is True
        assert footer_disabled(app)["step(-1)"] is False
        await pilot.pause()
        # and what the footer shows is what the bindings say
        enabled = {b.action: on for _, b, on, _ in app.screen.active_bindings.values()
                   if b.show}
        assert all(footer_disabled(app)[action] is (not on) for action, on in enabled.items())


@pytest.mark.parametrize("size", [(100, 32), (100, 60)])
async def test_the_scrollbar_follows_each_stage_at_once(size: tuple[int, int]) -> None:
    """A step between two stages taller than the pane changes the scrollbar's length at
    once, without a layout pass; where the scrollbar comes or goes (a stage that fits in
    60 lines beside one that does not), the layout puts it there. Every stage, both ways."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        view = app.query_one(StageView)
        fits: list[bool] = []
        for index in [*range(1, len(app.stage_ids)), *range(len(app.stage_ids) - 2, -1, -1)]:
            app.action_jump(index)
            height = view.scrollable_content_region.height
            assert view.virtual_size.height == len(view.lines)
            if view.show_vertical_scrollbar and len(view.lines) > height:
                # nothing awaited: the scrollbar already has the new stage's length
                assert view.vertical_scrollbar.window_virtual_size == len(view.lines)
            await pilot.pause()
            assert view.show_vertical_scrollbar == (len(view.lines) > height), index
            if view.show_vertical_scrollbar:
                assert view.vertical_scrollbar.window_virtual_size == len(view.lines)
                assert view.vertical_scrollbar.window_size == height
            assert view.max_scroll_y == max(0, len(view.lines) - height)
            view.scroll_end(animate=False, immediate=True)
            assert view.scroll_y == view.max_scroll_y  # the last line can be reached
            fits.append(len(view.lines) <= height)
        if size[1] == 60:
            assert any(fits) and not all(fits)  # both cases were crossed


@pytest.mark.parametrize("size", [(100, 32), (40, 10)])
async def test_the_forward_starts_after_the_waiting_screen_is_painted(
        size: tuple[int, int], tmp_path, monkeypatch) -> None:
    """The loading thread's `import torch` holds the GIL the first frames need: it starts
    once the waiting line is on screen (the app's "paint" mark written); in a terminal too
    small for the app it starts all the same."""
    marks = tmp_path / "marks"
    monkeypatch.setenv("MHA_TUI_MARKS", str(marks))
    # The fallback timer out of the way: on a loaded machine the first paint can take longer
    # than its 0.5 s, and the forward then started before the paint this test checks.
    monkeypatch.setattr(mha_tui.app.explain, "START_LOADING_AFTER", 60)
    trace = default_trace()
    seen_at_start: list[tuple[str, str]] = []

    def loader(config: Config) -> Trace:
        seen_at_start.append((marks.read_text() if marks.exists() else "",
                              app.query_one(StageView).plain))
        return trace

    app = ExplainApp(trace.config, loader=loader)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await settle(app, pilot, until=lambda: app.trace is not None)
        assert app.trace is trace
        assert len(seen_at_start) == 1
        marked, shown = seen_at_start[0]
        if size == (100, 32):
            assert marked.startswith("paint ")
            assert "loading torch and running" in shown
