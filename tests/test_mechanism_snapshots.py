"""SVG snapshots of the mechanism stages (issue 17): rotary, shared K/V heads, ALiBi and a
sliding window, each on a hand-written module in its public style. Accept a change with
--snapshot-update only after looking at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_tui.app.explain import ExplainApp

MECHANISMS = Path(__file__).parent / "fixtures" / "mechanisms"


def _app(ref: str, stage: str) -> ExplainApp:
    from mha_tui.config import Config, Source
    from mha_tui.pipeline import run_trace

    trace = run_trace(Config("the cat sat on the mat", embed_dim=16, num_heads=4),
                      Source(module=str(MECHANISMS / ref)))
    return ExplainApp(trace.config, trace=trace, start=stage)


@pytest.mark.parametrize("ref,stage", [
    ("llama_rotary.py:LlamaAttention", "rotary"),
    ("llama_rotary.py:LlamaAttention", "kv_repeat"),
    ("alibi.py:BloomAttention", "pos_bias"),
    ("sliding_window.py:SlidingWindowAttention", "mask"),
], ids=["rotary", "shared-kv-heads", "alibi", "sliding-window"])
def test_mechanism_stage_at_100x32(snap_compare, ref: str, stage: str) -> None:
    """The mechanism's own stage as it first appears at 100x32: its title in the rail and the
    heading, the explanation, and its first tensor."""
    assert snap_compare(_app(ref, stage), terminal_size=(100, 32))


def test_encoder_softmax_at_100x32(snap_compare, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny random BERT (`--hf`, tests/hf_families.py): the header's encoder line and the
    softmax stage with no mask before it, every token seeing every token."""
    pytest.importorskip("transformers")
    from mha_tui.load.hf import load
    from mha_tui.pipeline.hf import Session

    from .hf_families import SENTENCE, build

    build("bert", tmp_path / "tiny-bert")
    monkeypatch.chdir(tmp_path)  # the header names the model as given: `--hf tiny-bert`
    session = Session(load("tiny-bert"), SENTENCE)
    trace = session.trace(0)
    app = ExplainApp(trace.config, trace=trace, start="softmax", layers=session)
    assert snap_compare(app, terminal_size=(100, 32))
