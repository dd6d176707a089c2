"""Every --model, traced: its stage kinds in its own order, its final tensor torch.equal to
module(x), its per-head weights and context equal to a computation written here from the
module's parameters (never from its forward)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha_tui.config import Config, Source
from mha_tui.load.modules import load
from mha_tui.pipeline import run_trace

FUSED = ["embed", "project", "view", "transpose", "scores", "scale", "mask", "softmax", "attend",
         "concat", "w_o"]
KINDS = {
    "mygpt": FUSED,
    "course": FUSED,
    "raschka": ["embed", "project", "view", "transpose", "scores", "mask", "scale", "softmax",
                "attend", "concat", "w_o"],
    "raschka-wrapper": ["embed", "project", "scores", "mask", "scale", "softmax", "attend", "concat"],
    "many-eyes": ["embed", "project", "scores", "scale", "mask", "softmax", "attend", "concat", "w_o"],
}
CONFIGS = [Config("I love AI !"), Config("the cat sat on the mat", embed_dim=12, num_heads=3, seed=4),
           Config("solo", embed_dim=6, num_heads=1, seed=2)]


def _layers(module: torch.nn.Module, name: str) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each head's (q, k, v) weight rows and biases, read from the parameters."""
    if name in ("raschka-wrapper", "many-eyes"):
        out = []
        for head in module.heads:
            q, k, v = ((head.W_query, head.W_key, head.W_value) if name == "raschka-wrapper"
                       else (head.query, head.key, head.value))
            out.append((q, k, v))
        return out
    q, k, v = {"mygpt": ("W_Q", "W_K", "W_V"), "course": ("W_q", "W_k", "W_v"),
               "raschka": ("W_query", "W_key", "W_value")}[name]
    return [(getattr(module, q), getattr(module, k), getattr(module, v))]


def _independent(module: torch.nn.Module, name: str, x: torch.Tensor, h: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q_i k_i^T / sqrt(d_h), causal) and its product with v_i, head by head."""
    T = x.shape[1]
    blocked = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    weights, context = [], []
    layers = _layers(module, name)
    for i in range(h):
        if len(layers) == 1:
            q_l, k_l, v_l = layers[0]
            d_h = q_l.weight.shape[0] // h
            rows = slice(i * d_h, (i + 1) * d_h)
            proj = [F.linear(x, lin.weight[rows], None if lin.bias is None else lin.bias[rows])
                    for lin in (q_l, k_l, v_l)]
        else:
            proj = [lin(x) for lin in layers[i]]
        q, k, v = proj
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(blocked, float("-inf"))
        w = F.softmax(scores, dim=-1)
        weights.append(w)
        context.append(w @ v)
    return torch.stack(weights, dim=1), torch.stack(context, dim=1)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"T{c.seq_len}C{c.embed_dim}h{c.num_heads}")
@pytest.mark.parametrize("name", list(KINDS))
def test_every_model_traced(name: str, config: Config) -> None:
    trace = run_trace(config, Source(model=name))
    assert [s.kind for s in trace.stages] == KINDS[name]
    loaded = load(config, Source(model=name))
    with torch.no_grad():
        expected = loaded.forward()
        weights, context = _independent(loaded.module, name, loaded.x, config.num_heads)
    final = torch.from_numpy(trace.stages[-1].tensors[-1].values)
    assert torch.equal(final, expected)
    got_w = torch.from_numpy(np.ascontiguousarray(trace.stage("softmax").tensors[-1].values))
    got_c = torch.from_numpy(np.ascontiguousarray(trace.stage("attend").tensors[-1].values))
    assert torch.allclose(got_w, weights, atol=1e-6) and torch.allclose(got_c, context, atol=1e-6)
    for stage in trace.stages:
        assert stage.source is not None or stage.kind == "embed", stage.id
        for check in stage.checks:
            assert check.ok is not False, (name, stage.id, check.label)
    assert trace.module is not None and trace.module.per_head_modules is (
        name in ("raschka-wrapper", "many-eyes"))


@pytest.mark.parametrize("name", ["raschka-wrapper", "many-eyes"])
def test_heads_joined_by_cat_are_explained_as_a_cat(name: str) -> None:
    """Per-head modules join their outputs with torch.cat: the words say so, and never speak
    of a transpose or a contiguous() copy that did not happen."""
    concat = run_trace(Config("I love AI !"), Source(model=name)).stage("concat")
    assert "torch.cat(" in concat.code
    assert "torch.cat along the last axis" in concat.explanation
    assert "contiguous()" not in concat.explanation and "transpose" not in concat.code
