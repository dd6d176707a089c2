"""The "mygpt" chapter's attention modules (seed 000), written in the chapter's conventions.

Plain tutorial code: mha-tui explains it by watching its forward, never by editing it.
Four bias-free C x C projections W_Q, W_K, W_V, W_O (4 * C**2 parameters for every h), an
additive -inf causal mask buffer, dropout. `causal=False` skips the mask (`--no-causal`).
Knows torch and nothing of mha-tui: never import rich, textual, typer or the tracer here.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SingleHeadAttention(nn.Module):
    """Single-head causal self-attention with a registered causal mask and dropout."""

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
        self.dropout = dropout
        self.causal = causal
        self.W_Q = nn.Linear(embed_dim, head_dim, bias=False)
        self.W_K = nn.Linear(embed_dim, head_dim, bias=False)
        self.W_V = nn.Linear(embed_dim, head_dim, bias=False)
        self.W_O = nn.Linear(head_dim, embed_dim, bias=False)
        self.attn_drop = nn.Dropout(dropout)
        self.out_drop = nn.Dropout(dropout)
        mask = torch.triu(
            torch.full((max_seq_len, max_seq_len), float("-inf")),
            diagonal=1,
        )
        self.register_buffer("causal_mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        if T > self.max_seq_len:
            raise ValueError(
                f"input length T={T} exceeds max_seq_len={self.max_seq_len}"
            )
        Q = self.W_Q(x)  # (B, T, d_h)
        K = self.W_K(x)  # (B, T, d_h)
        V = self.W_V(x)  # (B, T, d_h)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, T, T)
        if self.causal:
            scores = scores + self.causal_mask[:T, :T]  # (B, T, T)
        weights = F.softmax(scores, dim=-1)  # (B, T, T)
        weights = self.attn_drop(weights)  # (B, T, T)
        out = weights @ V  # (B, T, d_h)
        return self.out_drop(self.W_O(out))  # (B, T, C)


class MultiHeadAttention(nn.Module):
    """Multi-head causal self-attention: h heads run in parallel by reshaping.

    Inputs: x of shape (B, T, embed_dim). Output: (B, T, embed_dim).
    Each head works in head_dim = embed_dim // num_heads channels; after the reshape the
    first head_dim output channels of W_Q, W_K and W_V feed head 0, the next head 1, ...
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
        self.dropout = dropout
        self.causal = causal

        # One C x C projection per role, in the chapter's order.
        self.W_Q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_K = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_V = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_O = nn.Linear(embed_dim, embed_dim, bias=False)
        self.attn_drop = nn.Dropout(dropout)
        self.out_drop = nn.Dropout(dropout)
        mask = torch.triu(
            torch.full((max_seq_len, max_seq_len), float("-inf")),
            diagonal=1,
        )
        self.register_buffer("causal_mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        if T > self.max_seq_len:
            raise ValueError(
                f"input length T={T} exceeds max_seq_len={self.max_seq_len}"
            )
        # (B, T, C) -> three (B, T, C) tensors
        Q = self.W_Q(x)  # (B, T, C)
        K = self.W_K(x)  # (B, T, C)
        V = self.W_V(x)  # (B, T, C)

        # Split C into (num_heads, head_dim), move the head axis next to the batch axis.
        Q = Q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_h)
        K = K.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_h)
        V = V.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_h)

        # Scaled dot-product attention, batched over (B, num_heads).
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, h, T, T)
        if self.causal:
            scores = scores + self.causal_mask[:T, :T]  # (T, T) broadcast over (B, h)
        weights = F.softmax(scores, dim=-1)  # (B, h, T, T)
        weights = self.attn_drop(weights)  # (B, h, T, T), identity in eval mode
        out = weights @ V  # (B, h, T, d_h)

        # Undo the reshape: heads side by side in the C axis, then the output projection.
        out = out.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.out_drop(self.W_O(out))  # (B, T, C)
