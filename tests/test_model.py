"""The module against independent witnesses: the seed chapter's printed numbers, per-head
computation from weight slices, and torch's own nn.MultiheadAttention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mha_tui
from mha_tui.examples.mygpt import MultiHeadAttention, SingleHeadAttention

# Experiment 19 of the reference chapter: SingleHeadAttention(4, 4) and
# MultiHeadAttention(4, num_heads=1), each built after manual_seed(0), on
# x = randn(1, 4, 4) drawn after manual_seed(42). Printed to 4 decimals there.
EXPERIMENT_19 = torch.tensor([[[-0.3995, 0.5858, 0.1750, -0.5428],
                               [-0.1713, 0.5772, 0.2182, -0.4687],
                               [-0.3211, 0.5328, 0.1321, -0.3144],
                               [-0.1588, 0.2404, 0.0839, -0.0570]]])


def _pair(C: int, seed: int) -> tuple[SingleHeadAttention, MultiHeadAttention]:
    torch.manual_seed(seed)
    sha = SingleHeadAttention(embed_dim=C, head_dim=C).eval()
    torch.manual_seed(seed)
    mha = MultiHeadAttention(embed_dim=C, num_heads=1).eval()
    return sha, mha


def test_experiment_19_numbers_byte_for_byte() -> None:
    sha, mha = _pair(4, 0)
    torch.manual_seed(42)
    x = torch.randn(1, 4, 4)
    with torch.no_grad():
        out_sha, out_mha = sha(x), mha(x)
    assert torch.equal(out_sha, out_mha)
    assert torch.allclose(out_mha, EXPERIMENT_19, atol=5e-5, rtol=0)


@pytest.mark.parametrize(("C", "seed", "T"), [(4, 0, 4), (8, 1, 7), (16, 3, 1), (6, 5, 12)])
def test_one_head_equals_single_head(C: int, seed: int, T: int) -> None:
    sha, mha = _pair(C, seed)
    x = torch.randn(2, T, C)
    with torch.no_grad():
        assert torch.equal(sha(x), mha(x))


@pytest.mark.parametrize("C", [4, 8, 12])
def test_parameter_count_is_4C2_for_every_head_count(C: int) -> None:
    for h in [d for d in range(1, C + 1) if C % d == 0]:
        mha = MultiHeadAttention(C, h)
        assert sum(p.numel() for p in mha.parameters()) == 4 * C * C


def test_heads_must_divide_embed_dim() -> None:
    with pytest.raises(ValueError, match=r"^embed_dim \(4\) must be divisible by num_heads \(3\)$"):
        MultiHeadAttention(4, 3)
    assert MultiHeadAttention(6, 3).head_dim == 2


def test_max_seq_len_is_enforced() -> None:
    mha = MultiHeadAttention(4, 2, max_seq_len=2)
    with pytest.raises(ValueError, match=r"^input length T=4 exceeds max_seq_len=2$"):
        mha(torch.randn(1, 4, 4))


def test_causal_mask_buffer() -> None:
    mha = MultiHeadAttention(4, 2, max_seq_len=5)
    assert "causal_mask" in dict(mha.named_buffers())
    mask = mha.causal_mask
    assert torch.isneginf(mask[torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)]).all()
    assert (mask[torch.tril(torch.ones(5, 5, dtype=torch.bool))] == 0).all()


def _per_head(mha: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Each head alone from its slice of the weights, then concatenated: no reshapes."""
    d_h, T = mha.head_dim, x.shape[1]
    outputs = []
    for i in range(mha.num_heads):
        rows = slice(i * d_h, (i + 1) * d_h)
        q = x @ mha.W_Q.weight[rows].T
        k = x @ mha.W_K.weight[rows].T
        v = x @ mha.W_V.weight[rows].T
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_h)
        if mha.causal:
            scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        outputs.append(F.softmax(scores, dim=-1) @ v)
    return torch.cat(outputs, dim=-1) @ mha.W_O.weight.T


CASES = [(4, 2, 4, 0, True), (8, 4, 6, 1, True), (12, 3, 5, 2, False), (16, 8, 9, 7, True),
         (6, 6, 3, 3, False), (32, 4, 17, 11, True)]


@pytest.mark.parametrize(("C", "h", "T", "seed", "causal"), CASES)
def test_fused_pass_equals_per_head_slices(C: int, h: int, T: int, seed: int, causal: bool) -> None:
    torch.manual_seed(seed)
    mha = MultiHeadAttention(C, h, causal=causal).eval()
    x = torch.randn(1, T, C)
    with torch.no_grad():
        assert torch.allclose(mha(x), _per_head(mha, x), atol=1e-6)


@pytest.mark.parametrize(("C", "h", "T", "seed", "causal"), CASES)
def test_matches_torch_multihead_attention(C: int, h: int, T: int, seed: int, causal: bool) -> None:
    torch.manual_seed(seed)
    mha = MultiHeadAttention(C, h, causal=causal).eval()
    ref = nn.MultiheadAttention(C, h, bias=False, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.W_Q.weight, mha.W_K.weight, mha.W_V.weight]))
        ref.out_proj.weight.copy_(mha.W_O.weight)
        x = torch.randn(1, T, C)
        mask = mha.causal_mask[:T, :T] if causal else None
        expected, expected_weights = ref(x, x, x, attn_mask=mask, need_weights=True,
                                         average_attn_weights=False)
        out = mha(x)
    traced = mha_tui.trace(mha, x)  # the weights as the tracer recorded them from the forward
    weights = torch.from_numpy(traced.stage("softmax").tensors[0].values)
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(weights, expected_weights, atol=1e-6)
