"""The attention modules mha-tui explains, written like the reference chapter.

`MultiHeadAttention.forward` is the one and only computation: the trace is recorded by
passing a `tap` callback that the forward calls after each stage with the tensors it has
just made. Without a tap the forward is the plain module. This file knows torch and
nothing about how stages are drawn: never import rich, textual or typer here.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class Tap(Protocol):
    """Called by forward after a stage with the tensors that stage produced."""

    def __call__(self, stage: str, /, **tensors: torch.Tensor) -> None: ...


def no_tap(stage: str, /, **tensors: torch.Tensor) -> None:
    """The default tap: record nothing."""


def _causal_mask(max_seq_len: int) -> torch.Tensor:
    # -inf strictly above the diagonal, 0 on and below it: added to the scores.
    return torch.triu(torch.full((max_seq_len, max_seq_len), float("-inf")), diagonal=1)


def _check_length(T: int, max_seq_len: int) -> None:
    if T > max_seq_len:
        raise ValueError(f"input length T={T} exceeds max_seq_len={max_seq_len}")


class SingleHeadAttention(nn.Module):
    """One causal attention head working in head_dim channels; the h=1 reference."""

    def __init__(
        self,
        embed_dim: int,
        head_dim: int,
        max_seq_len: int = 64,
        dropout: float = 0.0,
        causal: bool = True,
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.causal = causal
        self.W_Q = nn.Linear(embed_dim, head_dim, bias=False)
        self.W_K = nn.Linear(embed_dim, head_dim, bias=False)
        self.W_V = nn.Linear(embed_dim, head_dim, bias=False)
        self.W_O = nn.Linear(head_dim, embed_dim, bias=False)
        self.attn_drop = nn.Dropout(dropout)
        self.out_drop = nn.Dropout(dropout)
        self.register_buffer("causal_mask", _causal_mask(max_seq_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]  # x: (B, T, C)
        _check_length(T, self.max_seq_len)
        Q, K, V = self.W_Q(x), self.W_K(x), self.W_V(x)  # each (B, T, d_h)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, T, T)
        if self.causal:
            scores = scores + self.causal_mask[:T, :T]  # (B, T, T)
        weights = self.attn_drop(F.softmax(scores, dim=-1))  # (B, T, T)
        context = weights @ V  # (B, T, d_h)
        return self.out_drop(self.W_O(context))  # (B, T, C)


class MultiHeadAttention(nn.Module):
    """h causal attention heads run in parallel by reshaping (B, T, C) to (B, h, T, d_h).

    Four bias-free C x C projections W_Q, W_K, W_V, W_O: 4 * C**2 parameters for every h.
    After the reshape, output channels [i * d_h, (i + 1) * d_h) of W_Q, W_K and W_V feed
    head i.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        max_seq_len: int = 64,
        dropout: float = 0.0,
        causal: bool = True,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.max_seq_len = max_seq_len
        self.causal = causal
        self.W_Q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_K = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_V = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_O = nn.Linear(embed_dim, embed_dim, bias=False)
        self.attn_drop = nn.Dropout(dropout)
        self.out_drop = nn.Dropout(dropout)
        self.register_buffer("causal_mask", _causal_mask(max_seq_len))

    def forward(self, x: torch.Tensor, tap: Tap = no_tap) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        _check_length(T, self.max_seq_len)
        h, d_h = self.num_heads, self.head_dim

        Q, K, V = self.W_Q(x), self.W_K(x), self.W_V(x)  # each (B, T, C)
        tap("project", Q=Q, K=K, V=V)
        Q, K, V = Q.view(B, T, h, d_h), K.view(B, T, h, d_h), V.view(B, T, h, d_h)  # (B, T, h, d_h)
        tap("view", Q=Q, K=K, V=V)
        Q, K, V = Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2)  # (B, h, T, d_h)
        tap("transpose", Q=Q, K=K, V=V)

        scores = Q @ K.transpose(-2, -1)  # (B, h, T, T)
        tap("scores", scores=scores)
        scores = scores / math.sqrt(d_h)  # (B, h, T, T)
        tap("scale", scores=scores)
        if self.causal:
            scores = scores + self.causal_mask[:T, :T]  # (T, T) broadcast over (B, h)
        tap("mask", scores=scores)
        weights = F.softmax(scores, dim=-1)  # (B, h, T, T), each row sums to 1
        weights = self.attn_drop(weights)  # identity in eval mode
        tap("softmax", weights=weights)
        context = weights @ V  # (B, h, T, d_h)
        tap("attend", context=context)

        strided = context.transpose(1, 2)  # (B, T, h, d_h), not contiguous
        context = strided.contiguous().view(B, T, C)  # (B, T, C), heads side by side
        tap("concat", strided=strided, context=context)
        out = self.out_drop(self.W_O(context))  # (B, T, C)
        tap("w_o", out=out)
        return out
