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

import os
import re
from importlib.util import find_spec
from pathlib import Path

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


def refuse_early(source: str, sentence: str, layer: int) -> None:
    """Every refusal `--hf` would make before the model's forward that the files decide,
    in the order `load.hf.load`, `check_layer` and `tokenize` make them, with their words.
    Returns when the files do not refuse (or do not decide): the full path follows."""
    if not _transformers_5():
        return  # not installed, or another version: load.hf says so, or decides itself
    path = checked_directory(source)
    config = read_json(path / "config.json")
    fields = _LAYERS_AND_POSITIONS.get(str(config.get("model_type"))) if config else None
    if config is None or fields is None:
        return
    layers_key, positions_key = fields
    limit = config.get(positions_key) if positions_key else None
    if positions_key is not None and not isinstance(limit, int):
        return  # the field is missing: transformers' default applies
    # A sentence that surely fits is not tokenized here (reading the vocabulary costs more
    # than the rest of this check): only its token count's upper bound is.
    bound = token_bound(path, config, sentence)
    if bound is not None and (limit is None or bound <= limit):
        n: int | None = bound if bound == 0 else None  # a bound of 0 is the count
    else:
        n = token_count(path, config, sentence)
        if n is None:
            return
    if limit is not None and n is not None and n > limit:
        raise HfError(f"the sentence has {n} tokens but {source} reads at most {limit}")
    n_layers = config.get(layers_key)
    if not isinstance(n_layers, int) or n_layers <= 0:
        return
    if not 0 <= layer < n_layers:
        raise HfError(f"--layer {layer} is out of range: {source} has {n_layers} layers, "
                      f"0 to {n_layers - 1}")
    if n == 0:  # (a sentence that gives no tokens yet has a bound above 0: transformers says it)
        raise HfError("the sentence gives no tokens; give at least one word, e.g. \"The cat sat\"")


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
