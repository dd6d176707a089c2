"""A two-layer attention-only transformer that learns induction heads, written like the tutorials.

Trained by `python -m mha_tui.models.train_induction` (seeded, CPU) on sequences of random
tokens in which a segment is repeated at a random offset: the only way to predict a token of
the repeat is to find the previous occurrence of the current token and copy the token that
followed it. Two layers are the fewest that can do that (Olsson et al., 2022): a layer-0 head
attends to the previous token, a layer-1 head uses it to find "the token after my last
occurrence". Its weights ship beside this file (induction.safetensors).

No MLP: every layer is LayerNorm -> multi-head causal self-attention -> added to the residual
stream. Learned positions. Knows torch and nothing of mha-tui: never import rich, textual,
typer or the tracer here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

WEIGHTS = Path(__file__).with_name("induction.safetensors")


@dataclass(frozen=True)
class InductionConfig:
    """The sizes of the shipped model (the training script's defaults)."""

    vocab_size: int = 64
    max_seq_len: int = 32
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2


class MultiHeadAttention(nn.Module):
    """Multi-head causal self-attention, one layer of the model.

    Inputs: x of shape (B, T, embed_dim). Output: (B, T, embed_dim).
    Heads side by side in the C axis: head i owns channels i*d_h .. (i+1)*d_h of Q, K, V and
    of the input to W_O (which is where a head is removed, by zeroing its slice).
    """

    def __init__(self, embed_dim: int, num_heads: int, max_seq_len: int) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.max_seq_len = max_seq_len
        self.W_Q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_K = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_V = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_O = nn.Linear(embed_dim, embed_dim, bias=False)
        mask = torch.triu(torch.full((max_seq_len, max_seq_len), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        if T > self.max_seq_len:
            raise ValueError(f"input length T={T} exceeds max_seq_len={self.max_seq_len}")
        Q = self.W_Q(x)  # (B, T, C)
        K = self.W_K(x)  # (B, T, C)
        V = self.W_V(x)  # (B, T, C)

        # Split C into (num_heads, head_dim), move the head axis next to the batch axis.
        Q = Q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_h)
        K = K.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_h)
        V = V.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_h)

        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, h, T, T)
        scores = scores + self.causal_mask[:T, :T]  # (T, T) broadcast over (B, h)
        weights = F.softmax(scores, dim=-1)  # (B, h, T, T)
        context = weights @ V  # (B, h, T, d_h)

        # Heads side by side in the C axis again, then the output projection.
        context = context.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.W_O(context)  # (B, T, C)


class Block(nn.Module):
    """One attention-only layer: x + attn(LayerNorm(x)). No MLP."""

    def __init__(self, embed_dim: int, num_heads: int, max_seq_len: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(embed_dim)
        self.attn = MultiHeadAttention(embed_dim, num_heads, max_seq_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln(x))  # (B, T, C)


class AttentionOnlyTransformer(nn.Module):
    """Token and learned position embeddings, `num_layers` attention-only blocks, an unembedding.

    Inputs: token ids of shape (B, T), T <= max_seq_len. Output: logits (B, T, vocab_size),
    the prediction at position t being for the token at t + 1.
    """

    def __init__(self, config: InductionConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or InductionConfig()
        self.tok_emb = nn.Embedding(config.vocab_size, config.embed_dim)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.embed_dim)
        self.blocks = nn.ModuleList(
            Block(config.embed_dim, config.num_heads, config.max_seq_len) for _ in range(config.num_layers)
        )
        self.ln_f = nn.LayerNorm(config.embed_dim)
        self.unembed = nn.Linear(config.embed_dim, config.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape  # (B, T)
        positions = torch.arange(T, device=ids.device).unsqueeze(0)  # (1, T), as GPT-2's position_ids
        x = self.tok_emb(ids) + self.pos_emb(positions)  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        return self.unembed(self.ln_f(x))  # (B, T, vocab)


def load_trained(path: Path | str = WEIGHTS) -> AttentionOnlyTransformer:
    """The shipped model with its trained weights, in eval mode."""
    from safetensors.torch import load_file

    model = AttentionOnlyTransformer()
    model.load_state_dict(load_file(str(path)))
    return model.eval()
