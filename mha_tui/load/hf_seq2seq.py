"""`--hf` with `--context`: an encoder-decoder (T5, BART, Marian) and one layer of its decoder.

The sentence is the decoder's input and the context the encoder's input, each tokenised by
the checkpoint's tokenizer as the model is trained on them: the context as
`tokenizer(context).input_ids`; the sentence as the labels `tokenizer(text_target=sentence)`
shifted right by the model's own `prepare_decoder_input_ids_from_labels` (the decoder start
token first, the last label left out), which is what the decoder reads under teacher
forcing. Layer L's attention shown is its cross-attention by default (queries from the
decoder's stream, keys and values from the encoder's output on the context), or its
self-attention (`attention="self"`).

Loads with `local_files_only=True`, eager attention, in the checkpoint's own dtype (or
`--dtype`), never remote code, like `load.hf`, whose offline switches, tokenizer and config
loading (`tokenizer_and_config`) and tokens it reuses. Every refusal is an `HfError`.
Never import rich, textual or typer here, nor the tracer or the recogniser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .hf import (
    DTYPES,
    HfError,
    Loaded,
    ModelInfo,
    chosen_dtype,
    first_line,
    import_transformers,
    is_byte_level,
    readable_token,
    stored_dtype,
    tokenizer_and_config,
)
from .hf_files import checked_directory

# Which attention of a decoder layer: cross (the default) or self.
ATTENTIONS = ("cross", "self")
# A decoder layer's cross-attention is named for what it reads: BART's and Marian's
# encoder_attn, T5's EncDecAttention, Whisper's encoder_attn, others' crossattention.
_CROSS_MARKS = ("encoder", "encdec", "cross")


@dataclass(eq=False)
class Seq2SeqLoaded(Loaded):
    """An encoder-decoder in eval mode: `blocks` are its decoder's layers and
    `attention_name` the attention shown in each (cross or self); `cross_name` and
    `self_name` both, inside a decoder layer."""

    attention_kind: str = "cross"
    cross_name: str = ""
    self_name: str = ""

    @property
    def cross(self) -> bool:
        return self.attention_kind == "cross"


def is_encoder_decoder(config: Any) -> bool:
    return bool(getattr(config, "is_encoder_decoder", False))


def _innermost_attentions(block: nn.Module) -> list[str]:
    """The paths, inside a decoder layer, of the innermost submodules whose class is an
    attention (T5's layer.0.SelfAttention inside layer.0, a T5LayerSelfAttention)."""
    found = [path for path, sub in block.named_modules()
             if path and type(sub).__name__.endswith("Attention")]
    return [path for path in found if not any(other.startswith(path + ".") for other in found)]


def attention_names(block: nn.Module) -> tuple[str, str] | None:
    """(self, cross): the two attentions of a decoder layer, the cross one by its name."""
    paths = _innermost_attentions(block)
    if len(paths) != 2:
        return None
    cross = [path for path in paths if any(mark in path.lower() for mark in _CROSS_MARKS)]
    if len(cross) != 1:
        return None
    return next(path for path in paths if path != cross[0]), cross[0]


def _decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The decoder's list of layers and its path in the model (BART's model.decoder.layers,
    T5's decoder.block)."""
    decoder = model.get_decoder()
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and module in list(
                decoder.children()) and all(attention_names(block) for block in module):
            return path, module
    return None


def load(source: str, attention: str = "cross", dtype: str = "auto") -> Seq2SeqLoaded:
    """Find, check and load an encoder-decoder and its tokenizer; every refusal is an HfError.
    dtype: as `load.hf.load`'s (auto: the checkpoint's own)."""
    transformers = import_transformers()
    path = checked_directory(source)
    tokenizer, config = tokenizer_and_config(source, path)
    if not is_encoder_decoder(config):
        raise HfError(f"--context with --hf needs an encoder-decoder model (T5, BART, Marian): "
                      f"{source} is a {config.model_type} model with no encoder to read the "
                      f"context; leave --context out to explain its self-attention")
    if type(config) not in transformers.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING:
        raise HfError(f"--hf {source}: {config.model_type}'s encoder does not read a sentence "
                      f"(Whisper's reads audio); --context explains text encoder-decoders "
                      f"such as T5, BART and Marian")
    stored = stored_dtype(config, path)
    runs_in = chosen_dtype(dtype, stored)
    try:
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(
            path, config=config, local_files_only=True, trust_remote_code=False,
            weights_only=True, attn_implementation="eager", dtype=DTYPES[runs_in])
    except Exception as error:
        raise HfError(f"--hf {source}: could not load an encoder-decoder from {path}: "
                      f"{first_line(error)}") from None
    model.eval()
    found = _decoder_layers(model)
    if found is None:
        raise HfError(f"--hf {source}: {type(model).__name__}'s decoder layers have no "
                      f"recognisable self- and cross-attention submodules")
    blocks_path, blocks = found
    self_name, cross_name = attention_names(blocks[0])  # type: ignore[misc]
    name = cross_name if attention == "cross" else self_name
    module = blocks[0].get_submodule(name)
    config = model.config
    embed_dim = int(config.d_model)
    num_heads = int(getattr(module, "num_heads", None) or getattr(module, "n_heads", None)
                    or config.num_attention_heads)
    info = ModelInfo(
        name=source, path=str(path), class_name=type(model).__name__, n_layers=len(blocks),
        embed_dim=embed_dim, num_heads=num_heads,
        head_dim=int(getattr(module, "head_dim", None)
                     or getattr(module, "key_value_proj_dim", None)  # T5's d_kv
                     or embed_dim // num_heads),
        vocab_size=int(config.vocab_size),
        max_positions=getattr(config, "max_position_embeddings", None),
        attention_params=sum(p.numel() for p in module.parameters()),
        dtype=runs_in, stored_dtype=stored,
    )
    return Seq2SeqLoaded(model=model, tokenizer=tokenizer, info=info, blocks_path=blocks_path,
                         attention_name=name, blocks=blocks, attention_kind=attention,
                         cross_name=cross_name, self_name=self_name)


def _pieces(loaded: Loaded, ids: list[int], ascii_only: bool) -> tuple[str, ...]:
    byte_level = is_byte_level(loaded.tokenizer)
    return tuple(readable_token(str(piece), byte_level=byte_level, ascii_only=ascii_only)
                 for piece in loaded.tokenizer.convert_ids_to_tokens(ids))


def _checked_length(loaded: Loaded, ids: list[int], what: str) -> None:
    if not ids:
        raise HfError(f"{what} gives no tokens; give at least one word, e.g. \"The cat sat\"")
    limit = loaded.info.max_positions
    if limit is not None and len(ids) > limit:
        raise HfError(f"{what} has {len(ids)} tokens but {loaded.info.name} reads at most "
                      f"{limit}")


def decoder_input(loaded: Seq2SeqLoaded, sentence: str, *, ascii_only: bool = False
                  ) -> tuple[list[int], tuple[str, ...]]:
    """The decoder's input ids for the sentence and each piece made readable: the labels
    `tokenizer(text_target=sentence)` shifted right by the model's own
    prepare_decoder_input_ids_from_labels (the decoder start token, then the labels but the
    last)."""
    labels = list(loaded.tokenizer(text_target=sentence)["input_ids"])
    _checked_length(loaded, labels, "the sentence")
    shifted = loaded.model.prepare_decoder_input_ids_from_labels(
        labels=torch.tensor([labels]))  # (B, T_q)
    ids = [int(i) for i in shifted[0]]
    return ids, _pieces(loaded, ids, ascii_only)


def encoder_input(loaded: Seq2SeqLoaded, context: str, *, ascii_only: bool = False
                  ) -> tuple[list[int], tuple[str, ...]]:
    """The encoder's input ids for the context (`tokenizer(context)`) and its readable pieces."""
    ids = list(loaded.tokenizer(context)["input_ids"])
    _checked_length(loaded, ids, "--context")
    return ids, _pieces(loaded, ids, ascii_only)
