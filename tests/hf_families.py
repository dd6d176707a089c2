"""Tiny random checkpoints of the Hugging Face families people actually run, built offline.

Every family of issue 17 at the same small size: 2 layers, C = 32, 4 query heads (d_h = 8),
2 key/value heads where the family shares them (1 for Falcon's multi-query and Gemma), a
sliding window of 2 for Mistral, a local layer (window 2) for GPT-Neo, partial rotary for
GPT-J, GPT-NeoX and Phi, ALiBi for BLOOM and MPT, T5's relative-position buckets. Each is
saved with `save_pretrained` beside a small tokenizer trained here with `tokenizers` (no hub,
no network), in the kind of tokenizer the family ships: byte-level BPE for the GPT and OPT
families and RoBERTa, SentencePiece-style BPE (the `▁` word mark) for Llama, Mistral and
Gemma, WordPiece for BERT and DistilBERT, a Unigram model for T5.

`build(name, directory)` writes one family; `FAMILIES` says what each one is for. Building
one takes well under a second; the test fixtures cache each directory for the session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .hf_models import SENTENCES

C, H, H_KV, LAYERS, VOCAB, POSITIONS = 32, 4, 2, 2, 300, 64
WINDOW = 2  # Mistral's sliding window and GPT-Neo's local window: smaller than a sentence
# A sentence long enough for the window to matter (more than WINDOW + 3 tokens in every
# family's tokenizer).
SENTENCE = "The cat sat on the mat."


@dataclass(frozen=True)
class Family:
    """One family: how to build its config and model, its tokenizer, and what it shows."""

    name: str
    model_class: str  # the transformers class saved (what a real checkpoint's config names)
    config: Callable[[int], Any]  # vocabulary size -> a config
    tokenizer: str  # "bytes", "sentencepiece", "wordpiece" or "unigram"
    mechanisms: tuple[str, ...]  # what issue 17 says each shows: rotary, kv_repeat, alibi ...
    encoder: bool = False
    attention: str = ""  # the attention module's path in layer 0, for the tests
    extra: dict[str, Any] = field(default_factory=dict)


def _rope(partial: float = 1.0, theta: float = 10000.0) -> dict[str, Any]:
    parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if partial != 1.0:
        parameters["partial_rotary_factor"] = partial
    return parameters


def _gpt_neo(vocab: int) -> Any:
    from transformers import GPTNeoConfig

    # Layer 0 global, layer 1 local (GPT-Neo alternates them), window 2.
    return GPTNeoConfig(vocab_size=vocab, max_position_embeddings=POSITIONS, hidden_size=C,
                        num_layers=LAYERS, num_heads=H, attention_types=[[["global", "local"], 1]],
                        window_size=WINDOW, intermediate_size=2 * C, bos_token_id=0, eos_token_id=0)


def _gptj(vocab: int) -> Any:
    from transformers import GPTJConfig

    # GPT-J rotates the first rotary_dim channels of each head, pairs interleaved (0,1), (2,3).
    return GPTJConfig(vocab_size=vocab, n_positions=POSITIONS, n_embd=C, n_layer=LAYERS, n_head=H,
                      rotary_dim=4, n_inner=2 * C, bos_token_id=0, eos_token_id=0)


def _gpt_neox(vocab: int) -> Any:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=vocab, hidden_size=C, num_hidden_layers=LAYERS,
                         num_attention_heads=H, intermediate_size=2 * C,
                         max_position_embeddings=POSITIONS, rope_parameters=_rope(0.5),
                         bos_token_id=0, eos_token_id=0)


def _phi(vocab: int) -> Any:
    from transformers import PhiConfig

    return PhiConfig(vocab_size=vocab, hidden_size=C, intermediate_size=2 * C,
                     num_hidden_layers=LAYERS, num_attention_heads=H, num_key_value_heads=H,
                     max_position_embeddings=POSITIONS, rope_parameters=_rope(0.5),
                     bos_token_id=0, eos_token_id=0)


def _llama_like(config_class: str, **extra: Any) -> Callable[[int], Any]:
    def make(vocab: int) -> Any:
        import transformers

        sizes: dict[str, Any] = dict(vocab_size=vocab, hidden_size=C, intermediate_size=2 * C,
                                     num_hidden_layers=LAYERS, num_attention_heads=H,
                                     num_key_value_heads=H_KV, max_position_embeddings=POSITIONS,
                                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
        sizes.update(extra)
        return getattr(transformers, config_class)(**sizes)
    return make


def _bloom(vocab: int) -> Any:
    from transformers import BloomConfig

    return BloomConfig(vocab_size=vocab, hidden_size=C, n_layer=LAYERS, n_head=H,
                       bos_token_id=0, eos_token_id=0)


def _falcon(vocab: int) -> Any:
    from transformers import FalconConfig

    # Falcon-7B's layout: one fused query_key_value, multi-query (one K/V head), rotary,
    # attention and MLP in parallel.
    return FalconConfig(vocab_size=vocab, hidden_size=C, num_hidden_layers=LAYERS,
                        num_attention_heads=H, multi_query=True, new_decoder_architecture=False,
                        parallel_attn=True, alibi=False, max_position_embeddings=POSITIONS,
                        bos_token_id=0, eos_token_id=0)


def _opt(vocab: int) -> Any:
    from transformers import OPTConfig

    return OPTConfig(vocab_size=vocab, hidden_size=C, num_hidden_layers=LAYERS, ffn_dim=2 * C,
                     num_attention_heads=H, word_embed_proj_dim=C,
                     max_position_embeddings=POSITIONS, bos_token_id=0, eos_token_id=0,
                     pad_token_id=1)


def _mpt(vocab: int) -> Any:
    from transformers import MptConfig

    return MptConfig(vocab_size=vocab, d_model=C, n_heads=H, n_layers=LAYERS, expansion_ratio=2,
                     max_seq_len=POSITIONS, attn_config={"alibi": True}, bos_token_id=0,
                     eos_token_id=0)


def _bert(vocab: int) -> Any:
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab, hidden_size=C, num_hidden_layers=LAYERS,
                      num_attention_heads=H, intermediate_size=2 * C,
                      max_position_embeddings=POSITIONS, pad_token_id=0)


def _roberta(vocab: int) -> Any:
    from transformers import RobertaConfig

    # RoBERTa's positions start after the padding index (padding_idx + 1 = 2).
    return RobertaConfig(vocab_size=vocab, hidden_size=C, num_hidden_layers=LAYERS,
                         num_attention_heads=H, intermediate_size=2 * C,
                         max_position_embeddings=POSITIONS + 2, pad_token_id=1, bos_token_id=0,
                         eos_token_id=2)


def _distilbert(vocab: int) -> Any:
    from transformers import DistilBertConfig

    return DistilBertConfig(vocab_size=vocab, dim=C, n_layers=LAYERS, n_heads=H, hidden_dim=2 * C,
                            max_position_embeddings=POSITIONS, pad_token_id=0)


def _t5(vocab: int) -> Any:
    from transformers import T5Config

    return T5Config(vocab_size=vocab, d_model=C, d_kv=C // H, d_ff=2 * C, num_layers=LAYERS,
                    num_heads=H, relative_attention_num_buckets=8,
                    relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1,
                    decoder_start_token_id=0)


FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("gpt-neo", "GPTNeoForCausalLM", _gpt_neo, "bytes", ("positions", "local_window"),
           attention="transformer.h.0.attn.attention"),
    Family("gpt-j", "GPTJForCausalLM", _gptj, "bytes", ("rotary_interleaved", "partial_rotary"),
           attention="transformer.h.0.attn"),
    Family("gpt-neox", "GPTNeoXForCausalLM", _gpt_neox, "bytes", ("rotary_half", "partial_rotary"),
           attention="gpt_neox.layers.0.attention"),
    Family("phi", "PhiForCausalLM", _phi, "bytes", ("rotary_half", "partial_rotary"),
           attention="model.layers.0.self_attn"),
    Family("llama", "LlamaForCausalLM", _llama_like("LlamaConfig"), "sentencepiece",
           ("rotary_half", "kv_repeat"), attention="model.layers.0.self_attn"),
    Family("mistral", "MistralForCausalLM", _llama_like("MistralConfig", sliding_window=WINDOW),
           "sentencepiece", ("rotary_half", "kv_repeat", "sliding_window"),
           attention="model.layers.0.self_attn"),
    Family("qwen2", "Qwen2ForCausalLM", _llama_like("Qwen2Config"), "bytes",
           ("rotary_half", "kv_repeat"), attention="model.layers.0.self_attn"),
    Family("gemma", "GemmaForCausalLM", _llama_like("GemmaConfig", num_key_value_heads=1,
                                                    head_dim=C // H),
           "sentencepiece", ("rotary_half", "multi_query", "scaled_embeddings"),
           attention="model.layers.0.self_attn"),
    Family("bloom", "BloomForCausalLM", _bloom, "bytes", ("alibi", "fused_qkv"),
           attention="transformer.h.0.self_attention"),
    Family("falcon", "FalconForCausalLM", _falcon, "bytes",
           ("rotary_half", "multi_query", "fused_qkv"),
           attention="transformer.h.0.self_attention"),
    Family("opt", "OPTForCausalLM", _opt, "bytes", ("q_scaled", "offset_positions"),
           attention="model.decoder.layers.0.self_attn"),
    Family("mpt", "MptForCausalLM", _mpt, "bytes", ("alibi", "fused_qkv"),
           attention="transformer.blocks.0.attn"),
    Family("bert", "BertForMaskedLM", _bert, "wordpiece",
           ("bidirectional", "positions", "padding"),
           encoder=True, attention="bert.encoder.layer.0.attention.self"),
    Family("roberta", "RobertaForMaskedLM", _roberta, "bytes-roberta",
           ("bidirectional", "offset_positions"), encoder=True,
           attention="roberta.encoder.layer.0.attention.self"),
    # DistilBERT scaled Q before the scores until transformers 5; it now scales the scores.
    Family("distilbert", "DistilBertForMaskedLM", _distilbert, "wordpiece",
           ("bidirectional", "positions"), encoder=True,
           attention="distilbert.transformer.layer.0.attention"),
    Family("t5", "T5ForConditionalGeneration", _t5, "unigram",
           ("bidirectional", "relative_bias", "unscaled"), encoder=True,
           attention="encoder.block.0.layer.0.SelfAttention"),
)}


def _bart(vocab: int) -> Any:
    from transformers import BartConfig

    # BART's layout: learned positions from row 2 on, a norm on the embeddings, post-norm
    # layers, every projection with a bias, q scaled by 1/sqrt(d_h) before the scores.
    return BartConfig(vocab_size=vocab, d_model=C, encoder_layers=LAYERS, decoder_layers=LAYERS,
                      encoder_attention_heads=H, decoder_attention_heads=H,
                      encoder_ffn_dim=2 * C, decoder_ffn_dim=2 * C,
                      max_position_embeddings=POSITIONS, pad_token_id=1, bos_token_id=0,
                      eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)


def _marian(vocab: int) -> Any:
    from transformers import MarianConfig

    # Marian's layout (opus-mt): sinusoidal positions, embeddings scaled by sqrt(d_model),
    # the decoder starting from the pad token.
    return MarianConfig(vocab_size=vocab, decoder_vocab_size=vocab, d_model=C,
                        encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=H,
                        decoder_attention_heads=H, encoder_ffn_dim=2 * C, decoder_ffn_dim=2 * C,
                        max_position_embeddings=POSITIONS, scale_embedding=True, pad_token_id=0,
                        eos_token_id=2, decoder_start_token_id=0, forced_eos_token_id=2)


# Encoder-decoders explained with --context (`load.hf_seq2seq`): the decoder's layers, their
# cross-attention (`cross`) and self-attention (`attention`). Without --context, --hf shows
# each one's encoder (T5's is also FAMILIES["t5"]).
SEQ2SEQ: dict[str, Family] = {family.name: family for family in (
    Family("t5", "T5ForConditionalGeneration", _t5, "unigram",
           ("relative_bias", "unscaled"), attention="decoder.block.0.layer.0.SelfAttention",
           extra={"cross": "decoder.block.0.layer.1.EncDecAttention"}),
    Family("bart", "BartForConditionalGeneration", _bart, "bytes-roberta",
           ("offset_positions", "q_scaled"), attention="model.decoder.layers.0.self_attn",
           extra={"cross": "model.decoder.layers.0.encoder_attn"}),
    Family("marian", "MarianMTModel", _marian, "sentencepiece",
           ("sinusoidal_positions", "scaled_embeddings"),
           attention="model.decoder.layers.0.self_attn",
           extra={"cross": "model.decoder.layers.0.encoder_attn"}),
)}


# ---------------------------------------------------------------- tokenizers


def _corpus() -> list[str]:
    return SENTENCES * 3


def _bytes_tokenizer(roberta: bool = False) -> Any:
    from tokenizers import ByteLevelBPETokenizer

    if roberta:
        from transformers import RobertaTokenizerFast

        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(_corpus(), vocab_size=VOCAB, min_frequency=1,
                                special_tokens=specials, show_progress=False)
        return RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>",
                                    eos_token="</s>", sep_token="</s>", cls_token="<s>",
                                    unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")
    from .hf_models import tiny_tokenizer

    return tiny_tokenizer()


def _sentencepiece_tokenizer() -> Any:
    """BPE over `▁`-marked words, as Llama's tokenizer.model is (trained here, no sentencepiece)."""
    from tokenizers import SentencePieceBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    bpe = SentencePieceBPETokenizer()
    bpe.train_from_iterator(_corpus(), vocab_size=VOCAB, min_frequency=1, special_tokens=specials,
                            show_progress=False)
    # Llama's tokenizer puts <s> before every sequence.
    bpe._tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def _wordpiece_tokenizer(distil: bool = False) -> Any:
    """BERT's kind: lower-cased words of the corpus, and every character alone and as a `##`
    continuation, numbered in sorted order (the `tokenizers` trainer numbers ties, and picks
    among them, in hash order, which changes from run to run)."""
    from tokenizers import BertWordPieceTokenizer, models
    from transformers import BertTokenizerFast, DistilBertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    backend = wordpiece._tokenizer
    normalised = (backend.normalizer.normalize_str(sentence) for sentence in _corpus())
    words = {word for text in normalised for word, _ in backend.pre_tokenizer.pre_tokenize_str(text)}
    pieces = words | {char for word in words for char in word} | {
        f"##{char}" for word in words for char in word}
    backend.model = models.WordPiece(
        {token: i for i, token in enumerate(specials + sorted(pieces))}, unk_token="[UNK]")
    kind = DistilBertTokenizerFast if distil else BertTokenizerFast
    return kind(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]",
                pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")


def _unigram_tokenizer() -> Any:
    """A Unigram model, as T5's spiece.model is: each `▁word` of the corpus and every character,
    scored by its log frequency in the corpus (the trainer of `tokenizers` prunes a corpus this
    small down to single characters)."""
    import math
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = Counter(f"\u2581{word}" for sentence in _corpus() for word in sentence.split())
    chars = Counter(char for sentence in _corpus() for char in sentence.replace(" ", "\u2581"))
    total = sum(words.values()) + sum(chars.values())
    specials = ["<pad>", "</s>", "<unk>"]
    vocab = [(token, 0.0) for token in specials]
    vocab += [(word, math.log(n / total)) for word, n in sorted(words.items())]
    vocab += [(char, math.log(n / total) - 10.0) for char, n in sorted(chars.items())
              if char not in words]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=2))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    # T5 appends </s> to every sequence, as T5's own tokenizer does.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")


def tokenizer_for(family: Family) -> Any:
    if family.tokenizer == "bytes":
        return _bytes_tokenizer()
    if family.tokenizer == "bytes-roberta":
        return _bytes_tokenizer(roberta=True)
    if family.tokenizer == "sentencepiece":
        return _sentencepiece_tokenizer()
    if family.tokenizer == "wordpiece":
        return _wordpiece_tokenizer(distil=family.name == "distilbert")
    if family.tokenizer == "unigram":
        return _unigram_tokenizer()
    raise ValueError(family.tokenizer)


# ---------------------------------------------------------------- models


def model_for(family: Family, vocab_size: int, *, seed: int = 0) -> Any:
    """The family's model class with a fixed seed, eval mode, eager attention."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = family.config(vocab_size)
    config._attn_implementation = "eager"
    return getattr(transformers, family.model_class)(config).eval()


def build(name: str, directory: Path, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Save family `name`'s tiny checkpoint and tokenizer into directory (save_pretrained),
    its weights in dtype (bfloat16, float16: as the checkpoints people download are shipped;
    config.json then says `"dtype": "bfloat16"`)."""
    import torch

    family = FAMILIES.get(name) or SEQ2SEQ[name]
    tokenizer = tokenizer_for(family)
    model = model_for(family, len(tokenizer), seed=seed).to(getattr(torch, dtype))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def attention_of(model: Any, family: Family, layer: int = 0) -> Any:
    """The family's self-attention module of layer `layer` (the tests' own path, not load/hf.py's)."""
    path = family.attention.replace(".0.", f".{layer}.", 1)
    return model.get_submodule(path)
