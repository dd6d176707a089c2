"""The drill-down's cursor on tensors that are not the attention's own (B, T, C) or
(B, h, T, ·): an op stage's (3, 3) grid and (1, 3, 8) concatenation (odd_ops.py) and a NumPy
module's stages without a batch axis. The cursor reaches the last cell as the matrix draws it,
the cell is highlighted, and the panel explains that cell of the tensor."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_tui.app.explain import ExplainApp
from mha_tui.config import Config, Source
from mha_tui.pipeline import checked
from mha_tui.records.request import Request
from mha_tui.render.tensor import heads_in_columns

from .test_app import text_of

FIXTURES = Path(__file__).parent / "fixtures"


def _trace(source: Source):
    config = Config("the cat sat")
    run, _ = checked(Request(config, source))
    return run(config)


def _reversed(app: ExplainApp) -> list[str]:
    view = app.query_one("#main")
    return [seg.text.strip() for strip in view.lines for seg in strip
            if seg.style is not None and seg.style.reverse and seg.style.meta and seg.text.strip()]


async def _last_cell(trace, stage_id: str, heads: int, rows: int, cols: int,
                     index: tuple[int, ...]) -> str:
    """Enter, then tab to the last head and the arrows past the last row and column: the
    cursor stops on the last cell; returns the panel's text."""
    app = ExplainApp(trace.config, trace=trace, start=stage_id)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert app.cursor == (0, 0, 0), stage_id
        assert app._bounds() == (heads, rows, cols)
        await pilot.press(*["tab"] * (heads - 1), *["down"] * (rows + 2), *["right"] * (cols + 2))
        await pilot.pause()
        assert app.cursor == (heads - 1, rows - 1, cols - 1), stage_id
        value = trace.stage(stage_id).tensors[-1].values[index]
        assert _reversed(app) == [f"{value:.4f}"], stage_id
        if heads == 1 and not heads_in_columns(trace.stage(stage_id).tensors[-1]):
            await pilot.press("tab")  # no heads in this matrix: tab leaves the cursor be
            assert app.cursor == (0, rows - 1, cols - 1), stage_id
        return text_of(app, "#why-body")


@pytest.mark.parametrize(("stage_id", "bounds", "index"), [
    ("op", (1, 3, 3), (2, 2)),  # torch.zeros(3, 3)
    ("op-2", (1, 3, 8), (0, 2, 7)),  # torch.cat((y, x), dim=-1): (1, 3, 8), rows [0, t]
    ("op-3", (1, 4, 2), (3, 1)),  # torch.ones(4, 2)
    ("error", (1, 4, 2), (3, 1)),  # grid @ torch.ones(4, 2) raised
])
async def test_the_cursor_reaches_the_last_cell_of_an_op_stage(
        stage_id: str, bounds: tuple[int, int, int], index: tuple[int, ...]) -> None:
    trace = _trace(Source(module=f"{FIXTURES / 'odd_ops.py'}:OddOps"))
    record = trace.stage(stage_id).tensors[-1]
    shown = await _last_cell(trace, stage_id, *bounds, index)
    assert f"why {record.name}[{', '.join(map(str, index))}]" in shown, shown
    assert "computed by mha-tui" in shown


@pytest.mark.parametrize(("stage_id", "bounds", "index"), [
    ("scores", (2, 3, 3), (1, 2, 2)),  # (h, T, T): one matrix per head, tab to head 1
    ("view", (1, 3, 4), (2, 1, 1)),  # (T, h, d_h): heads side by side in one matrix
])
async def test_the_cursor_reaches_the_last_cell_of_a_numpy_stage(
        stage_id: str, bounds: tuple[int, int, int], index: tuple[int, ...]) -> None:
    trace = _trace(Source(model="blueprint"))
    record = trace.stage(stage_id).tensors[-1]
    shown = await _last_cell(trace, stage_id, *bounds, index)
    assert f"why {record.name}[{', '.join(map(str, index))}]" in shown, shown
    assert "computed by mha-tui" in shown


async def test_a_stage_without_a_cursor_says_so_in_the_panel(monkeypatch) -> None:
    """enter on a stage whose cells mha-tui cannot explain (here: the op kind taken out of
    why's table) opens the panel with the reason; esc closes it, and so does a new stage."""
    from mha_tui import why

    trace = _trace(Source(module=f"{FIXTURES / 'odd_ops.py'}:OddOps"))
    monkeypatch.delitem(why.KINDS, "op")
    app = ExplainApp(trace.config, trace=trace, start="op")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert not app.query_one("#why").display
        await pilot.press("enter")
        await pilot.pause()
        assert app.cursor is None and app.query_one("#why").display
        shown = text_of(app, "#why-body")
        assert "does not explain the cells of a 'op' stage yet" in shown, shown
        await pilot.press("escape")
        await pilot.pause()
        assert not app.query_one("#why").display
        await pilot.press("enter", "right")  # the note again; the next stage closes it
        await pilot.pause()
        assert app.stage_index == trace.stages.index(trace.stage("op")) + 1
        assert not app.query_one("#why").display


async def test_the_cursor_takes_the_one_cell_of_a_scalar(tmp_path) -> None:
    """`return x.sum()`: the 0-d result is drawn as one cell; enter puts the cursor on it and
    the panel explains it (index (): no indices)."""
    path = tmp_path / "scalar.py"
    path.write_text("import torch.nn as nn\n\n\nclass Sum(nn.Module):\n"
                    "    def __init__(self, embed_dim, num_heads):\n        super().__init__()\n\n"
                    "    def forward(self, x):\n        return x.sum()\n")
    trace = _trace(Source(module=f"{path}:Sum"))
    stage = trace.stages[-1]
    assert stage.tensors[-1].values.shape == ()
    app = ExplainApp(trace.config, trace=trace, start=stage.id)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await pilot.press("enter", "down", "right", "tab")
        await pilot.pause()
        assert app.cursor == (0, 0, 0) and app._bounds() == (1, 1, 1)
        assert _reversed(app) == [f"{float(stage.tensors[-1].values):.4f}"]
        shown = text_of(app, "#why-body")
        assert "why sum[]" in shown and "✓ equal" in shown, shown
