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
    cached = CachedMultiHeadAttention(d_in=C, d_out=C, context_length=L, dropout=0.0,
                                      num_heads=h)

CachedMultiHeadAttention is the same module with the KV cache of the book's chapter 4 bonus
material (ch04/03_kv-cache): `forward(x, use_cache=True)` keeps the keys and values of every
token seen so far in `cache_k` / `cache_v` and appends the new ones; `reset_cache()` empties
it. `--decode N` runs it: a prefill of the sentence's first tokens, then one token per call.

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


class CachedMultiHeadAttention(nn.Module):
    """MultiHeadAttention with a KV cache: each call appends its tokens' keys and values to
    the cache, so a generated token's query is compared with the keys of every token so far
    without projecting them again."""

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
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1),
                             persistent=False)
        # The cache: empty until the first call with use_cache=True.
        self.register_buffer("cache_k", None, persistent=False)
        self.register_buffer("cache_v", None, persistent=False)
        self.ptr_current_pos = 0  # how many tokens the cache holds: the new tokens' first position

    def forward(self, x, use_cache=False):
        b, num_tokens, d_in = x.shape  # x: (b, T, d_in); T = 1 for a generated token

        keys_new = self.W_key(x)  # (b, T, d_out): only the new tokens are projected
        values_new = self.W_value(x)  # (b, T, d_out)
        queries = self.W_query(x)  # (b, T, d_out)

        keys_new = keys_new.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, h, d_h)
        values_new = values_new.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, h, d_h)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, h, d_h)

        if use_cache:
            if self.cache_k is None:  # the prefill: the cache starts with the prompt's keys
                self.cache_k, self.cache_v = keys_new, values_new  # (b, T, h, d_h) each
            else:  # a later call: its keys and values join the cache on the tokens' axis
                self.cache_k = torch.cat([self.cache_k, keys_new], dim=1)  # (b, t, h, d_h)
                self.cache_v = torch.cat([self.cache_v, values_new], dim=1)  # (b, t, h, d_h)
            keys, values = self.cache_k, self.cache_v  # (b, t, h, d_h): every token so far
        else:
            keys, values = keys_new, values_new  # (b, T, h, d_h): no cache

        keys = keys.transpose(1, 2)  # (b, h, t, d_h): every token so far
        queries = queries.transpose(1, 2)  # (b, h, T, d_h): the new tokens only
        values = values.transpose(1, 2)  # (b, h, t, d_h)

        attn_scores = queries @ keys.transpose(2, 3)  # (b, h, T, t)

        num_tokens_K = keys.shape[-2]  # (t): the cached tokens and the new ones
        if use_cache:  # the new tokens' rows of the causal mask: they sit after the cached ones
            start = self.ptr_current_pos  # (): the new tokens' first position
            mask_bool = self.mask.bool()[start:start + num_tokens, :num_tokens_K]  # (T, t)
            self.ptr_current_pos += num_tokens  # (): the tokens the cache now holds
        else:
            mask_bool = self.mask.bool()[:num_tokens, :num_tokens_K]  # (T, T)
        attn_scores.masked_fill_(mask_bool, -torch.inf)  # (b, h, T, t), in place, before scaling

        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # (b, h, T, t)
        attn_weights = self.dropout(attn_weights)  # (b, h, T, t)

        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, h, d_h)

        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # (b, T, d_out)
        context_vec = self.out_proj(context_vec)  # (b, T, d_out)

        return context_vec  # (b, T, d_out)

    def reset_cache(self):
        self.cache_k, self.cache_v = None, None
        self.ptr_current_pos = 0
