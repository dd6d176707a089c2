"""Masks by shape (issue 17): the mask stage says what it blocks, read from the blocked
entries: causal, a sliding window of w, padding, both, or another pattern."""

from __future__ import annotations

import numpy as np
import pytest

from mha_tui.kinds.mask import mask_shape

from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)

T = 6
ROWS, COLS = np.indices((T, T))
AHEAD = COLS > ROWS


def test_causal_keeps_the_usual_words() -> None:
    assert mask_shape(np.broadcast_to(AHEAD, (1, 4, T, T))).kind == "causal"


@pytest.mark.parametrize("w", [1, 2, 3, T - 1])
def test_a_sliding_window_is_measured(w: int) -> None:
    shape = mask_shape(AHEAD | (ROWS - COLS >= w))
    assert (shape.kind, shape.window) == ("window", w)
    assert f"w = {w}" in shape.title and f"{w - 1} before it" in shape.title


def test_padding_blocks_whole_key_columns() -> None:
    padded = np.zeros((T, T), bool)
    padded[:, [4, 5]] = True
    assert mask_shape(padded).kind == "padding" and "4, 5" in mask_shape(padded).explanation
    assert mask_shape(AHEAD | padded).kind == "causal+padding"


def test_other_patterns_are_not_called_causal() -> None:
    assert mask_shape(AHEAD.T).kind == "other"  # reversed: a token sees only later ones
    per_head = np.stack([AHEAD, AHEAD | (ROWS - COLS >= 2)])
    assert mask_shape(per_head).kind == "other"
    assert mask_shape(np.zeros((T, T), bool)).kind == "none"


@pytest.mark.parametrize("name,layer,title", [
    ("mistral", 0, "Sliding-window mask: each token sees itself and 1 before it (w = 2)"),
    ("gpt-neo", 1, "Sliding-window mask: each token sees itself and 1 before it (w = 2)"),
    ("gpt-neo", 0, "Causal mask: no peeking ahead"),
    ("llama", 0, "Causal mask: no peeking ahead")])
def test_each_family_mask_is_titled_by_its_shape(name: str, layer: int, title: str) -> None:
    """The title follows the blocked entries: GPT-Neo's global layer 0 is causal, its local
    layer 1 a window of 2, as the checkpoint's own attention weights show (zero beyond it)."""
    from .test_families import _attentions, hf_trace

    stage = hf_trace(name, layer).stage("mask")
    assert stage.title == title
    weights = _attentions(name)[layer][0].numpy()
    blocked = stage.tensors[-1].values[0] <= -1e4
    assert np.array_equal(weights == 0, blocked)  # what the title says is what the model did


@pytest.mark.parametrize("layer", [0, 1])
def test_a_model_that_never_scales_is_not_said_to_mask_before_scaling(layer: int) -> None:
    """GPT-Neo divides its scores by nothing: its mask comes before no scaling at all, so the
    note "masks the raw scores, before scaling" would be false there (trial 2, finding 6)."""
    from .test_families import hf_trace

    trace = hf_trace("gpt-neo", layer)
    assert "scale" not in [s.kind for s in trace.stages]
    assert "before scaling" not in trace.stage("mask").note


def test_masking_before_a_later_scale_is_still_said() -> None:
    from mha_tui.config import Config, Source
    from mha_tui.pipeline import run_trace

    trace = run_trace(Config("I love AI !"), Source(model="raschka"))
    kinds = [s.kind for s in trace.stages]
    assert kinds.index("mask") < kinds.index("scale")
    assert "masks the raw scores, before scaling" in trace.stage("mask").note


@pytest.mark.parametrize("name,layer", [("gpt-neo", 1), ("llama", 0), ("gpt-neo", 0)])
def test_softmax_counts_every_entry_the_mask_blocked(name: str, layer: int) -> None:
    """softmax's "N of N masked entries are exactly 0" counts the entries the mask stage
    blocked, -3.4e38 (finfo.min) as well as -inf: GPT-Neo's local layer fills its window with
    finfo.min over a -inf causal mask, Llama fills finfo.min only."""
    from .test_families import hf_trace

    trace = hf_trace(name, layer)
    n_blocked = int(np.count_nonzero(trace.stage("mask").tensors[-1].values <= -1e4))
    line = next(c for c in trace.stage("softmax").checks if "masked entries" in c.label)
    assert line.label == f"{n_blocked} of {n_blocked} masked entries are exactly 0" and line.ok


@pytest.mark.parametrize("padded,title", [
    ([False, False, False, False, True, True], "Padding: keys [PAD]·4, [PAD]·5 blocked for every query"),
    ([False] * 6, "Causal mask: no peeking ahead")])
def test_torch_mha_names_the_mask_it_adds_inside_baddbmm_by_what_it_blocks(
        padded: list[bool], title: str) -> None:
    """nn.MultiheadAttention adds its mask inside baddbmm; a key_padding_mask there is a
    padding mask, not "Causal mask: no peeking ahead ... above the diagonal" (trial 2,
    finding 22). Without padding, the causal attn_mask keeps the causal words."""
    import torch

    import mha_tui

    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(1, 6, 8)
    kpm = torch.tensor([padded])
    causal = None if any(padded) else torch.triu(torch.full((6, 6), float("-inf")), 1)
    trace = mha_tui.trace(module, x, tokens=["the", "cat", "sat", "on", "[PAD]", "[PAD]"],
                          call=lambda m, x: m(x, x, x, key_padding_mask=kpm if any(padded) else None,
                                              attn_mask=causal))
    stage = trace.stage("mask")
    assert stage.title == title
    blocked = stage.tensors[-1].values[0, 0] <= -1e4
    if any(padded):
        assert blocked[:, 4:].all() and not blocked[:, :4].any()
        assert "Keys [PAD]·4, [PAD]·5 are padding" in stage.explanation
        assert "diagonal" not in stage.explanation
