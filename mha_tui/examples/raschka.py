"""Multi-head attention from chapter 3 of Raschka's book, as the blog post walks through it
(seed 003): the single causal head, the wrapper that concatenates a list of them, and the
batched module.

Conventions: W_query, W_key, W_value with a qkv_bias switch (off by default); the causal
mask is a buffer of ones above the diagonal (torch.triu), turned boolean and applied IN
PLACE with masked_fill_ to the raw scores, BEFORE they are scaled inside the softmax call;
dropout on the attention weights; out_proj (with bias) after the heads are merged.

    torch.manual_seed(seed)
    embedding = nn.Embedding(V, C)
    mha = MultiHeadAttention(d_in=C, d_out=C, context_length=L, dropout=0.0, num_heads=h)
    wrapper = MultiHeadAttentionWrapper(d_in=C, d_out=C // h, context_length=L,
                                        dropout=0.0, num_heads=h)

Plain torch: this file knows nothing of mha-tui.
"""

from __future__ import annotations

import torch
from torch import nn


class CausalAttention(nn.Module):
    """One causal attention head: (b, num_tokens, d_in) -> (b, num_tokens, d_out)."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        # 1 above the diagonal: the future a token may not look at.
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape  # x: (b, T, d_in)
        keys = self.W_key(x)  # (b, T, d_out)
        queries = self.W_query(x)  # (b, T, d_out)
        values = self.W_value(x)  # (b, T, d_out)

        attn_scores = queries @ keys.transpose(1, 2)  # (b, T, T)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)  # (b, T, T)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # (b, T, T)
        attn_weights = self.dropout(attn_weights)  # (b, T, T)

        context_vec = attn_weights @ values  # (b, T, d_out)
        return context_vec  # (b, T, d_out)


class MultiHeadAttentionWrapper(nn.Module):
    """The first, simple version: num_heads CausalAttention heads, outputs concatenated.

    No output projection: the result has d_out * num_heads channels.
    """

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)  # (b, T, num_heads * d_out)


class MultiHeadAttention(nn.Module):
    """All heads at once: one d_out-wide projection each for queries, keys and values, split
    into num_heads blocks of head_dim by view and transpose."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # combines the heads' outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape  # x: (b, T, d_in)

        keys = self.W_key(x)  # (b, T, d_out)
        queries = self.W_query(x)  # (b, T, d_out)
        values = self.W_value(x)  # (b, T, d_out)

        # Split the last dimension: d_out -> num_heads x head_dim.
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, h, d_h)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, h, d_h)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, h, d_h)

        keys = keys.transpose(1, 2)  # (b, h, T, d_h)
        queries = queries.transpose(1, 2)  # (b, h, T, d_h)
        values = values.transpose(1, 2)  # (b, h, T, d_h)

        attn_scores = queries @ keys.transpose(2, 3)  # (b, h, T, T)

        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]  # (T, T), True above the diagonal
        attn_scores.masked_fill_(mask_bool, -torch.inf)  # (b, h, T, T), in place, before scaling

        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # (b, h, T, T)
        attn_weights = self.dropout(attn_weights)  # (b, h, T, T)

        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, h, d_h)

        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # (b, T, d_out)
        context_vec = self.out_proj(context_vec)  # (b, T, d_out)

        return context_vec  # (b, T, d_out)
