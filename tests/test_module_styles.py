"""Module styles named as stages (issue 17): how public modules write the same attention.

`nn.MultiheadAttention(need_weights=False)` walks the same stages as need_weights=True (torch's
scaled_dot_product_attention expanded, its softmax the weights need_weights=True returns);
a fused QKV split by view/permute/unbind (timm) is its own stage; ... Each on a hand-written
module in tests/fixtures/mechanisms/, traced the way `--module` traces it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch

from mha_tui.config import Config, Source
from mha_tui.load.modules import Loaded, load
from mha_tui.pipeline import run_trace
from mha_tui.records import Trace

MECHANISMS = Path(__file__).parent / "fixtures" / "mechanisms"
SENTENCE = "the cat sat on the mat"


def _config(embed_dim: int = 32, heads: int = 4) -> Config:
    return Config(SENTENCE, embed_dim=embed_dim, num_heads=heads)


@cache
def _traced(ref: str, init: tuple[tuple[str, int], ...] = (), embed_dim: int = 32,
            heads: int = 4) -> tuple[Trace, Loaded]:
    source = Source(module=str(MECHANISMS / ref), init=init)
    return run_trace(_config(embed_dim, heads), source), load(_config(embed_dim, heads), source)


def _kinds(trace: Trace) -> list[str]:
    return [stage.kind for stage in trace.stages]


# ---------------------------------------------------------------- need_weights=False


@pytest.mark.parametrize("embed_dim,heads", [(32, 4), (12, 3), (16, 2)])
def test_need_weights_false_walks_the_recipe_like_need_weights_true(embed_dim: int, heads: int) -> None:
    """The wrapped nn.MultiheadAttention called with need_weights=False: every stage of the
    recipe, no unplaced op, and W_O only the output projection's own ops (it held all 29)."""
    import mha_tui

    trace, loaded = _traced("mha_no_weights.py:SelfAttention", embed_dim=embed_dim, heads=heads)
    x, mask = loaded.x, loaded.kwargs.get("attn_mask")
    with_weights = mha_tui.trace(loaded.module.attn, x, call=lambda m, x: m(
        x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False))
    kinds = _kinds(trace)
    assert "op" not in kinds and {"scores", "scale", "mask", "softmax", "attend"} <= set(kinds)
    # the same stages; only the order of scale differs (need_weights=True scales q first)
    assert sorted(kinds) == sorted(["embed", *_kinds(with_weights)])
    w_o = trace.stage("w_o")
    assert [op.name for op in w_o.ops if op.name == "linear"] == ["linear"]
    assert len(w_o.ops) <= 3
    assert trace.stage("w_o").checks[-1].ok is True  # equals the module's own forward


@pytest.mark.parametrize("embed_dim,heads", [(32, 4), (12, 3)])
def test_need_weights_false_softmax_is_what_need_weights_true_returns(embed_dim: int, heads: int) -> None:
    """An independent witness: the same nn.MultiheadAttention asked for its weights
    (need_weights=True, average_attn_weights=False) returns the shown softmax, head by head."""
    trace, loaded = _traced("mha_no_weights.py:SelfAttention", embed_dim=embed_dim, heads=heads)
    x, mask = loaded.x, loaded.kwargs.get("attn_mask")
    with torch.no_grad():
        out, weights = loaded.module.attn(x, x, x, attn_mask=mask, need_weights=True,
                                          average_attn_weights=False)
    shown = torch.from_numpy(trace.stage("softmax").tensors[-1].values)
    assert shown.shape == weights.shape == (1, heads, x.shape[1], x.shape[1])
    assert torch.allclose(shown, weights, atol=1e-6)
    final = torch.from_numpy(trace.stages[-1].tensors[-1].values)
    assert torch.allclose(final, out, atol=1e-6)


def test_need_weights_false_names_torchs_own_tensors() -> None:
    """The packed projection's bias is in_proj_bias (was shown as `attn.bias`), and torch's
    permute(2, 0, 1, 3) back to tokens first is labelled (T, B, h, d_h)."""
    trace, _ = _traced("mha_no_weights.py:SelfAttention")
    names = [t.name for t in trace.stage("project").tensors]
    assert names[:2] == ["attn.in_proj_weight", "attn.in_proj_bias"]
    assert trace.stage("concat").tensors[0].dims == ("T", "B", "h", "d_h")
