"""The trace is the module's own forward, recorded stage by stage; its invariants hold."""

from __future__ import annotations

import inspect
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from mha_tui.config import Config
from mha_tui.examples import mygpt as model
from mha_tui.load.modules import load
from mha_tui.pipeline import run_trace
from mha_tui.stages import NO_MASK, STAGE_IDS, code_lines

from .conftest import default_trace

EXPECTED_IDS = ("embed", "project", "view", "transpose", "scores", "scale", "mask", "softmax",
                "attend", "concat", "w_o")

CONFIGS = [
    Config("I love AI !"),
    Config("I love AI !", embed_dim=8, num_heads=1, seed=3),
    Config("the cat sat on the mat", embed_dim=12, num_heads=3, seed=1),
    Config("a b c d e f g h i", embed_dim=16, num_heads=8, seed=9, causal=False),
    Config("solo", embed_dim=6, num_heads=2, seed=2),
]


def test_stage_ids_in_order() -> None:
    assert STAGE_IDS == EXPECTED_IDS
    assert tuple(s.id for s in default_trace().stages) == EXPECTED_IDS


def test_every_code_line_is_in_the_source_that_runs() -> None:
    """Each stage shows the statements its ops ran, read from the file that ran."""
    for stage in default_trace().stages:
        assert stage.source is not None, stage.id
        text = open(stage.source.file, encoding="utf-8").read()
        for line in code_lines(stage.code):
            assert line.strip() in text, f"{stage.id}: {line!r} is not what runs"
    source = inspect.getsource(model.MultiHeadAttention.forward)
    for line in code_lines(NO_MASK.code):
        assert line.strip() in source


def test_construction_order_is_the_reference_chapters() -> None:
    """manual_seed, then nn.Embedding(V, C), then W_Q, W_K, W_V, W_O in that order."""
    config = Config("I love AI !")
    torch.manual_seed(0)
    embedding = nn.Embedding(4, 4)
    linears = [nn.Linear(4, 4, bias=False) for _ in range(4)]
    t = default_trace()
    assert np.array_equal(t.stage("embed").tensor("embedding.weight").values,
                          embedding.weight.detach().numpy())
    for name, lin in zip(["W_Q", "W_K", "W_V"], linears, strict=False):
        assert np.array_equal(t.stage("project").tensor(f"{name}.weight").values,
                              lin.weight.detach().numpy())
    assert np.array_equal(t.stage("w_o").tensor("W_O.weight").values, linears[3].weight.detach().numpy())
    assert config.vocab == ("I", "love", "AI", "!") and config.ids == (0, 1, 2, 3)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"C{c.embed_dim}h{c.num_heads}")
def test_final_tensor_is_module_forward(config: Config) -> None:
    t = run_trace(config)
    loaded = load(config)
    embedding, module = loaded.embedding, loaded.module
    with torch.no_grad():
        expected = module(embedding(torch.tensor([config.ids])))
    assert torch.equal(torch.from_numpy(t.stage("w_o").tensor("out").values), expected)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"C{c.embed_dim}h{c.num_heads}")
def test_softmax_and_mask_invariants(config: Config) -> None:
    t = run_trace(config)
    masked = t.stage("mask").tensor("scores").values
    weights = t.stage("softmax").tensor("weights").values
    assert np.allclose(weights.sum(-1), 1.0, atol=1e-6)
    T = config.seq_len
    above = np.triu(np.ones((T, T), dtype=bool), 1)
    if config.causal:
        assert np.isneginf(masked[..., above]).all()
        assert (weights[..., above] == 0).all()
        assert np.isfinite(masked[..., ~above]).all()
    else:
        assert np.isfinite(masked).all()
        assert np.array_equal(masked, t.stage("scale").tensor("scores").values)


def test_no_causal_keeps_mask_stage_and_says_so() -> None:
    t = run_trace(Config("I love AI !", causal=False))
    stage = t.stage("mask")
    assert [r.name for r in stage.tensors] == ["scores"]
    assert stage.tensor("scores").shares_storage is True  # the very same tensor passes through
    # Title, explanation and code say that no mask was applied, not what a mask would do.
    assert "causal mask" not in stage.title.lower() and "no mask" in stage.title.lower()
    assert stage.explanation.startswith("No mask was applied")
    assert "-inf" not in stage.explanation and "earlier tokens" not in stage.explanation
    guard, skipped = stage.code.splitlines()
    assert guard.startswith("if self.causal:") and "False" in guard
    assert "causal_mask[:T, :T]" in skipped and "skipped" in skipped
    assert all("diagonal" not in c.label for c in stage.checks)


FEW = [Config("I love AI !"), Config("I love AI !", num_heads=1), Config("solo"),
       Config("solo", num_heads=1), Config("the cat sat", embed_dim=6, num_heads=3)]


@pytest.mark.parametrize("config", FEW, ids=lambda c: f"T{c.seq_len}h{c.num_heads}")
def test_explanations_follow_the_computed_facts(config: Config) -> None:
    """One head or one token: the words follow contiguity, copying and the wrong view."""
    t = run_trace(config)
    transpose, concat = t.stage("transpose"), t.stage("concat")
    contiguous = transpose.tensor("Q").contiguous
    assert ("not contiguous" in transpose.explanation) is (not contiguous)
    assert ("still contiguous" in transpose.explanation) is contiguous
    wrong = transpose.aside[0]
    differs = not np.array_equal(wrong.values, transpose.tensor("Q").values)
    assert wrong.caption.startswith("WRONG") is differs
    assert ("would NOT do this" in transpose.explanation) is differs
    strided, context = concat.tensors
    copied = not context.shares_storage
    assert copied is (not strided.contiguous)
    assert ("copies the numbers" in concat.explanation) is copied
    assert ("copying nothing" in concat.explanation) is (not copied)
    labels = [c.label for s in t.stages for c in s.checks]
    assert not [label for label in labels if " all 1 " in label or "= 1 separate" in label]


def test_embedding_axis_is_vocab_not_v() -> None:
    """`V` is the values tensor; the embedding table's rows are the vocabulary."""
    assert default_trace().stage("embed").tensor("embedding.weight").dims == ("vocab", "C")


def test_strides_contiguity_and_storage() -> None:
    t = default_trace()
    view_q = t.stage("view").tensor("Q")
    assert view_q.shape == (1, 4, 2, 2) and view_q.strides == (16, 4, 2, 1)
    assert view_q.contiguous and view_q.shares_storage
    tq = t.stage("transpose").tensor("Q")
    assert tq.shape == (1, 2, 4, 2) and tq.strides == (16, 2, 4, 1)
    assert not tq.contiguous and tq.shares_storage
    strided, context = t.stage("concat").tensors
    assert strided.shares_storage and not strided.contiguous
    assert context.contiguous and context.shares_storage is False
    assert t.stage("view").transition == "(1, 4, 4) -> (1, 4, 2, 2)"
    assert t.stage("transpose").dims_transition == "(B, T, h, d_h) -> (B, h, T, d_h)"


def test_token_axes_and_dims_are_labelled() -> None:
    """Every axis has a name from the vocabulary: the builder's `d0, d1, ...` fallback (used
    whenever it cannot name an axis) never appears in the default run, whose stages all
    know B, T, C, h and d_h (tests/test_stage_words.py asserts it for every module)."""
    for stage in default_trace().stages:
        for dims in (stage.dims_in, stage.dims_out):
            assert not any(re.fullmatch(r"d\d+", d) for d in dims), (stage.id, dims)
        for record in stage.tensors:
            assert len(record.dims) == len(record.shape), (stage.id, record.name)
            assert not any(re.fullmatch(r"d\d+", d) for d in record.dims), (stage.id, record.name)
    assert default_trace().stage("transpose").tensor("Q").dims == ("B", "h", "T", "d_h")


def test_wrong_view_scrambles_heads() -> None:
    aside = default_trace().stage("transpose").aside[0]
    # head 0 of the wrong view holds both halves of "I" and of "love": tokens mixed into heads
    assert aside.row_tags == (("I·h0", "I·h1", "love·h0", "love·h1"), ("AI·h0", "AI·h1", "!·h0", "!·h1"))
    right = default_trace().stage("transpose").tensor("Q").values
    assert not np.array_equal(aside.values, right)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"C{c.embed_dim}h{c.num_heads}")
def test_no_check_fails(config: Config) -> None:
    for stage in run_trace(config).stages:
        for check in stage.checks:
            assert check.ok is not False, (stage.id, check.label)


def test_a_broken_module_is_caught_by_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check lines are computed: a softmax over the wrong axis shows up as a failure."""
    real = torch.nn.functional.softmax
    # The module's own `F` swapped for one whose softmax takes the wrong axis (torch's own
    # F.softmax stays intact: torch dispatches through that very name).
    monkeypatch.setattr(model, "F", SimpleNamespace(softmax=lambda s, dim: real(s, dim=-2)))
    t = run_trace(Config("I love AI !"))
    assert any(c.ok is False for c in t.stage("softmax").checks)
