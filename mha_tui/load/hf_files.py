"""`--hf` from the checkpoint's own files: where it is, and what refuses it before any weight.

Everything here is read from files, without torch or transformers (a `--hf` refusal that
the files decide costs a fraction of the torch import): the model directory (a path, or its
snapshot in the local Hugging Face cache, found the way the hub lays the cache out),
config.json (json), and the sentence's token count from tokenizer.json with the `tokenizers`
package, counted as the transformers tokenizer `--hf` runs with counts it (or, for a sentence
that surely fits, only an upper bound read without the vocabulary).

That count is given only where the files decide it: the tokenizer class transformers 5's
AutoTokenizer picks for the checkpoint is one of the few whose pipeline is rebuilt here from
tokenizer.json the way its `__init__` builds it (the GPT-2, GPT-NeoX, RoBERTa and BERT
tokenizers, and TokenizersBackend, which loads tokenizer.json as it is), and the sentence holds none of the
tokenizer's added or special tokens. Anything else (no tokenizer.json, a slow-only
tokenizer, another class, remote code, a config field missing, another transformers major
version) returns None, and `load.hf.load` decides with transformers itself, as before:
a refusal here is never one transformers would not make, and one it would make is never
missed (the full path checks again). tests/test_hf_files.py proves the count equal to
transformers' over every family of tests/hf_families.py.

Imported by the CLI before `load.hf`; never imports torch, transformers or huggingface_hub
(an import-linter contract, and a subprocess test that the refusal loads neither).
"""

from __future__ import annotations

import json
import os
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from .hf_error import HfError

WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model", "vocab.txt")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

# What transformers 5 reads from each family's config.json (the model types of
# tests/hf_families.py and GPT-2): its number of layers (`num_hidden_layers`) and the
# positions it reads (`max_position_embeddings`; None: the config has no such attribute, as
# BLOOM's, MPT's and T5's do not, and no sentence is refused for length). A type not listed here is
# decided by transformers. tests/test_hf_files.py checks every entry against AutoConfig.
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
# The tokenizer class transformers 5 registers for each of those model types (None: none),
# and the types whose registered class overrides the one a checkpoint declares
# (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS). Mistral's is MistralCommonBackend when
# mistral-common is installed (then undecided here).
_REGISTERED_TOKENIZER = {
    "gpt2": "GPT2Tokenizer", "gptj": "GPT2Tokenizer", "gpt_neo": "GPT2Tokenizer",
    "phi": "GPT2Tokenizer", "opt": "GPT2Tokenizer", "gpt_neox": "GPTNeoXTokenizer",
    "mpt": "GPTNeoXTokenizer", "qwen2": "Qwen2Tokenizer", "gemma": "GemmaTokenizer",
    "mistral": "TokenizersBackend", "bert": "BertTokenizer", "distilbert": "BertTokenizer",
    "roberta": "RobertaTokenizer", "t5": "T5Tokenizer", "llama": None, "bloom": None,
    "falcon": None,
}
_REGISTERED_OVERRIDES = {"qwen2"}
_BACKENDS = ("TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast", "MistralCommonBackend")
# Hub names AutoTokenizer always loads with TokenizersBackend (MODEL_IDS_TO_TOKENIZERS_BACKEND):
# a path of that shape is left to transformers.
_BACKEND_NAMES = ("deepseek", "dolma2", "umt5", "donut", "blip2", "instructblip", "step-3")
# The tokenizer classes whose pipeline is rebuilt here, and their special tokens by default.
_DEFAULT_SPECIALS = {
    "TokenizersBackend": {},
    "GPT2Tokenizer": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
                      "eos_token": "<|endoftext|>"},
    "RobertaTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
                         "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>",
                         "mask_token": "<mask>"},
    "GPTNeoXTokenizer": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
                         "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"},
    "BertTokenizer": {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                      "cls_token": "[CLS]", "mask_token": "[MASK]"},
}
_DEFAULT_SPECIALS["DistilBertTokenizer"] = _DEFAULT_SPECIALS["BertTokenizer"]
# transformers patches the pre-tokenizer of tokenizers this large (Mistral's regex).
_PATCHED_VOCAB = 100_000
# tokenizer.json's top-level "model" (serialized last, after the normalizer, pre-tokenizer
# and post-processor, its "type" first), and a model of each type without a vocabulary, to
# read the rest of the pipeline without the vocabulary.
_MODEL_KEY = re.compile(r'(,)\s*"model"\s*:\s*\{\s*"type"\s*:\s*"(\w+)"')
_STUB_MODELS: dict[str, dict[str, Any]] = {
    "BPE": {"type": "BPE", "vocab": {}, "merges": []},
    "WordPiece": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0}},
    "Unigram": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]},
    "WordLevel": {"type": "WordLevel", "unk_token": "<unk>", "vocab": {"<unk>": 0}},
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
    config = _json(path / "config.json")
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


def _json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


# ---------------------------------------------------------------- the token count


def token_count(path: Path, config: dict[str, Any], sentence: str) -> int | None:
    """len(tokenizer(sentence, add_special_tokens=True)["input_ids"]) of the tokenizer
    transformers loads from path, computed from tokenizer.json; None where the files do
    not decide it."""
    prepared = _prepared(path, config)
    if prepared is None:
        return None
    kind, settings, text = prepared
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(text)
        if tokenizer.get_vocab_size(with_added_tokens=True) > _PATCHED_VOCAB:
            return None
        if not _rebuild(tokenizer, kind, settings):
            return None
        if _holds_a_special_token(tokenizer, kind, settings, sentence):
            return None
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return len(tokenizer.encode(sentence, add_special_tokens=True).ids)
    except Exception:  # a pipeline tokenizers cannot build, rebuild or run: transformers decides
        return None


def token_bound(path: Path, config: dict[str, Any], sentence: str) -> int | None:
    """At least token_count (and 0 only where it is 0), from tokenizer.json without its
    vocabulary (most of the file, and most of the time to read it): the special tokens the
    pipeline adds, and for every piece the normalizer and pre-tokenizer cut the sentence
    into, its UTF-8 bytes (a model gives at most a token per byte of a piece, its byte
    fallback included; one for an empty piece). None where not known."""
    prepared = _prepared(path, config)
    if prepared is None or config.get("model_type") == "mistral":
        return None  # (transformers may patch a large Mistral vocabulary's pre-tokenizer)
    kind, settings, text = prepared
    match = _MODEL_KEY.search(text)
    if match is None or match.group(2) not in _STUB_MODELS:
        return None
    from tokenizers import Tokenizer

    try:
        head = json.loads(text[:match.start(1)] + "}")
        if not {"normalizer", "pre_tokenizer", "post_processor"} <= set(head):
            return None
        tokenizer = Tokenizer.from_str(json.dumps({**head, "model": _STUB_MODELS[match.group(2)]}))
        if not _rebuild(tokenizer, kind, settings):
            return None
        if _holds_a_special_token(tokenizer, kind, settings, sentence):
            return None
        text = sentence
        if tokenizer.normalizer is not None:
            text = tokenizer.normalizer.normalize_str(text)
        pieces = [] if not text else [text] if tokenizer.pre_tokenizer is None else \
            [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
        specials = (tokenizer.post_processor.num_special_tokens_to_add(False)
                    if tokenizer.post_processor is not None else 0)
        return specials + sum(max(1, len(piece.encode("utf-8"))) for piece in pieces if piece) \
            + sum(1 for piece in pieces if not piece)
    except Exception:
        return None


def _prepared(path: Path, config: dict[str, Any]) -> tuple[str, dict[str, Any], str] | None:
    """The tokenizer class, its init arguments and tokenizer.json's text, where the count can
    be decided from them (a class rebuilt here, nothing that makes transformers choose
    otherwise, tokenizers installed); None otherwise."""
    settings = _settings(path)
    if settings is None or not (path / "tokenizer.json").is_file():
        return None
    kind = tokenizer_class(path, config, settings)
    if kind is None or settings.get("split_special_tokens"):
        return None
    # (add_bos_token and add_eos_token change nothing: transformers 5 drops them from the
    # settings when there is a tokenizer.json.)
    if find_spec("tokenizers") is None:
        return None
    try:
        return kind, settings, (path / "tokenizer.json").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def _settings(path: Path) -> dict[str, Any] | None:
    """The tokenizer's init arguments as transformers 5 gathers them: tokenizer_config.json
    (none: {}), and where it has no added_tokens_decoder, the legacy special_tokens_map.json
    over it and added_tokens.json's tokens (under the key `_added_tokens`, only to be named);
    None when a file is there but unreadable."""
    settings: dict[str, Any] | None = {}
    if (path / "tokenizer_config.json").exists():
        settings = _json(path / "tokenizer_config.json")
    if settings is None or "added_tokens_decoder" in settings:
        return settings
    if (path / "special_tokens_map.json").exists():
        special = _json(path / "special_tokens_map.json")
        if special is None:
            return None
        named = settings.get("extra_special_tokens")
        settings.update(special)
        if named is not None:
            settings["_extra_special_tokens"] = named  # merged by transformers: still named
    if (path / "added_tokens.json").exists():
        added = _json(path / "added_tokens.json")
        if added is None:
            return None
        settings["_added_tokens"] = list(added)
    return settings


def tokenizer_class(path: Path, config: dict[str, Any], settings: dict[str, Any]) -> str | None:
    """The class transformers 5's AutoTokenizer loads the tokenizer with, where it is one whose
    pipeline `_rebuild` knows (None otherwise): the checkpoint's declared class, or the one
    registered for its model type when it declares none or where transformers overrides it."""
    model_type = str(config.get("model_type"))
    if model_type not in _REGISTERED_TOKENIZER or "auto_map" in settings or "auto_map" in config:
        return None
    if any(name in str(path).lower() for name in _BACKEND_NAMES):
        return None
    registered = _REGISTERED_TOKENIZER[model_type]
    if model_type == "mistral" and find_spec("mistral_common") is not None:
        registered = "MistralCommonBackend"
    declared = settings.get("tokenizer_class") or config.get("tokenizer_class")
    if declared is not None and not isinstance(declared, str):
        return None
    if declared is not None and declared.removesuffix("Fast") == "LlamaTokenizer":
        return None  # AutoTokenizer looks inside tokenizer.json to choose
    if declared and registered and registered != declared.removesuffix("Fast"):
        if registered in _BACKENDS:
            chosen = None if registered == "MistralCommonBackend" else "TokenizersBackend"
        else:
            chosen = registered if model_type in _REGISTERED_OVERRIDES else declared
    else:
        chosen = declared or registered
    if chosen in ("PreTrainedTokenizerFast", "PreTrainedTokenizer", "PythonBackend"):
        chosen = "TokenizersBackend"
    chosen = chosen.removesuffix("Fast") if chosen else None
    return chosen if chosen in _DEFAULT_SPECIALS else None


def _rebuild(tokenizer: Any, kind: str, settings: dict[str, Any]) -> bool:
    """Make tokenizer.json's pipeline the one kind's `__init__` builds from it (its own
    normalizer, pre-tokenizer, model options and post-processor); False where unsure."""
    from tokenizers import normalizers, pre_tokenizers, processors

    model = tokenizer.model
    model_kind = type(model).__name__
    specials = {**_DEFAULT_SPECIALS[kind], **{key: _content(value) for key, value in settings.items()
                                             if key.endswith("_token")}}
    if kind in ("GPT2Tokenizer", "RobertaTokenizer", "GPTNeoXTokenizer"):
        if model_kind != "BPE":
            return False
        add_prefix_space = bool(settings.get("add_prefix_space", False))
        model.dropout = None
        model.unk_token = None
        model.continuing_subword_prefix = ""
        model.end_of_word_suffix = ""
        model.fuse_unk = False
        model.byte_fallback = False
        model.ignore_merges = False
        tokenizer.normalizer = normalizers.NFC() if kind == "GPTNeoXTokenizer" else None
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    elif kind in ("BertTokenizer", "DistilBertTokenizer"):
        if model_kind != "WordPiece" or specials.get("unk_token") is None:
            return False
        model.unk_token = specials["unk_token"]
        model.continuing_subword_prefix = "##"
        model.max_input_chars_per_word = 100
        strip_accents = settings.get("strip_accents")
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=bool(settings.get("tokenize_chinese_chars", True)),
            strip_accents=None if strip_accents is None else bool(strip_accents),
            lowercase=bool(settings.get("do_lower_case", True)))
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The post-processor: BERT's and RoBERTa's __init__ set their own, GPT-NeoX's the template
    # of add_bos_token and add_eos_token (False: transformers drops both settings when there
    # is a tokenizer.json); the others keep tokenizer.json's (or none: then transformers'
    # template adds nothing either).
    if kind == "GPTNeoXTokenizer":
        tokenizer.post_processor = _template(tokenizer, [], [])
    elif kind in ("BertTokenizer", "DistilBertTokenizer"):
        tokenizer.post_processor = _template(tokenizer, [specials.get("cls_token")],
                                             [specials.get("sep_token")])
    elif kind == "RobertaTokenizer":
        tokenizer.post_processor = processors.RobertaProcessing(
            (str(specials.get("sep_token")), 0), (str(specials.get("cls_token")), 0))
    return True


def _template(tokenizer: Any, before: list[str | None], after: list[str | None]) -> Any:
    """A TemplateProcessing putting `before` and `after` around one sequence (the ids do not
    change the count; a token the vocabulary lacks gets id 0)."""
    from tokenizers import processors

    pieces = [str(token) for token in before] + ["$A"] + [str(token) for token in after]
    named = {str(token) for token in (*before, *after)}
    return processors.TemplateProcessing(
        single=" ".join(pieces), pair=" ".join([*pieces, "$B"]),
        special_tokens=[(token, tokenizer.token_to_id(token) or 0) for token in sorted(named)])


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _named_tokens(settings: dict[str, Any]) -> set[str]:
    """Every token tokenizer_config.json names: its special tokens, their lists and its
    added_tokens_decoder."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        text = _content(value)
        if text:
            found.add(text)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for key, value in settings.items():
        if key.endswith(("_token", "_tokens")) or key == "added_tokens_decoder":
            walk(value)
    return found


def _holds_a_special_token(tokenizer: Any, kind: str, settings: dict[str, Any],
                           sentence: str) -> bool:
    """Whether the sentence (as written or normalized, in any case) contains a token that is,
    or may be, an added token: transformers' set of added tokens is not rebuilt here, so a
    sentence holding one is left to it."""
    contents = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    contents |= {value for value in _DEFAULT_SPECIALS[kind].values() if value}
    contents |= _named_tokens(settings)
    texts = [sentence.casefold()]
    if tokenizer.normalizer is not None:
        texts.append(tokenizer.normalizer.normalize_str(sentence).casefold())
    return any(content.casefold() in text for content in contents if content for text in texts)
