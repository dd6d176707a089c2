"""`explain --against` in the app: the rows on the rail, where the two part, the view."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_tui.app.compare import CompareApp, row_ids
from mha_tui.app.stage_view import StageView
from mha_tui.app.widgets import StageRail
from mha_tui.config import Config, Source
from mha_tui.judge.roles import RoleCopyError
from mha_tui.pipeline import compared

from .conftest import settle
from .test_compare import unequal_sides

MISTAKES = Path(__file__).parent / "fixtures" / "mistakes"
CONFIG = Config("I love AI !")


def comparison(name: str | None):
    mine = Source(module=f"{MISTAKES / name}.py:MultiHeadAttention") if name else Source()
    return compared(CONFIG, mine, Source(model="mygpt"))


def shown(app: CompareApp) -> str:
    """The stage view's text, its wrapped lines joined (whitespace runs as one space)."""
    return " ".join(" ".join(strip.text for strip in app.query_one(StageView).lines).split())


def rail(app: CompareApp) -> list[str]:
    options = app.query_one(StageRail)
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


async def test_a_correct_module_never_parts() -> None:
    """mistakes/correct.py against mygpt: every row ✓ on the rail, no parting mark; the
    first row says so and lists how the weights were copied."""
    c = comparison("correct")
    app = CompareApp(CONFIG, comparison=c)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert app.stage_index == 0
        labels = rail(app)
        assert len(labels) == len(c.rows) == 11
        assert all("✓" in label and "◀" not in label for label in labels)
        text = shown(app)
        assert "they never part" in text and "W_Q.weight <- your Q rows 0-3" in text


async def test_a_missing_scale_parts_at_scale() -> None:
    """no_scale.py: the app opens at the scale row, only the reference's, marked on the rail;
    the next row (mask) differs, with mha-tui's difference and the cells that differ."""
    c = comparison("no_scale")
    app = CompareApp(CONFIG, comparison=c)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert row_ids(c)[app.stage_index] == "scale"
        labels = rail(app)
        assert [label for label in labels if "◀" in label] == [labels[app.stage_index]]
        assert "◨" in labels[app.stage_index]  # only in the reference
        text = shown(app)
        assert "they part here" in text and "only in the reference" in text
        assert "it would go between your scores (line 28) and your mask (line 29)" in text
        await pilot.press("right")
        assert row_ids(c)[app.stage_index] == "mask"
        text = shown(app)
        assert "differs (computed by mha-tui): largest difference" in text
        assert "difference, computed by mha-tui: 20 of 32 cells differ" in text
        await pilot.press("enter", "s")  # no drill-down, no re-run here
        assert app.cursor is None and row_ids(c)[app.stage_index] == "mask"


async def test_softmax_on_the_wrong_axis_parts_at_softmax() -> None:
    """softmax_axis.py: both have a softmax; the app opens there, ✗ on the rail."""
    c = comparison("softmax_axis")
    app = CompareApp(CONFIG, comparison=c)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert row_ids(c)[app.stage_index] == "softmax"
        label = rail(app)[app.stage_index]
        assert "✗" in label and "◀" in label


async def test_the_comparison_is_computed_in_the_loading_thread() -> None:
    """Built by the app's worker: the rail becomes the comparison's rows, at the parting one."""
    mine = Source(module=f"{MISTAKES / 'mask_reversed'}.py:MultiHeadAttention")
    app = CompareApp(CONFIG, compare=lambda config: compared(config, mine, Source(model="mygpt")))
    async with app.run_test(size=(100, 32)) as pilot:
        for _ in range(200):
            loading = [w for w in app.workers if w.name == "trace"]
            if loading or app.comparison is not None:
                break
            await pilot.pause(0.05)
        for worker in loading:
            await worker.wait()
        await pilot.pause()
        assert app.comparison is not None, app.load_error
        assert row_ids(app.comparison)[app.stage_index] == "mask"
        assert "they part here" in shown(app)


async def test_weights_that_cannot_be_copied_end_the_app_with_one_line() -> None:
    """A refusal in the loading thread: the app exits 2 and hands the CLI its line."""
    def refuse(config: Config):
        raise RoleCopyError("your Q projection has a bias and --against mygpt's has none")

    app = CompareApp(CONFIG, compare=refuse, refusals=(RoleCopyError,))
    async with app.run_test(size=(100, 32)) as pilot:
        await settle(app, pilot)
    assert app.return_code == 2 and "has a bias" in app.refusal


@pytest.mark.parametrize("size", [(100, 32), (80, 24)])
@pytest.mark.parametrize("name", ["softmax_axis", "mask_reversed"])
async def test_both_sides_show_the_same_columns_on_every_row(name: str, size: tuple[int, int]
                                                             ) -> None:
    """At 100x32 and 80x24 each side of a row gets half the stage's width, and the two
    matrices of a pair leave out the same columns (before, the side with the narrower
    numbers kept a column the other had dropped); heads stand level. At 4 and 6 decimals."""
    app = CompareApp(CONFIG, comparison=comparison(name))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for presses in ([], ["plus", "plus"]):
            await pilot.press(*presses)
            for index in range(len(app.stage_ids)):
                app.stage_index = index
                await pilot.pause()
                text = app.query_one(StageView).plain
                if "yours " in text and "reference" in text and "head 0" in text:
                    assert text.count("head 0") >= 2, app.stage_ids[index]
                assert unequal_sides(text) == [], (app.stage_ids[index], presses)


async def test_a_numpy_module_beside_a_torch_reference() -> None:
    """NumPy code as yours: the app opens where the two part (ScaledBySqrtC: scale), yours
    drawn in its own (h, T, T) layout beside the reference's (B, h, T, T), both marked."""
    c = compared(CONFIG, Source(module=f"{MISTAKES.parent / 'numpy_attn.py'}:ScaledBySqrtC"),
                 Source(model="mygpt"))
    app = CompareApp(CONFIG, comparison=c)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        assert row_ids(c)[app.stage_index] == "scale"
        assert "◀" in rail(app)[app.stage_index]
        text = app.query_one(StageView).plain
        assert "dims (h, T, T)" in text and "dims (B," in text
        assert "*" in text and unequal_sides(text) == []


async def test_the_help_lists_only_the_keys_that_act_in_a_comparison() -> None:
    """`?` in the comparison: stepping, heads, decimals, quit; not the drill-down, the
    re-runs (s, H, c), the wrong view or layers, which do nothing here."""
    from mha_tui.app.widgets import HelpScreen

    app = CompareApp(CONFIG, comparison=comparison("correct"))
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        said = [what for _, what in app.help_rows()]
        assert "next / previous stage" in said and "quit" in said and "this help" in said
        for idle in ("type another sentence", "run again with", "a cursor on the stage's",
                     "the wrong view", "with --hf"):
            assert not any(what.startswith(idle) for what in said), (idle, said)
