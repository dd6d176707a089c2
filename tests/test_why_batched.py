"""Why this number? on heads batched as one (B*h) axis, torch.baddbmm/bmm and torch.where masks:
nn.MultiheadAttention's own forward (need_weights=True: baddbmm with its mask, then bmm),
GPT-NeoX's and BLOOM's baddbmm with alpha, OPT's bmm, GPT-NeoX's and GPT-J's torch.where
mask. Every cell against a computation written here in torch, from the stages' recorded
weights or the ops' recorded inputs (not mha-tui's code), and nn.MultiheadAttention's own
attention weights as a second witness."""

from __future__ import annotations

import itertools
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.records import OpRecord, Trace
from mha_tui.why import main_tensor, why

from .conftest import ROOT

MECHANISMS = Path(ROOT) / "tests" / "fixtures" / "mechanisms"
SENTENCE = "the cat sat on the mat"


@cache
def trace_of(module: str, embed_dim: int = 16, heads: int = 4) -> Trace:
    return run_trace(Config(SENTENCE, embed_dim=embed_dim, num_heads=heads), Source(module=module))


def every_cell(trace: Trace, stage: str, expected: np.ndarray) -> int:
    record = main_tensor(trace.stage(stage))
    want = np.broadcast_to(expected, record.values.shape)
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, stage, index)
        assert cell.agrees, (stage, index, cell.computed, cell.recorded)
        if math.isinf(want[index]):
            assert cell.computed == want[index], (stage, index)
        else:
            assert cell.computed == pytest.approx(float(want[index]), rel=1e-5, abs=1e-6), (
                stage, index)
    return record.values.size


def recorded_inputs(trace: Trace, op: OpRecord) -> list[torch.Tensor]:
    assert trace.recording is not None
    return [torch.from_numpy(np.array(trace.recording.snapshot(r).values)).double()
            for r in op.inputs]


def the_op(trace: Trace, stage: str, name: str) -> OpRecord:
    return next(op for op in trace.stage(stage).ops if op.name == name)


def test_nn_multiheadattention_every_stage_against_its_formula_and_its_own_weights() -> None:
    """torch.nn.MultiheadAttention as torch wrote it (heads as one B*h axis, q scaled first,
    baddbmm with the causal mask, bmm): every cell of project, scale, scores (mha-tui's
    expansion of baddbmm's product), mask, softmax, attend, concat and W_O is explained and
    equals the formula computed here from the recorded in_proj and out_proj; the softmax
    also equals what a fresh nn.MultiheadAttention with those weights returns as its weights."""
    trace = trace_of("torch.nn:MultiheadAttention", 4, 2)
    stage = {s.id: s for s in trace.stages}
    x = torch.from_numpy(np.array(stage["embed"].tensor("x").values)).double()[0]  # (T, C)
    w_in, b_in = (torch.from_numpy(np.array(r.values)).double() for r in stage["project"].tensors[:2])
    w_out, b_out = (torch.from_numpy(np.array(r.values)).double() for r in stage["w_o"].tensors[:2])
    T, C = x.shape
    h, d = 2, C // 2
    q, k, v = (x @ w_in.T + b_in).split(C, dim=-1)  # (T, C) each
    qh, kh, vh = (t.view(T, h, d).transpose(0, 1) for t in (q, k, v))  # (h, T, d)
    q_scaled = qh * d ** -0.5
    raw = q_scaled @ kh.transpose(-2, -1)
    masked = raw.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    weights = masked.softmax(dim=-1)
    context = weights @ vh  # (h, T, d)
    concat = context.transpose(0, 1).reshape(T, C)
    out = concat @ w_out.T + b_out
    expected = {"project": v[:, None, :], "scale": q_scaled[None], "scores": raw[None],
                "mask": masked[None], "softmax": weights[None], "attend": context[None],
                "concat": concat[None], "w_o": out[None]}
    explained = sum(every_cell(trace, s, e.numpy()) for s, e in expected.items())
    assert explained == sum(main_tensor(stage[s]).values.size for s in expected)
    cell = why(trace, "scores", (0, 1, 2, 1))
    assert cell.recorded_by == "mha-tui's expansion's"
    assert any("torch.baddbmm(input, q, k^T)" in n for n in cell.notes)
    assert why(trace, "mask", (0, 1, 1, 2)).formula.endswith("blocked")
    assert not why(trace, "mask", (0, 1, 2, 1)).recorded_by  # the module's own number

    witness = torch.nn.MultiheadAttention(C, h).double().eval()
    with torch.no_grad():
        witness.in_proj_weight.copy_(w_in)
        witness.in_proj_bias.copy_(b_in)
        _, own = witness(x[:, None], x[:, None], x[:, None], need_weights=True,
                         average_attn_weights=False,
                         attn_mask=torch.ones(T, T, dtype=torch.bool).triu(1))
    record = main_tensor(stage["softmax"])
    for index in itertools.product(*map(range, record.values.shape)):
        assert why(trace, "softmax", index).computed == pytest.approx(
            float(own[index]), rel=1e-5, abs=1e-7), index


@pytest.mark.parametrize(("module", "own"), [
    ("neox_rotary.py:GPTNeoXAttention", True),  # baddbmm(zeros, q, k^T, alpha): the module's
    ("alibi.py:BloomAttention", False),  # alibi.baddbmm(...): the scaled product, mha-tui's
])
def test_baddbmm_scores_are_alpha_times_q_dot_k(module: str, own: bool) -> None:
    """torch.baddbmm(input, q, k^T, beta=, alpha=): each score is alpha · q · k (+ beta ·
    input where the stage holds the module's own output), from the call's recorded inputs."""
    trace = trace_of(str(MECHANISMS / module))
    op = the_op(trace, "scores", "baddbmm")
    given, q, k_t = recorded_inputs(trace, op)
    alpha = float(op.kwarg("alpha", 1.0))  # type: ignore[arg-type]
    beta = float(op.kwarg("beta", 1.0))  # type: ignore[arg-type]
    expected = alpha * (q @ k_t) + (beta * given if own else 0)
    every_cell(trace, "scores", expected.reshape(main_tensor(trace.stage("scores")).shape).numpy())
    cell = why(trace, "scores", (0, 3, 5, 2))
    assert any(t.label.startswith("× alpha") for t in cell.terms)
    assert (cell.recorded_by == "mha-tui's expansion's") != own


def test_bmm_scores_and_attend_are_the_products_of_their_inputs() -> None:
    """OPT's bmm on (B*h, T, d_h): scores and attend from the calls' recorded inputs."""
    trace = trace_of(str(MECHANISMS / "opt_style.py:OPTAttention"))
    for stage in ("scores", "attend"):
        a, b = recorded_inputs(trace, the_op(trace, stage, "bmm"))
        every_cell(trace, stage, (a @ b).reshape(main_tensor(trace.stage(stage)).shape).numpy())


@pytest.mark.parametrize("module", ["neox_rotary.py:GPTNeoXAttention",
                                    "gptj_rotary.py:GPTJAttention"])
def test_a_torch_where_mask_keeps_the_past_and_writes_the_fill_value(module: str) -> None:
    """torch.where(causal_mask, scores, finfo.min): the score before it where j <= i, the
    float32 minimum above the diagonal; said blocked because j > i."""
    trace = trace_of(str(MECHANISMS / module))
    before_stage = trace.stages[trace.index("mask") - 1]
    before = main_tensor(before_stage).values.astype(np.float64)
    T = before.shape[-1]
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    every_cell(trace, "mask", np.where(future, float(np.finfo(np.float32).min), before))
    blocked = why(trace, "mask", (0, 2, 1, 4))
    assert blocked.formula.endswith("blocked") and "j > i" in blocked.notes[0]
    assert "torch.where keeps the score where it is True" in blocked.notes[1]
    assert why(trace, "mask", (0, 2, 4, 1)).formula.endswith("kept")
