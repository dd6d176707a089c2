"""The drill-down's cursor on a long sentence (issue 20, item 1): a cell in the elided middle
of a matrix is drawn and highlighted, in the app as in the renderables."""

from __future__ import annotations

from mha_tui.app.explain import ExplainApp
from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace


async def test_the_cursor_brings_an_elided_row_and_column_on_screen() -> None:
    trace = run_trace(Config(" ".join(f"w{i}" for i in range(24)), embed_dim=8, num_heads=2),
                      Source(model="mygpt"))
    app = ExplainApp(trace.config, trace=trace, start="scores")
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.pause()
        assert "w12·12" not in app.query_one("#main").plain  # the middle rows are elided
        app.action_cursor_to(1, 12, 12)
        await pilot.pause()
        view = app.query_one("#main")
        assert app.cursor == (1, 12, 12)
        rows = [line.split()[0] for line in view.plain.splitlines() if line.strip()]
        assert "w12·12" in rows
        value = f"{trace.stage('scores').tensors[0].values[0, 1, 12, 12]:.4f}"
        reversed_ = [seg.text.strip() for strip in view.lines for seg in strip
                     if seg.style is not None and seg.style.reverse and seg.text.strip()]
        assert reversed_ == [value]
        await pilot.press("down")  # the cursor walks through the elided rows, each drawn
        assert app.cursor == (1, 13, 12)
        assert "w13·13" in [line.split()[0] for line in view.plain.splitlines() if line.strip()]
