"""Multi-head attention as the course page builds it (seed 001, "Build Your First LLM").

Four nn.Linear layers WITH bias, declared W_q, W_k, W_v, W_o; heads split by view and
transpose; an optional boolean mask handed to forward (True where a token may not look),
applied with masked_fill after scaling. No causal buffer and no dropout of its own.

    torch.manual_seed(seed)
    embedding = nn.Embedding(V, C)
    mha = MultiHeadAttention(embed_dim=C, num_heads=h)

Plain torch: this file knows nothing of mha-tui.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads

        self.W_q = nn.Linear(embed_dim, embed_dim)
        self.W_k = nn.Linear(embed_dim, embed_dim)
        self.W_v = nn.Linear(embed_dim, embed_dim)
        self.W_o = nn.Linear(embed_dim, embed_dim)  # mixes the heads back together

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch_size, seq_len, _ = x.shape  # x: (B, T, C)

        # One projection each for queries, keys and values, bias included.
        Q = self.W_q(x)  # (B, T, C)
        K = self.W_k(x)  # (B, T, C)
        V = self.W_v(x)  # (B, T, C)

        # Cut the channels into num_heads blocks of head_dim.
        Q = Q.view(batch_size, seq_len, self.num_heads, self.head_dim)  # (B, T, h, d_h)
        K = K.view(batch_size, seq_len, self.num_heads, self.head_dim)  # (B, T, h, d_h)
        V = V.view(batch_size, seq_len, self.num_heads, self.head_dim)  # (B, T, h, d_h)

        # Heads in front of tokens, so each head is one (T, d_h) matrix.
        Q = Q.transpose(1, 2)  # (B, h, T, d_h)
        K = K.transpose(1, 2)  # (B, h, T, d_h)
        V = V.transpose(1, 2)  # (B, h, T, d_h)

        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, h, T, T)

        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))  # (B, h, T, T); mask (T, T)

        attention = F.softmax(scores, dim=-1)  # (B, h, T, T), rows sum to 1
        out = torch.matmul(attention, V)  # (B, h, T, d_h)

        # Heads side by side again.
        out = out.transpose(1, 2).contiguous().view(batch_size, seq_len, -1)  # (B, T, C)

        return self.W_o(out)  # (B, T, C)
