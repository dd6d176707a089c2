"""Multi-head attention as "Many Eyes" builds it (seed 004): a ModuleList of whole heads.

Each SelfAttentionHead owns its key, query and value nn.Linear (no bias), declared in that
order, and its own tril buffer; the scores are scaled by head_size ** -0.5 and masked
where tril is 0. MultiHeadAttention runs every head on the same x, joins the outputs with
torch.cat, mixes them with proj (with bias) and applies dropout.

    torch.manual_seed(seed)
    embedding = nn.Embedding(V, C)
    mha = MultiHeadAttention(d_model=C, num_heads=h, context_length=L, dropout=0.0)

Plain torch: this file knows nothing of mha-tui.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttentionHead(nn.Module):
    """One causal head: (B, T, C) -> (B, T, head_size)."""

    def __init__(self, d_model, head_size, context_length, dropout=0.0):
        super().__init__()
        self.key = nn.Linear(d_model, head_size, bias=False)
        self.query = nn.Linear(d_model, head_size, bias=False)
        self.value = nn.Linear(d_model, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(context_length, context_length)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape  # x: (B, T, C)
        k = self.key(x)  # (B, T, head_size)
        q = self.query(x)  # (B, T, head_size)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, T), scaled
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))  # (B, T, T), future hidden
        wei = F.softmax(wei, dim=-1)  # (B, T, T)
        wei = self.dropout(wei)  # (B, T, T)
        v = self.value(x)  # (B, T, head_size)
        return wei @ v  # (B, T, head_size)


class MultiHeadAttention(nn.Module):
    """num_heads independent heads, concatenated, then one linear mix: (B, T, C) -> (B, T, C)."""

    def __init__(self, d_model, num_heads, context_length, dropout=0.0):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        head_size = d_model // num_heads  # each head's own narrow subspace
        self.heads = nn.ModuleList(
            [SelfAttentionHead(d_model, head_size, context_length, dropout) for _ in range(num_heads)]
        )
        self.proj = nn.Linear(d_model, d_model)  # W^O: reads every head's block
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):  # x: (B, T, C)
        head_outputs = [h(x) for h in self.heads]  # num_heads tensors, each (B, T, head_size)
        out = torch.cat(head_outputs, dim=-1)  # (B, T, C)
        out = self.proj(out)  # (B, T, C)
        out = self.dropout(out)  # (B, T, C)
        return out  # (B, T, C)
