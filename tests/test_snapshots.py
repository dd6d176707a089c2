"""SVG snapshots of the app. Accept a change with --snapshot-update only after looking at it."""

from __future__ import annotations

import pytest

from mha_tui.app.explain import ExplainApp
from mha_tui.stages import STAGE_IDS

from .conftest import default_trace


def app_at(stage: str) -> ExplainApp:
    trace = default_trace()
    return ExplainApp(trace.config, trace=trace, start=stage)


@pytest.mark.parametrize("stage", STAGE_IDS)
def test_every_stage_at_100x32(snap_compare, stage: str) -> None:
    """Each stage of "I love AI !" (C=4, h=2) as it first appears at 100x32."""
    assert snap_compare(app_at(stage), terminal_size=(100, 32))


@pytest.mark.parametrize("stage", STAGE_IDS)
def test_the_end_of_every_stage_by_keys_alone_at_80x24(snap_compare, stage: str) -> None:
    """At 80x24, from the first stage: right to the stage, G to its end. The last tensor and
    the checks are on screen; every footer key, Help and Quit included, is visible."""
    keys = ["right"] * STAGE_IDS.index(stage) + ["G"]
    assert snap_compare(app_at("embed"), press=keys, terminal_size=(80, 24))


def test_embed_shows_numbers_at_60x16(snap_compare) -> None:
    """At the minimum size, 60x16: no rail, the explanation folded (e explains), the ids."""
    assert snap_compare(app_at("embed"), terminal_size=(60, 16))


def test_ascii_only_at_80x24(snap_compare) -> None:
    """--ascii: the stage, the rail's border, the scrollbar and the footer in plain ASCII."""
    trace = default_trace()
    app = ExplainApp(trace.config, trace=trace, start="transpose", ascii_only=True)
    assert snap_compare(app, press=["w", "j", "j"], terminal_size=(80, 24))


def test_ascii_help_at_80x24(snap_compare) -> None:
    """--ascii: the help screen's border and key names in plain ASCII."""
    trace = default_trace()
    app = ExplainApp(trace.config, trace=trace, ascii_only=True)
    assert snap_compare(app, press=["question_mark"], terminal_size=(80, 24))


def test_transpose_with_the_wrong_view_at_80x24(snap_compare) -> None:
    """At 80x24: `w` puts Q.view(B, h, T, d_h) above the right Q, rows coloured by true head."""
    assert snap_compare(app_at("transpose"), press=["w"], terminal_size=(80, 24))


def test_softmax_focused_on_head_1_at_80x24(snap_compare) -> None:
    """At 80x24: tab twice focuses head 1; head 0 dims."""
    assert snap_compare(app_at("softmax"), press=["tab", "tab"], terminal_size=(80, 24))


def test_project_without_numbers_at_80x24(snap_compare) -> None:
    """At 80x24: `v` hides the numbers and leaves the colours of W_Q."""
    assert snap_compare(app_at("project"), press=["v"], terminal_size=(80, 24))


def _model_app(model: str, stage: str) -> ExplainApp:
    from mha_tui.config import Config, Source
    from mha_tui.pipeline import run_trace

    trace = run_trace(Config("I love AI !"), Source(model=model))
    return ExplainApp(trace.config, trace=trace, start=stage)


def test_raschka_masks_before_it_scales_at_100x32(snap_compare) -> None:
    """raschka: the rail reads scores, mask, scale; the mask stage shows masked_fill_ in place."""
    assert snap_compare(_model_app("raschka", "mask"), terminal_size=(100, 32))


def test_many_eyes_heads_as_modules_at_100x32(snap_compare) -> None:
    """many-eyes: each head its own module; softmax shows the heads side by side, no view stage."""
    assert snap_compare(_model_app("many-eyes", "softmax"), terminal_size=(100, 32))


def test_a_crashing_module_ends_with_the_error_at_100x32(snap_compare) -> None:
    """A learner's module that forgets contiguous(): every stage, then the error, last."""
    import torch

    import mha_tui
    from tests.fixtures.crash_attn import CrashingAttention

    torch.manual_seed(0)
    module = CrashingAttention(4, 2).eval()
    trace = mha_tui.trace(module, torch.randn(1, 4, 4), ["I", "love", "AI", "!"])
    assert snap_compare(ExplainApp(trace.config, trace=trace, start="error"), terminal_size=(100, 32))


@pytest.mark.parametrize("stage", ["scores", "softmax"])
def test_drill_into_a_cell_at_100x32(snap_compare, stage: str) -> None:
    """enter, two rows down, one right, tab: the cursor on head 1's [2, 1], the panel below
    showing how that number was made, computed by mha-tui, ✓ against the module's."""
    assert snap_compare(app_at(stage), press=["enter", "down", "down", "right", "tab"],
                        terminal_size=(100, 32))


def test_drill_into_a_cell_at_80x24(snap_compare) -> None:
    """At 80x24 the panel sits below the stage; the cursor's row stays on screen."""
    assert snap_compare(app_at("attend"), press=["enter", "j", "j", "j", "l"],
                        terminal_size=(80, 24))


def test_help_screen_at_80x24(snap_compare) -> None:
    """At 80x24: `?` lists every key."""
    assert snap_compare(app_at("embed"), press=["question_mark"], terminal_size=(80, 24))


def test_too_small_notice(snap_compare) -> None:
    """At 50x12: a notice instead of a broken layout."""
    assert snap_compare(app_at("embed"), terminal_size=(50, 12))


async def test_committed_screenshots_are_current(tmp_path) -> None:
    """screenshots/ is what `make screenshots` produces now, byte for byte."""
    from pathlib import Path

    from mha_tui.screenshots import SHOTS, shoot

    written = await shoot(tmp_path)
    committed = Path(__file__).parent.parent / "screenshots"
    assert sorted(p.name for p in committed.glob("*.svg")) == sorted(shot[0] for shot in SHOTS)
    for path in written:
        assert path.read_bytes() == (committed / path.name).read_bytes(), path.name


def test_against_a_reference_at_a_wrong_stage_at_100x32(snap_compare) -> None:
    """explain --module no_scale.py --against mygpt: the app opens at scale (only the
    reference's, ◀ on the rail), right goes to mask: yours beside the reference's, the
    differing cells marked, mha-tui's difference below."""
    from mha_tui.app.compare import CompareApp
    from mha_tui.config import Config, Source
    from mha_tui.pipeline import compared

    comparison = compared(Config("I love AI !"),
                          Source(module="tests/fixtures/mistakes/no_scale.py:MultiHeadAttention"),
                          Source(model="mygpt"))
    app = CompareApp(comparison.mine.config, comparison=comparison)
    assert snap_compare(app, press=["right"], terminal_size=(100, 32))
