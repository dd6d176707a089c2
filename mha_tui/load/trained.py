"""`--model induction`: the model this repository trained, loaded like an `--hf` checkpoint.

The model (`mha_tui/models/induction.py`) is a whole transformer, not one attention module:
it is explained one layer at a time (`--layer L`) by the same path as a Hugging Face model
(`pipeline.hf.Session`), so that its walk-through, `--why`, quiz and transcripts are every
layer's. This module builds what that path needs: the model wrapped to be called as
`model(input_ids=..., use_cache=False)`, and a tokenizer.

The tokenizer: words are split on whitespace and numbered in order of first appearance, as
every toy module's are (`config.Config.ids`): the first distinct word is token 0, the next
token 1, ... The model was trained on random tokens, so which id a word gets does not matter;
what matters is that a repeated word gets the same id again. A sentence of more than
`max_seq_len` (32) words, or of more distinct words than the vocabulary (64), is refused.

Knows torch; never imports rich, textual, typer or transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..config import tokenize
from ..models.induction import AttentionOnlyTransformer, load_trained
from .hf import HfError, Loaded, ModelInfo

TRAINED = ("induction",)


class FirstAppearance:
    """A tokenizer for one sentence: each distinct word's id is the order it first appears in."""

    def __init__(self, sentence: str) -> None:
        self.vocab = tuple(dict.fromkeys(tokenize(sentence)))
        self.index = {word: i for i, word in enumerate(self.vocab)}

    def __call__(self, sentence: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [self.index[word] for word in tokenize(sentence)]}

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[i] for i in ids]


class CausalLM(nn.Module):
    """The trained model called as a causal LM is: model(input_ids=ids, use_cache=False)."""

    def __init__(self, model: AttentionOnlyTransformer) -> None:
        super().__init__()
        self.model = model

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.tok_emb

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        return self.model(input_ids)  # (B, T, vocab)


def load(name: str, sentence: str) -> Loaded:
    """The trained model `name` and a tokenizer for `sentence`; refusals are HfErrors."""
    if name not in TRAINED:
        raise HfError(f"no trained model called {name!r}; choose one of: {', '.join(TRAINED)}")
    model = load_trained()
    config = model.config
    tokenizer = FirstAppearance(sentence)
    words = tokenize(sentence)
    if not words:
        raise HfError("the sentence gives no tokens; give at least one word, e.g. \"a b c a b c\"")
    if len(words) > config.max_seq_len:
        raise HfError(f"the sentence has {len(words)} words but --model {name} reads at most "
                      f"{config.max_seq_len}")
    if len(tokenizer.vocab) > config.vocab_size:
        raise HfError(f"the sentence has {len(tokenizer.vocab)} distinct words but --model {name} "
                      f"knows only {config.vocab_size} tokens")
    wrapped = CausalLM(model).eval()
    attention = model.blocks[0].attn
    info = ModelInfo(
        name=name, path=str(model_file()), class_name=type(model).__name__,
        n_layers=config.num_layers, embed_dim=config.embed_dim, num_heads=config.num_heads,
        head_dim=config.embed_dim // config.num_heads, vocab_size=config.vocab_size,
        max_positions=config.max_seq_len,
        attention_params=sum(p.numel() for p in attention.parameters()),
    )
    return Loaded(model=wrapped, tokenizer=tokenizer, info=info, blocks_path="model.blocks",
                  attention_name="attn", blocks=model.blocks)


def model_file() -> Any:
    from ..models import induction

    return induction.WEIGHTS
