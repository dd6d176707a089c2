"""`--hf`: finding and loading a Hugging Face model (a causal LM or an encoder) and its tokenizer.

Finds the model in a local directory or in the local Hugging Face cache, loads it with
`transformers` in eval mode with the eager attention implementation (so the attention
weights exist as tensors), tokenizes the sentence and makes each piece readable, and
estimates what recording its layers would cost. Every refusal is an `HfError` (one line).
Recording the forward is `mha_tui.tracing.hf_layers`; the stages are `mha_tui.pipeline.hf`.

Must never download: `local_files_only=True` everywhere, and the hub's offline switches are
set before `transformers` is imported. Must never load weights in a way that can execute
code: safetensors, or `torch.load(weights_only=True)`, and never a model's own remote code.
Imported only for `--hf`; `transformers` is the optional extra `mha-tui[hf]`. The only
module of mha-tui that imports transformers; `hf_tokens` (the token count from tokenizer.json,
for the refusals `hf_files` makes before torch) is the only other one that imports tokenizers.
Never import rich, textual or typer here, nor the tracer or the recogniser.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..budget import FLOAT, recorded_elements
from ..config import DTYPE_CHOICES
from . import hf_stream
from .hf_error import HfError
from .hf_files import checked_directory, hub_cache, locate
from .hf_stream import Streamer

# HfError is raised here, defined where the tracer can raise it too (hf_error.py); where the
# model is, and the files it needs, are hf_files' (read without torch, before this module).
__all__ = ["HfError", "hub_cache", "locate"]

INSTALL_HINT = 'pip install "mha-tui[hf]"'
# Where a block keeps its self-attention, across the families transformers ships
# (GPT-2 and GPT-J: attn; Llama, OPT, Mistral: self_attn; GPT-NeoX: attention; Falcon,
# Bloom: self_attention).
ATTENTION_NAMES = ("attn", "self_attn", "attention", "self_attention")
SPACE_MARK = "\u2423"  # ␣, the visible space
ASCII_SPACE_MARK = "_"
# Every layer's stages are recorded in the one forward pass while the copies the tracer
# keeps stay below this many bytes (estimated from the model's sizes: see all_layers_limit).
ALL_LAYERS_BUDGET = 256 * 2**20
# `--dtype`: what the model runs and is recorded in. "auto" is the checkpoint's own dtype.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
# safetensors' names for the float dtypes (its header says each tensor's).
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}



def _offline() -> None:
    """Tell the hub libraries, before they are imported, that there is no network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def import_transformers() -> Any:
    _offline()
    try:
        import transformers
    except ImportError:
        raise HfError(f"--hf needs Hugging Face transformers, which is not installed: "
                      f"{INSTALL_HINT}") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


# ---------------------------------------------------------------- the loaded model


@dataclass(frozen=True)
class ModelInfo:
    """What the header says about the model."""

    name: str
    path: str
    class_name: str
    n_layers: int
    embed_dim: int
    num_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int | None
    # Numbers in one layer's attention parameters (the recorder keeps a float32 copy of each
    # per recorded layer); None: estimated as a GPT-2 layer's, 4 C x C weights and 4 C biases.
    attention_params: int | None = None
    # An encoder (BERT, RoBERTa, DistilBERT, T5's encoder), loaded as the bare encoder: its
    # self-attention lets every token see every token. False: a causal language model.
    encoder: bool = False
    # The encoder of an encoder-decoder (T5, BART, Marian): its model_type ("t5"); "" else.
    encoder_of: str = ""
    # What the model runs and is recorded in, and the checkpoint's own dtype (they differ
    # only when `--dtype` asked for another one: "upcast from bfloat16 on request").
    dtype: str = "float32"
    stored_dtype: str = "float32"
    # config.json's rotary scaling, as plain numbers and words (rope_type, rope_theta,
    # factor, alpha, max_position_embeddings): what kinds.rotary.ntk names. () for none.
    rope: tuple[tuple[str, float | str], ...] = ()


def rope_of(config: Any) -> tuple[tuple[str, float | str], ...]:
    """The rotary scaling config.json asks for: `rope_parameters` (transformers 5), else the
    older `rope_scaling` with `rope_theta` beside it; () when it asks for none, or keeps one
    per layer type (Gemma 3: mha-tui names none there)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        return ()
    kept: dict[str, float | str] = {}
    for key in ("rope_type", "type", "rope_theta", "factor", "alpha"):
        value = params.get(key, getattr(config, key, None) if key == "rope_theta" else None)
        if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
            kept[key] = value if isinstance(value, str) else float(value)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int):
        kept["max_position_embeddings"] = float(positions)
    return tuple(kept.items())


@dataclass(eq=False)
class Loaded:
    """A causal LM or an encoder in eval mode, its tokenizer, and the path to every layer's
    self-attention (a dotted path inside the block: T5's is layer.0.SelfAttention)."""

    model: nn.Module
    tokenizer: Any
    info: ModelInfo
    blocks_path: str
    attention_name: str
    blocks: Sequence[nn.Module] = field(repr=False)
    # Streamed (load.hf_stream): the blocks are on the meta device and read from the
    # checkpoint as a forward reaches them. None: every weight is in memory.
    stream: Streamer | None = field(default=None, repr=False)
    # Why a checkpoint asked to stream was loaded whole ("" when it streams or was not asked).
    note: str = ""

    def attention(self, layer: int) -> nn.Module:
        return self.blocks[layer].get_submodule(self.attention_name)

    def attention_path(self, layer: int) -> str:
        return f"{self.blocks_path}.{layer}.{self.attention_name}"


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (transformers raises many kinds, long ones)."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _find_blocks(model: nn.Module, n_layers: int) -> tuple[str, nn.ModuleList, str] | None:
    """The model's list of layers and the name of the self-attention inside each."""
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) != n_layers or not n_layers:
            continue
        for name in ATTENTION_NAMES:
            if all(isinstance(getattr(block, name, None), nn.Module) for block in module):
                return path, module, name
        name = _self_attention_path(module[0])
        if name is not None and all(_self_attention_path(block) == name for block in module):
            return path, module, name
    return None


def _self_attention_path(block: nn.Module) -> str | None:
    """The one innermost submodule of block whose class is an attention and not a cross
    attention (T5's block holds layer.0, a T5LayerSelfAttention with its norm and residual
    add, around layer.0.SelfAttention, the T5Attention that computes the weights)."""
    found = [path for path, sub in block.named_modules()
             if path and type(sub).__name__.endswith("Attention")
             and "cross" not in path.lower() and "cross" not in type(sub).__name__.lower()]
    inner = [path for path in found if not any(other.startswith(path + ".") for other in found)]
    return inner[0] if len(inner) == 1 else None


def auto_class(transformers: Any, config: Any) -> tuple[Any, bool]:
    """Which transformers Auto class loads the model, and whether it is an encoder.

    An encoder-decoder (T5) and a masked-language-model family that is not configured as a
    decoder (BERT, RoBERTa, DistilBERT: `is_decoder` False) load as the bare encoder with
    AutoModelForTextEncoding (T5EncoderModel, BertModel ...), never with a causal-LM head
    (BERT and RoBERTa have one, BertLMHeadModel, which would run them as what they are not).
    An encoder-decoder whose encoder transformers cannot load alone (BART, Marian) loads
    whole with AutoModel, and `load` keeps its encoder: without `--context` every text
    encoder-decoder shows its encoder (with `--context`, its decoder: `load.hf_seq2seq`).
    Everything else loads with AutoModelForCausalLM.
    """
    kind = type(config)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    masked = kind in transformers.MODEL_FOR_MASKED_LM_MAPPING
    if not encoder_decoder and not (masked and not getattr(config, "is_decoder", False)):
        return transformers.AutoModelForCausalLM, False
    if kind in transformers.MODEL_FOR_TEXT_ENCODING_MAPPING:
        return transformers.AutoModelForTextEncoding, True
    if encoder_decoder and kind not in transformers.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING:
        raise HfError(f"{config.model_type} is an encoder-decoder whose encoder does not read a "
                      f"sentence (Whisper's reads audio); mha-tui explains text models such as "
                      f"T5, BART and Marian")
    # BART, Marian: the whole encoder-decoder, whose encoder `load` takes out (get_encoder())
    return transformers.AutoModel, True


def stored_dtype(config: Any, path: Path) -> str:
    """The checkpoint's own float dtype: config.json's `dtype` (`torch_dtype` before
    transformers 5), else the first float tensor's in a safetensors file's header, else
    float32 (a `.bin` checkpoint without the field: transformers' own default)."""
    said = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(said).removeprefix("torch.") if said is not None else ""
    if name in DTYPES:
        return name
    for file in sorted(path.glob("*.safetensors")):
        try:
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as weights:
                for key in weights.keys():
                    kind = _SAFETENSORS_DTYPES.get(weights.get_slice(key).get_dtype())
                    if kind is not None:
                        return kind
        except Exception:  # an unreadable header: transformers says so when it loads
            break
    return "float32"


def chosen_dtype(asked: str, stored: str) -> str:
    """`--dtype`: auto is the checkpoint's own; anything else is what was asked for."""
    if asked == "auto":
        return stored
    if asked not in DTYPES:
        raise HfError(f"--dtype {asked!r} is not one of {', '.join(DTYPE_CHOICES)}")
    return asked


def load(source: str, sentence: str | None = None, *, stream: bool = False,
         dtype: str = "auto") -> Loaded:
    """Find, check and load the model and tokenizer; every refusal is an HfError.

    sentence: when given, it is tokenized and refused if it has more tokens than the
    model's config.json says the model reads, before any weight is loaded.
    stream: build the model on the meta device and read its blocks from the checkpoint as a
    forward needs them (load.hf_stream); a checkpoint that cannot be read tensor by tensor
    is loaded whole, and `Loaded.note` says why.
    dtype: what the model runs in; "auto", the checkpoint's own dtype (a bfloat16 model is
    explained in bfloat16, with its own numbers), or a name from DTYPE_CHOICES (upcast or
    cast on request; the header says so).
    """
    transformers = import_transformers()
    path = checked_directory(source)
    tokenizer, config = tokenizer_and_config(source, path)
    if sentence is not None:
        _refuse_too_long(source, config, tokenizer, sentence)
    try:
        auto, encoder = auto_class(transformers, config)
    except HfError as error:
        raise HfError(f"--hf {source}: {error}") from None
    what = "an encoder" if encoder else "a causal language model"
    # an encoder-decoder's encoder (T5's loads alone; BART's and Marian's are taken out of
    # the whole model, which is then loaded whole, not streamed)
    encoder_of = str(config.model_type) if getattr(config, "is_encoder_decoder", False) else ""
    whole = encoder_of and type(config) not in transformers.MODEL_FOR_TEXT_ENCODING_MAPPING
    stored = stored_dtype(config, path)
    runs_in = chosen_dtype(dtype, stored)
    torch_dtype = DTYPES[runs_in]
    streamer, note, model = None, "", None
    if stream and whole:
        note = (f"{source} is loaded whole, not streamed: its encoder is taken from the whole "
                f"encoder-decoder")
    elif stream:
        n_config_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        try:
            built = hf_stream.build(auto, path, config, torch_dtype,
                                    lambda empty: _find_blocks(empty, n_config_layers))
        except Exception as error:  # transformers raises many kinds: then load it whole
            built = f"{type(error).__name__}: {first_line(error)}"
        if isinstance(built, str):
            _refuse_whole(source, built, torch_dtype.itemsize, sentence)
            note = f"{source} is loaded whole, not streamed: {built}"
        else:
            streamer, _ = built
            model = streamer.model
    if model is None:
        try:
            model = auto.from_pretrained(
                path, config=config, local_files_only=True, trust_remote_code=False,
                weights_only=True, attn_implementation="eager", dtype=torch_dtype,
            )
        except Exception as error:  # transformers raises many kinds; the learner gets one line
            raise HfError(f"--hf {source}: could not load {what} from {path}: "
                          f"{first_line(error)}") from None
    model.eval()
    if whole:
        model = model.get_encoder()
    config = model.config
    n_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    found = _find_blocks(model, n_layers)
    if found is None:
        raise HfError(f"--hf {source}: {type(model).__name__} has no recognisable self-attention "
                      f"submodule in its layers (looked for {', '.join(ATTENTION_NAMES)}); "
                      f"mha-tui explains attention models such as GPT-2")
    blocks_path, blocks, attention_name = found
    embed_dim = int(config.hidden_size)
    num_heads = int(config.num_attention_heads)
    attention = blocks[0].get_submodule(attention_name)
    info = ModelInfo(
        name=source, path=str(path), class_name=type(model).__name__, n_layers=n_layers,
        embed_dim=embed_dim, num_heads=num_heads,
        head_dim=int(getattr(attention, "head_dim", None)
                     or getattr(attention, "key_value_proj_dim", None)  # T5's d_kv
                     or embed_dim // num_heads),
        vocab_size=int(config.vocab_size),
        max_positions=getattr(config, "max_position_embeddings", None),
        attention_params=sum(p.numel() for p in attention.parameters()), encoder=encoder,
        encoder_of=encoder_of, dtype=runs_in, stored_dtype=stored, rope=rope_of(config),
    )
    return Loaded(model=model, tokenizer=tokenizer, info=info, blocks_path=blocks_path,
                  attention_name=attention_name, blocks=blocks, stream=streamer, note=note)


def _refuse_whole(source: str, why: str, element_bytes: int, sentence: str | None) -> None:
    """A checkpoint asked to stream that cannot be (a shard too big to map, a weight missing
    under its name ...) is loaded whole only where it fits: the CLI's estimate before torch
    counted it streamed."""
    from .. import budget
    from .hf_files import run_shape

    shape = run_shape(source, None, sentence or "", element_bytes)
    available = budget.available_memory()
    if shape is None or available is None:
        return
    need = budget.hf_whole_bytes(shape)
    if need > available.bytes:
        raise HfError(f"--hf {source} cannot be streamed ({why}), and loaded whole it needs "
                      f"about {budget.human(need)} of memory; {budget.human(available.bytes)} is "
                      f"available ({available.source})")


def tokenizer_and_config(source: str, path: Path) -> tuple[Any, Any]:
    """The checkpoint's tokenizer and config.json, read by transformers from the local files
    (never the model's own code); each refusal one line (`load` and `hf_seq2seq.load`)."""
    transformers = import_transformers()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=False)
    except Exception as error:
        raise HfError(f"--hf {source}: could not load the tokenizer in {path}: "
                      f"{first_line(error)}") from None
    try:
        config = transformers.AutoConfig.from_pretrained(
            path, local_files_only=True, trust_remote_code=False)
    except Exception as error:
        raise HfError(f"--hf {source}: could not read {path / 'config.json'}: "
                      f"{first_line(error)}") from None
    return tokenizer, config


def _refuse_too_long(source: str, config: Any, tokenizer: Any, sentence: str) -> None:
    """More tokens than config.json's max_position_embeddings (n_positions): refused from
    the tokenizer and the config alone, before the weights load."""
    limit = getattr(config, "max_position_embeddings", None)
    n = len(tokenizer(sentence, add_special_tokens=True)["input_ids"])
    if limit is not None and n > limit:
        raise HfError(f"the sentence has {n} tokens but {source} reads at most {limit}")


def check_layer(loaded: Loaded, layer: int) -> None:
    n = loaded.info.n_layers
    if not 0 <= layer < n:
        raise HfError(f"--layer {layer} is out of range: {loaded.info.name} has {n} layers, "
                      f"0 to {n - 1}")


def recorded_bytes(info: ModelInfo, T: int, layers: int | None = None) -> int:
    """About how many bytes the tracer keeps for `layers` layers on a T-token sentence: each
    layer's recorded activations and its copy of the layer's parameters, float32."""
    C = info.embed_dim
    params = info.attention_params if info.attention_params is not None else 4 * C * C + 4 * C
    per_layer = FLOAT * recorded_elements(T, C, info.num_heads, params)
    return (info.n_layers if layers is None else layers) * per_layer


def all_layers_limit(info: ModelInfo, budget: int = ALL_LAYERS_BUDGET) -> int:
    """The longest sentence (in tokens) for which every layer is recorded in one pass.

    Memory grows with layers * (h * T^2 + C * T); beyond this length only the layer shown
    is recorded, and moving to another layer runs the forward again.
    """
    T = 1
    while recorded_bytes(info, T + 1) <= budget:
        T += 1
    return T


# ---------------------------------------------------------------- tokens


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character (its published map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_OF = {char: byte for byte, char in _bytes_to_unicode().items()}


def is_byte_level(tokenizer: Any) -> bool:
    if not hasattr(tokenizer, "backend_tokenizer"):  # --model induction's words (load.trained)
        return False
    from tokenizers import decoders

    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return isinstance(decoder, decoders.ByteLevel)


def readable_token(piece: str, *, byte_level: bool, ascii_only: bool = False) -> str:
    """A tokenizer's piece as a learner reads it: `Ġcat` -> `␣cat`, bytes decoded to text.

    A byte-level piece that holds part of a character (an emoji cut in two) keeps the bytes
    that do not form text as `\\xNN`. Spaces become a visible mark; other control characters
    are left for render.text.printable to make visible.
    """
    text = piece
    if byte_level and piece and all(char in _BYTE_OF for char in piece):
        text = bytes(_BYTE_OF[char] for char in piece).decode("utf-8", "backslashreplace")
    elif "\u2581" in piece:  # SentencePiece's word-start mark
        text = piece.replace("\u2581", " ")
    return text.replace(" ", ASCII_SPACE_MARK if ascii_only else SPACE_MARK)


def tokenize(loaded: Loaded, sentence: str, *, ascii_only: bool = False
             ) -> tuple[list[int], tuple[str, ...]]:
    """The tokenizer's ids for the sentence and each piece made readable."""
    tokenizer = loaded.tokenizer
    ids = list(tokenizer(sentence, add_special_tokens=True)["input_ids"])
    if not ids:
        raise HfError("the sentence gives no tokens; give at least one word, e.g. \"The cat sat\"")
    limit = loaded.info.max_positions
    if limit is not None and len(ids) > limit:
        raise HfError(f"the sentence has {len(ids)} tokens but {loaded.info.name} reads at most "
                      f"{limit}")
    byte_level = is_byte_level(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    return ids, tuple(readable_token(str(p), byte_level=byte_level, ascii_only=ascii_only)
                      for p in pieces)
