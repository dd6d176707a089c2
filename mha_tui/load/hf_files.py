"""`--hf` from the checkpoint's own files: where it is, and what refuses it before any weight.

Everything here is read from files, without torch or transformers (a `--hf` refusal that
the files decide costs a fraction of the torch import): the model directory (a path, or its
snapshot in the local Hugging Face cache, found the way the hub lays the cache out),
config.json (json), and the sentence's token count from tokenizer.json with the `tokenizers`
package, counted as the transformers tokenizer `--hf` runs with counts it (or, for a sentence
that surely fits, only an upper bound read without the vocabulary).

That count is given only where the files decide it (`hf_tokens`: the tokenizer class
transformers picks is one whose pipeline is rebuilt there, and the sentence holds none of
its added or special tokens). Anything else (no tokenizer.json, a slow-only tokenizer,
another class, remote code, a config field missing, another transformers major version)
is not decided here, and `load.hf.load` decides with transformers itself, as before: a
refusal here is never one transformers would not make, and one it would make is never
missed (the full path checks again).

Imported by the CLI before `load.hf`; never imports torch, transformers or huggingface_hub
(an import-linter contract, and a subprocess test that the refusal loads neither).
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from ..budget import HfShape
from .hf_error import HfError
from .hf_tokens import read_json, token_bound, token_count

WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model", "vocab.txt")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

# What transformers 5 reads from each family's config.json (the model types of
# tests/hf_families.py and GPT-2): its number of layers (`num_hidden_layers`) and the
# positions it reads (`max_position_embeddings`; None: the config has no such attribute, as
# BLOOM's, MPT's and T5's do not, and no sentence is refused for length). A type not
# listed here is decided by transformers. tests/test_hf_files.py checks every entry against AutoConfig.
_LAYERS_AND_POSITIONS: dict[str, tuple[str, str | None]] = {
    "gpt2": ("n_layer", "n_positions"), "gptj": ("n_layer", "n_positions"),
    "gpt_neo": ("num_layers", "max_position_embeddings"),
    "gpt_neox": ("num_hidden_layers", "max_position_embeddings"),
    "phi": ("num_hidden_layers", "max_position_embeddings"),
    "llama": ("num_hidden_layers", "max_position_embeddings"),
    "mistral": ("num_hidden_layers", "max_position_embeddings"),
    "qwen2": ("num_hidden_layers", "max_position_embeddings"),
    "gemma": ("num_hidden_layers", "max_position_embeddings"),
    "falcon": ("num_hidden_layers", "max_position_embeddings"),
    "opt": ("num_hidden_layers", "max_position_embeddings"),
    "bert": ("num_hidden_layers", "max_position_embeddings"),
    "roberta": ("num_hidden_layers", "max_position_embeddings"),
    "bloom": ("n_layer", None), "mpt": ("n_layers", None),
    "distilbert": ("n_layers", "max_position_embeddings"), "t5": ("num_layers", None),
}
# ---------------------------------------------------------------- where the model is


def hub_cache() -> Path:
    """The hub's cache folder, read from the environment now, in the hub's documented order."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(os.path.expandvars(env[name])).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def _cached_snapshot(cache: Path, repo_id: str) -> Path | None:
    """snapshots/<refs/main> of one cached model repo, as the hub lays it out, if complete."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if not ref.is_file():
        return None
    snapshot = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
    return snapshot if (snapshot / "config.json").is_file() else None


def locate(source: str) -> Path:
    """A model directory: source itself, or its snapshot in the local Hugging Face cache."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise HfError(f"--hf {source} is a file; give a model directory (with config.json) "
                      f"or a model name from the Hugging Face cache, e.g. gpt2")
    cache = hub_cache()
    if _REPO_ID.match(source):
        found = _cached_snapshot(cache, source)
        if found is None and "/" not in source and cache.is_dir():
            # `gpt2` is cached as openai-community/gpt2 when fetched under its current name.
            owners = sorted(cache.glob(f"models--*--{source}"))
            snapshots = [s for s in (_cached_snapshot(cache, o.name[len("models--"):].replace("--", "/"))
                                     for o in owners) if s is not None]
            found = snapshots[0] if len(snapshots) == 1 else None
        if found is not None:
            return found
    fetch = source if _REPO_ID.match(source) else "ORG/NAME"
    raise HfError(f"--hf {source}: no such directory and not in the Hugging Face cache at {cache}; "
                  f"mha-tui never downloads: fetch it once with `hf download {fetch}` "
                  f"(or pass a directory made by save_pretrained)")


def checked_directory(source: str) -> Path:
    """The model's directory, refused when a file the loader needs is not there."""
    path = locate(source)
    if not (path / "config.json").is_file():
        raise HfError(f"--hf {source}: {path} has no config.json; give a directory made by "
                      f"save_pretrained (or `hf download`)")
    if not any(next(path.glob(pattern), None) for pattern in TOKENIZER_FILES):
        raise HfError(f"--hf {source}: {path} has no tokenizer (tokenizer.json, or vocab.json and "
                      f"merges.txt); save it beside the model with tokenizer.save_pretrained")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise HfError(f"--hf {source}: {path} has no weights (model.safetensors or "
                      f"pytorch_model.bin)")
    return path


# ---------------------------------------------------------------- refusals from the files


def refuse_early(source: str, sentence: str, layer: int) -> int | None:
    """Every refusal `--hf` would make before the model's forward that the files decide,
    in the order `load.hf.load`, `check_layer` and `tokenize` make them, with their words.
    Returns when the files do not refuse (or do not decide): the full path follows. What it
    returns is the sentence's token count, or a bound above it, when the files say one
    (for the memory estimate); None when they do not."""
    if not _transformers_5():
        return None  # not installed, or another version: load.hf says so, or decides itself
    path = checked_directory(source)
    config = read_json(path / "config.json")
    fields = _LAYERS_AND_POSITIONS.get(str(config.get("model_type"))) if config else None
    if config is None or fields is None:
        return None
    layers_key, positions_key = fields
    limit = config.get(positions_key) if positions_key else None
    if positions_key is not None and not isinstance(limit, int):
        return None  # the field is missing: transformers' default applies
    # A sentence that surely fits is not tokenized here (reading the vocabulary costs more
    # than the rest of this check): only its token count's upper bound is.
    bound = token_bound(path, config, sentence)
    if bound is not None and (limit is None or bound <= limit):
        n: int | None = bound if bound == 0 else None  # a bound of 0 is the count
    else:
        n = token_count(path, config, sentence)
        if n is None:
            return None
    if limit is not None and n is not None and n > limit:
        raise HfError(f"the sentence has {n} tokens but {source} reads at most {limit}")
    n_layers = config.get(layers_key)
    if not isinstance(n_layers, int) or n_layers <= 0:
        return n if n is not None else bound
    if not 0 <= layer < n_layers:
        raise HfError(f"--layer {layer} is out of range: {source} has {n_layers} layers, "
                      f"0 to {n_layers - 1}")
    if n == 0:  # (a sentence that gives no tokens yet has a bound above 0: transformers says it)
        raise HfError("the sentence gives no tokens; give at least one word, e.g. \"The cat sat\"")
    return n if n is not None else bound


def _transformers_5() -> bool:
    """transformers is installed and its major version is 5 (read from its dist-info folder,
    without importing it or importlib.metadata)."""
    try:
        spec = find_spec("transformers")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None:
        return False
    site = Path(spec.origin).parent.parent
    versions = [d.name[len("transformers-"):-len(".dist-info")]
                for d in site.glob("transformers-*.dist-info")]
    return len(versions) == 1 and versions[0].startswith("5.")


# ---------------------------------------------------------------- the checkpoint's sizes

# Bytes per element of safetensors' dtypes (its header names each tensor's).
_ELEMENT_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2,
                  "F16": 2, "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1,
                  "BOOL": 1}
_BLOCK = re.compile(r"^(.*?)\.(\d+)\.")
_CONFIG_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


@dataclass(frozen=True)
class CheckpointSizes:
    """What the weights take, read from the files' headers (no tensor is read).

    Bytes as stored; `elements` per group, so that an estimate can count them in the dtype
    the model runs in. Blocks are the largest group of `<path>.<i>.` names with as many
    indices as the config's layers.
    """

    stored: int  # bytes of every weight file
    elements: int  # every tensor's elements
    block_elements: tuple[int, ...]  # each block's
    head_elements: int  # an output head stored apart (lm_head.weight ...), never run streamed
    element_bytes: int  # as stored (the largest float tensor's)
    safetensors: bool  # tensor by tensor readable (streamable)
    # Lookup tables outside the blocks (the token and position embeddings: a 2-D tensor with
    # one row per vocabulary entry or position), each one's elements: a forward reads only
    # the rows of its tokens.
    tables: tuple[int, ...] = ()
    largest_elements: int = 0  # the largest tensor but the output head (a conversion's copy)


def _safetensors_header(file: Path) -> dict[str, object] | None:
    try:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100 * 2**20:
                return None
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error):
        return None
    return header if isinstance(header, dict) else None


def checkpoint_sizes(path: Path, n_layers: int | None,
                     table_rows: tuple[int, ...] = ()) -> CheckpointSizes | None:
    """The checkpoint's sizes from its safetensors headers, or from a .bin's file size and
    config.json's dtype; None when neither says. table_rows: the vocabulary size and the
    positions config.json states (a 2-D tensor outside the blocks with that many rows is a
    lookup table)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        bins = sorted(path.glob("pytorch_model*.bin"))
        if not bins:
            return None
        stored = sum(file.stat().st_size for file in bins)
        config = read_json(path / "config.json") or {}
        size = _CONFIG_DTYPE_BYTES.get(str(config.get("dtype") or config.get("torch_dtype")), 4)
        return CheckpointSizes(stored, stored // size, (), 0, size, False, (), stored // size)
    groups: dict[str, dict[int, int]] = {}
    elements = head = largest = 0
    widths: dict[int, int] = {}
    outside: dict[str, tuple[int, list[int]]] = {}  # name -> (elements, shape), not in a block
    stored = 0
    for file in files:
        header = _safetensors_header(file)
        if header is None:
            return None
        stored += file.stat().st_size
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            shape = [int(extent) for extent in entry.get("shape", [])]
            count = 1
            for extent in shape:
                count *= extent
            elements += count
            width = _ELEMENT_BYTES.get(str(entry.get("dtype")), 4)
            widths[width] = widths.get(width, 0) + count
            if name.rsplit(".", 2)[-2:-1] == ["lm_head"] or name == "lm_head.weight":
                head += count
                continue
            largest = max(largest, count)
            found = _BLOCK.match(name)
            if found:
                blocks = groups.setdefault(found.group(1), {})
                index = int(found.group(2))
                blocks[index] = blocks.get(index, 0) + count
            else:
                outside[name] = (count, shape)
    fitting = [g for g in groups.values() if n_layers is None or len(g) == n_layers]
    chosen = max(fitting, key=lambda g: sum(g.values()), default={})
    block_elements = tuple(chosen[i] for i in sorted(chosen))
    width = max(widths, key=lambda w: widths[w]) if widths else 4
    tables = tuple(count for count, shape in outside.values()
                   if len(shape) == 2 and shape[0] in table_rows and shape[0] > shape[1])
    return CheckpointSizes(stored, elements, block_elements, head, width, True, tables, largest)


def layer_count(path: Path) -> int | None:
    """config.json's number of layers, for the families whose field is known here."""
    config = read_json(path / "config.json")
    fields = _LAYERS_AND_POSITIONS.get(str(config.get("model_type"))) if config else None
    n = config.get(fields[0] if fields else "num_hidden_layers") if config else None
    return n if isinstance(n, int) and n > 0 else None


def _first_int(config: dict[str, object], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def run_shape(source: str, tokens: int | None, sentence: str,
              element_bytes: int | None = 4) -> HfShape | None:
    """An `--hf` run's sizes for the memory and disk estimates (budget), from config.json and
    the weight files' headers; None when they do not say enough.

    tokens: the count (or a bound) refuse_early found; None: a bound from the sentence's
    UTF-8 bytes (a byte-level tokenizer's worst case) and a few special tokens.
    element_bytes: what one weight takes in the dtype the model runs in (None: as stored).
    """
    path = locate(source)
    config = read_json(path / "config.json")
    if config is None:
        return None
    C = _first_int(config, "hidden_size", "n_embd", "d_model", "dim")
    h = _first_int(config, "num_attention_heads", "n_head", "num_heads", "n_heads",
                   "decoder_attention_heads")  # (BART's and Marian's)
    if C is None or h is None:
        return None
    rows = tuple(n for n in (_first_int(config, "vocab_size", "n_vocab"), _first_int(
        config, "max_position_embeddings", "n_positions")) if n is not None)
    sizes = checkpoint_sizes(path, layer_count(path) or _first_int(
        config, "num_hidden_layers", "n_layer", "num_layers", "n_layers"), rows)
    if sizes is None:
        return None
    mlp = _first_int(config, "intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim",
                     "ffn_hidden_size", "decoder_ffn_dim") or 4 * C
    T = tokens if tokens is not None else len(sentence.encode("utf-8")) + 4
    # One layer's attention weights: W_Q and W_O (C x h d_h), W_K and W_V (C x h_kv d_h).
    d_h = _first_int(config, "head_dim", "d_kv") or C // h
    h_kv = _first_int(config, "num_key_value_heads", "num_kv_heads") or h
    attention = 2 * C * h * d_h + 2 * C * h_kv * d_h
    return HfShape(tokens=T, embed_dim=C, num_heads=h, mlp_width=mlp, elements=sizes.elements,
                   block_elements=sizes.block_elements, head_elements=sizes.head_elements,
                   element_bytes=element_bytes or sizes.element_bytes, stored=sizes.stored,
                   safetensors=sizes.safetensors, stored_element_bytes=sizes.element_bytes,
                   tables=sizes.tables, largest_elements=sizes.largest_elements,
                   attention_elements=attention)


def exact_tokens(source: str, sentence: str) -> int | None:
    """The sentence's token count from tokenizer.json when the files decide it (refuse_early
    may have given only a bound, which is cheaper to read); None when they do not."""
    path = locate(source)
    config = read_json(path / "config.json")
    return token_count(path, config, sentence) if config is not None else None
