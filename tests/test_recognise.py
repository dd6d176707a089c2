"""Any attention module, traced op by op: stage kinds in the module's own order, the final
tensor equal to the module's forward, per-head weights and context equal to an independent
computation written here (from the module's parameters, without its forward)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mha_tui
from mha_tui.records import Trace

from .conftest import ROOT
from .fixtures.crash_attn import CrashingAttention
from .fixtures.einsum_attn import EinsumAttention
from .fixtures.nanogpt_attn import CausalSelfAttention

T, C, H = 5, 8, 2


def _x(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(1, T, C)


def _causal(T: int) -> torch.Tensor:
    return torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # True: may not look


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head: softmax(q k^T / sqrt(d_h) with -inf above the diagonal) and weights @ v."""
    d_h = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_h)
    scores = scores.masked_fill(_causal(q.shape[-2]), float("-inf"))
    weights = F.softmax(scores, dim=-1)
    return weights, weights @ v


def _heads(t: torch.Tensor) -> torch.Tensor:
    B, T_, C_ = t.shape
    return t.view(B, T_, H, C_ // H).transpose(1, 2)


def _final(trace: Trace) -> torch.Tensor:
    return torch.from_numpy(trace.stage("w_o").tensors[-1].values)


def _assert_weights_and_context(trace: Trace, weights: torch.Tensor, context: torch.Tensor) -> None:
    got_w = torch.from_numpy(np.ascontiguousarray(trace.stage("softmax").tensors[-1].values))
    got_c = torch.from_numpy(np.ascontiguousarray(trace.stage("attend").tensors[-1].values))
    assert got_w.shape == weights.shape and torch.allclose(got_w, weights, atol=1e-6)
    assert got_c.shape == context.shape and torch.allclose(got_c, context, atol=1e-6)


def _no_failed_checks(trace: Trace) -> None:
    for stage in trace.stages:
        for check in stage.checks:
            assert check.ok is not False, (stage.id, check.label)


def test_nanogpt_fused_projection_and_sdpa() -> None:
    torch.manual_seed(3)
    module = CausalSelfAttention(C, H).eval()
    x = _x()
    trace = mha_tui.trace(module, x)
    assert [s.kind for s in trace.stages] == ["project", "view", "transpose", "scores", "scale",
                                              "mask", "softmax", "attend", "concat", "w_o"]
    with torch.no_grad():
        assert torch.equal(_final(trace), module(x))
        q, k, v = module.c_attn(x).split(C, dim=2)
        weights, context = _reference(_heads(q), _heads(k), _heads(v))
    _assert_weights_and_context(trace, weights, context)
    _no_failed_checks(trace)
    expanded = [s for s in trace.stages if "expansion" in s.title]
    assert [s.kind for s in expanded] == ["scores", "scale", "mask", "softmax", "attend"]
    assert all("mha-tui" in s.note and "reference" in s.note for s in expanded)
    check = trace.stage("attend").checks[0]
    assert "allclose(rtol=1e-05, atol=1e-06) = True" in check.label and check.ok
    assert trace.stage("scores").code.startswith("y = F.scaled_dot_product_attention(")
    assert trace.stage("project").source is not None
    assert trace.stage("project").source.file.endswith("nanogpt_attn.py")
    assert [t.name for t in trace.stage("project").tensors][-3:] == ["q", "k", "v"]


def test_torch_multihead_attention_shows_the_steps_inside_it() -> None:
    torch.manual_seed(4)
    module = nn.MultiheadAttention(C, H, batch_first=True).eval()
    x = _x(1)
    mask = _causal(T)
    trace = mha_tui.trace(module, x, call=lambda m, inp: m(inp, inp, inp, attn_mask=mask))
    kinds = [s.kind for s in trace.stages]
    assert kinds[:9] == ["project", "view", "transpose", "scale", "scores", "mask", "softmax",
                         "attend", "concat"]
    assert kinds[9] == "w_o"
    # the steps are torch's own lines, inside F.multi_head_attention_forward
    assert trace.stage("softmax").source.file.endswith("torch/nn/functional.py")
    with torch.no_grad():
        out, expected_weights = module(x, x, x, attn_mask=mask, need_weights=True,
                                       average_attn_weights=False)
        q, k, v = F.linear(x, module.in_proj_weight, module.in_proj_bias).split(C, dim=-1)
        weights, context = _reference(_heads(q), _heads(k), _heads(v))
    assert torch.allclose(weights, expected_weights, atol=1e-6)
    _assert_weights_and_context(trace, weights, context)
    assert torch.allclose(_final(trace), out, atol=1e-6)
    _no_failed_checks(trace)


def test_einsum_module_with_raw_weight_parameters() -> None:
    torch.manual_seed(5)
    module = EinsumAttention(C, H).eval()
    x = _x(2)
    trace = mha_tui.trace(module, x)
    assert [s.kind for s in trace.stages] == ["project", "view", "scores", "scale", "mask",
                                              "softmax", "attend", "concat", "w_o"]
    with torch.no_grad():
        assert torch.equal(_final(trace), module(x))
        weights, context = _reference(_heads(x @ module.W_q), _heads(x @ module.W_k),
                                      _heads(x @ module.W_v))
    _assert_weights_and_context(trace, weights, context)
    _no_failed_checks(trace)


def test_a_crashing_module_shows_every_stage_then_the_error() -> None:
    torch.manual_seed(6)
    module = CrashingAttention(C, H).eval()
    trace = mha_tui.trace(module, _x(3))
    assert [s.kind for s in trace.stages] == ["project", "view", "transpose", "scores", "scale",
                                              "softmax", "attend", "concat", "error"]
    assert trace.failed
    error = trace.stages[-1]
    assert error.code.startswith("context = (weights @ v).transpose(1, 2).view(B, T, C)")
    with pytest.raises(RuntimeError) as raised:
        module(_x(3))
    assert error.explanation == str(raised.value)
    assert error.source is not None and error.source.file.endswith("crash_attn.py")


def test_the_error_type_is_a_field_of_the_error_stage_not_read_from_its_title() -> None:
    """kinds/error.py sets Stage.raised where it makes the stage; Trace.error_type reads it,
    so a retitled stage (a notebook, another language) still says what raised."""
    from dataclasses import replace

    from mha_tui.records import Trace

    torch.manual_seed(6)
    trace = mha_tui.trace(CrashingAttention(C, H).eval(), _x(3))
    assert trace.stages[-1].raised == "RuntimeError" == trace.error_type
    assert trace.raised.startswith("RuntimeError at crash_attn.py line ")
    retitled = replace(trace.stages[-1], title="Der Vorwärtslauf brach ab")
    again = Trace(trace.config, (*trace.stages[:-1], retitled), trace.module, trace.recording)
    assert again.error_type == "RuntimeError"
    assert all(stage.raised == "" for stage in trace.stages[:-1])


class InPlaceMaskFirst(nn.Module):
    """Seed 003's order: raw scores masked in place, then scaled inside softmax's argument."""

    def __init__(self) -> None:
        super().__init__()
        self.W_query = nn.Linear(C, C, bias=False)
        self.W_key = nn.Linear(C, C, bias=False)
        self.W_value = nn.Linear(C, C, bias=False)
        self.out_proj = nn.Linear(C, C)
        self.register_buffer("mask", torch.triu(torch.ones(16, 16), diagonal=1))

    def forward(self, x):
        b, num_tokens, _ = x.shape
        keys = self.W_key(x).view(b, num_tokens, H, C // H).transpose(1, 2)
        queries = self.W_query(x).view(b, num_tokens, H, C // H).transpose(1, 2)
        values = self.W_value(x).view(b, num_tokens, H, C // H).transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, C)
        return self.out_proj(context_vec)


def test_in_place_mask_before_scaling() -> None:
    torch.manual_seed(7)
    module = InPlaceMaskFirst().eval()
    x = _x(4)
    trace = mha_tui.trace(module, x)
    assert [s.kind for s in trace.stages] == ["project", "view", "transpose", "scores", "mask",
                                              "scale", "softmax", "attend", "concat", "w_o"]
    raw = trace.stage("scores").tensors[-1].values
    assert np.isfinite(raw).all()  # recorded before masked_fill_ rewrote the tensor
    with torch.no_grad():
        assert torch.equal(_final(trace), module(x))
        q, k = _heads(module.W_query(x)), _heads(module.W_key(x))
        assert torch.allclose(torch.from_numpy(raw), q @ k.transpose(-2, -1), atol=1e-6)
        weights, context = _reference(q, k, _heads(module.W_value(x)))
    _assert_weights_and_context(trace, weights, context)
    _no_failed_checks(trace)
    assert "in place" in trace.stage("mask").note


class Head(nn.Module):
    def __init__(self, head_size: int) -> None:
        super().__init__()
        self.key = nn.Linear(C, head_size, bias=False)
        self.query = nn.Linear(C, head_size, bias=False)
        self.value = nn.Linear(C, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(16, 16)))

    def forward(self, x):
        T_ = x.shape[1]
        k = self.key(x)
        q = self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:T_, :T_] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        v = self.value(x)
        return wei @ v


class ManyHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList([Head(C // H) for _ in range(H)])
        self.proj = nn.Linear(C, C)

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        return self.proj(out)


def test_per_head_modules_are_shown_side_by_side() -> None:
    torch.manual_seed(8)
    module = ManyHeads().eval()
    x = _x(5)
    trace = mha_tui.trace(module, x)
    assert [s.kind for s in trace.stages] == ["project", "scores", "scale", "mask", "softmax",
                                              "attend", "concat", "w_o"]
    assert trace.module is not None and trace.module.per_head_modules
    with torch.no_grad():
        assert torch.equal(_final(trace), module(x))
        ws, cs = [], []
        for head in module.heads:
            w, c = _reference(head.query(x), head.key(x), head.value(x))
            ws.append(w)
            cs.append(c)
    _assert_weights_and_context(trace, torch.stack(ws, dim=1), torch.stack(cs, dim=1))
    _no_failed_checks(trace)


def test_recognise_never_imports_torch() -> None:
    code = ("import sys\nimport mha_tui.recognise, mha_tui.kinds.registry, mha_tui.records\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


class _FinfoMaskAttention(torch.nn.Module):
    """One head, masked with masked_fill(finfo.min) as GPT-2 does, not with -inf."""

    def __init__(self, d: int = 4) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / 2.0  # (B, T, T)
        blocked = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # (T, T)
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)  # (B, T, T)
        return torch.softmax(scores, dim=-1) @ self.v(x)  # (B, T, d)


def test_a_finite_mask_value_is_not_called_minus_inf() -> None:
    """The mask stage's words follow the recorded values: finfo.min is named, -inf is not."""
    torch.manual_seed(0)
    trace = mha_tui.trace(_FinfoMaskAttention().eval(), torch.randn(1, 3, 4))
    mask = trace.stage("mask")
    assert "-3.4e+38" in mask.explanation and "not -inf" in mask.explanation
    assert "writes -inf" not in mask.explanation


def test_an_einsum_that_writes_heads_first_is_shown_as_it_is() -> None:
    """`einsum("bqhd,bkhd->bhqk", q, k)` already gives (B, h, T, T): its scores are the op's
    own numbers, not swapped as if it wrote (B, T, h, T) (they were drawn (1, 4, 2, 4),
    head and query axes exchanged); `einsum("bhqk,bkhd->bqhd")` is still turned heads first."""
    from mha_tui.config import Config, Source
    from mha_tui.pipeline import run_trace

    trace = run_trace(Config("I love AI !"),
                      Source(module="tests/fixtures/einsum_attn.py:EinsumAttention"))
    scores = trace.stage("scores")
    (op,) = [op for op in scores.ops if op.name == "einsum"]
    assert scores.tensors[-1].values.shape == (1, 2, 4, 4)
    assert np.array_equal(scores.tensors[-1].values, op.outputs[0].values)
    attend = trace.stage("attend")
    (op,) = [op for op in attend.ops if op.name == "einsum"]  # (B, T, h, d_h) as written
    assert np.array_equal(attend.tensors[-1].values, op.outputs[0].values.transpose(0, 2, 1, 3))
