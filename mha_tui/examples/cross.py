"""Cross-attention as the Transformer's decoder does it (the Annotated Transformer's source
attention; Stable Diffusion's CrossAttention): queries from the sentence being written, keys
and values from another sequence, the context (the encoder's output, a prompt, audio).

Four nn.Linear layers with bias, W_q, W_k, W_v, W_o; heads split by view and transpose, as
in the course's module. The only difference from self-attention is where K and V come
from: `forward(x, context)`. Without a context it attends to x itself. An optional mask
(True where a query may not look) is applied with masked_fill after scaling; across two
sequences none is needed.

    torch.manual_seed(seed)
    embedding = nn.Embedding(V, C)
    mha = CrossAttention(embed_dim=C, num_heads=h)

and then x = embedding(sentence ids), (B, T_q, C); context = embedding(context ids),
(B, T_k, C); out = mha(x, context), (B, T_q, C).

Plain torch: this file knows nothing of mha-tui.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CrossAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads

        self.W_q = nn.Linear(embed_dim, embed_dim)
        self.W_k = nn.Linear(embed_dim, embed_dim)
        self.W_v = nn.Linear(embed_dim, embed_dim)
        self.W_o = nn.Linear(embed_dim, embed_dim)  # mixes the heads back together

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        if context is None:
            context = x  # (B, T, C): no second sequence, self-attention
        batch_size, T_q, _ = x.shape  # x: (B, T_q, C)
        T_k = context.shape[1]  # context: (B, T_k, C)

        # Queries from the sentence; keys and values from the context.
        Q = self.W_q(x)  # (B, T_q, C)
        K = self.W_k(context)  # (B, T_k, C)
        V = self.W_v(context)  # (B, T_k, C)

        Q = Q.view(batch_size, T_q, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T_q, d_h)
        K = K.view(batch_size, T_k, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T_k, d_h)
        V = V.view(batch_size, T_k, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T_k, d_h)

        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, h, T_q, T_k)

        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))  # (B, h, T_q, T_k)

        weights = F.softmax(scores, dim=-1)  # (B, h, T_q, T_k), rows sum to 1
        out = torch.matmul(weights, V)  # (B, h, T_q, d_h)

        out = out.transpose(1, 2).contiguous().view(batch_size, T_q, -1)  # (B, T_q, C)
        return self.W_o(out)  # (B, T_q, C)
