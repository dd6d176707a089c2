"""`--hf`'s token count from tokenizer.json, as the transformers tokenizer `--hf` runs with
would count it, with the `tokenizers` package alone (no torch, no transformers).

transformers 5's AutoTokenizer picks a class for the checkpoint (`tokenizer_class`: the
checkpoint's declared class, the one registered for its model type, and its own exceptions,
mirrored here for the model types of tests/hf_families.py and GPT-2). Some classes load
tokenizer.json as it is (TokenizersBackend); others rebuild its pipeline in their
`__init__` from its vocabulary (the GPT-2, GPT-NeoX, Qwen2, Llama, Gemma, T5, RoBERTa and
BERT tokenizers: their own normalizer, pre-tokenizer, model options and post-processor), and
`_rebuild` does the same here. Anything else (another class, remote code, a sentence
holding one of the tokenizer's added or special tokens, fix_mistral_regex) gives None: not
decided here. tests/test_hf_files.py proves the count, and the class,
equal to transformers' over every family and variants of their settings.

`token_bound` is an upper bound read without the vocabulary (most of the file), enough to
know that a sentence fits. Used by `hf_files` before torch or transformers are imported.
"""

from __future__ import annotations

import json
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

# The tokenizer class transformers 5 registers for the model types of tests/hf_families.py
# and GPT-2 (None: none),
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
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    # (and <extra_id_0> ... <extra_id_99>, added as special tokens: a sentence holding
    # "<extra_id_" is left to transformers)
    "T5Tokenizer": {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
                    "extra_ids": "<extra_id_"},
    "GemmaTokenizer": {"unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>",
                       "pad_token": "<pad>", "mask_token": "<mask>"},
    "Qwen2Tokenizer": {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                       "pad_token": "<|endoftext|>"},
    "GPTNeoXTokenizer": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
                         "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"},
    "BertTokenizer": {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                      "cls_token": "[CLS]", "mask_token": "[MASK]"},
}
_DEFAULT_SPECIALS["DistilBertTokenizer"] = _DEFAULT_SPECIALS["BertTokenizer"]
# CodeGen's tokenizer (Phi-1, Phi-2) builds GPT-2's pipeline; its own byte-level
# post-processor is replaced by tokenizer.json's, as GPT-2's is.
_DEFAULT_SPECIALS["CodeGenTokenizer"] = _DEFAULT_SPECIALS["GPT2Tokenizer"]
# tokenizer.json's top-level "model" (serialized last, after the normalizer, pre-tokenizer
# and post-processor, its "type" first), and a model of each type without a vocabulary, to
# read the rest of the pipeline without the vocabulary.
# Qwen2Tokenizer's pre-tokenizer split (transformers' PRETOKENIZE_REGEX for Qwen2).
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_MODEL_KEY = re.compile(r'(,)\s*"model"\s*:\s*\{\s*"type"\s*:\s*"(\w+)"')
_STUB_MODELS: dict[str, dict[str, Any]] = {
    "BPE": {"type": "BPE", "vocab": {}, "merges": []},
    "WordPiece": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0}},
    "Unigram": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]},
    "WordLevel": {"type": "WordLevel", "unk_token": "<unk>", "vocab": {"<unk>": 0}},
}


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file; None when it is missing, unreadable or not an object."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


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
    if prepared is None:
        return None
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
        if not _rebuild(tokenizer, kind, settings, stub=True):
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
    try:
        text = (path / "tokenizer.json").read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    kind = tokenizer_class(path, config, settings, text)
    if kind is None or settings.get("split_special_tokens") or settings.get("fix_mistral_regex"):
        return None  # (fix_mistral_regex: transformers replaces a large vocabulary's regex)
    # (add_bos_token and add_eos_token change nothing: transformers 5 drops them from the
    # settings when there is a tokenizer.json.)
    if find_spec("tokenizers") is None:
        return None
    return kind, settings, text


def _settings(path: Path) -> dict[str, Any] | None:
    """The tokenizer's init arguments as transformers 5 gathers them: tokenizer_config.json
    (none: {}), and where it has no added_tokens_decoder, the legacy special_tokens_map.json
    over it and added_tokens.json's tokens (under the key `_added_tokens`, only to be named);
    None when a file is there but unreadable."""
    settings: dict[str, Any] | None = {}
    if (path / "tokenizer_config.json").exists():
        settings = read_json(path / "tokenizer_config.json")
    if settings is None or "added_tokens_decoder" in settings:
        return settings
    if (path / "special_tokens_map.json").exists():
        special = read_json(path / "special_tokens_map.json")
        if special is None:
            return None
        named = settings.get("extra_special_tokens")
        settings.update(special)
        if named is not None:
            settings["_extra_special_tokens"] = named  # merged by transformers: still named
    if (path / "added_tokens.json").exists():
        added = read_json(path / "added_tokens.json")
        if added is None:
            return None
        settings["_added_tokens"] = list(added)
    return settings


def tokenizer_class(path: Path, config: dict[str, Any], settings: dict[str, Any],
                    text: str) -> str | None:
    """The class transformers 5's AutoTokenizer loads the tokenizer with, where it is one whose
    pipeline `_rebuild` knows (None otherwise): the checkpoint's declared class, or the one
    registered for its model type when it declares none or where transformers overrides it
    (text: tokenizer.json's)."""
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
    if (declared is not None and declared.removesuffix("Fast") == "LlamaTokenizer"
            and model_type not in _REGISTERED_OVERRIDES and registered != "MistralCommonBackend"
            and '"ByteLevel"' in text):
        return "TokenizersBackend"  # AutoTokenizer's own test: a byte-level tokenizer.json
    if declared and registered and registered != declared.removesuffix("Fast"):
        if registered in _BACKENDS:
            chosen = None if registered == "MistralCommonBackend" else "TokenizersBackend"
        else:
            chosen = registered if model_type in _REGISTERED_OVERRIDES else declared
    else:
        chosen = declared or registered
    if chosen in ("PreTrainedTokenizerFast", "PreTrainedTokenizer", "PythonBackend",
                  "BloomTokenizer", "BloomTokenizerFast"):  # (BLOOM's classes are gone in 5)
        chosen = "TokenizersBackend"
    chosen = chosen.removesuffix("Fast") if chosen else None
    return chosen if chosen in _DEFAULT_SPECIALS else None


def _rebuild(tokenizer: Any, kind: str, settings: dict[str, Any], *, stub: bool = False) -> bool:
    """Make tokenizer.json's pipeline the one kind's `__init__` builds from it (its own
    normalizer, pre-tokenizer, model options and post-processor); False where unsure.
    stub: the model is a stand-in without the vocabulary (its options do not matter)."""
    from tokenizers import Regex, normalizers, pre_tokenizers, processors

    model = tokenizer.model
    model_kind = type(model).__name__
    specials = {**_DEFAULT_SPECIALS[kind], **{key: _content(value) for key, value in settings.items()
                                             if key.endswith("_token")}}
    if kind in ("GPT2Tokenizer", "CodeGenTokenizer", "RobertaTokenizer", "GPTNeoXTokenizer",
                "Qwen2Tokenizer"):
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
        tokenizer.normalizer = normalizers.NFC() if kind in ("GPTNeoXTokenizer",
                                                             "Qwen2Tokenizer") else None
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        if kind == "Qwen2Tokenizer":
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)])
    elif kind == "LlamaTokenizer":
        if model_kind != "BPE":
            return False
        add_prefix_space = settings.get("add_prefix_space")
        model.dropout = None
        model.unk_token = None
        model.continuing_subword_prefix = None
        model.end_of_word_suffix = None
        model.fuse_unk = True
        model.byte_fallback = True
        model.ignore_merges = False
        tokenizer.normalizer = None
        scheme = ("never" if add_prefix_space is not None and not add_prefix_space
                  else "always" if settings.get("legacy", False) else "first")
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                           prepend_scheme=scheme, split=False)
    elif kind == "GemmaTokenizer":
        if model_kind != "BPE" or specials.get("unk_token") is None:
            return False
        model.dropout = None
        model.unk_token = specials["unk_token"]
        model.continuing_subword_prefix = None
        model.end_of_word_suffix = None
        model.fuse_unk = True
        model.byte_fallback = True
        model.ignore_merges = False
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                                       invert=False)
    elif kind == "T5Tokenizer":
        # A Unigram model with <unk> at id 2 and no byte fallback, the file's SentencePiece
        # character map as the only normalizer (transformers keeps the first Precompiled one),
        # words split on whitespace, then ▁ before each.
        if model_kind != "Unigram" or not (
                tokenizer.normalizer is None
                or isinstance(tokenizer.normalizer, normalizers.Precompiled)):
            return False
        if not stub:
            state = json.loads(model.__getstate__())
            if state.get("unk_id") != 2 or state.get("byte_fallback"):
                return False
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
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
    elif kind == "T5Tokenizer":
        tokenizer.post_processor = _template(tokenizer, [], ["</s>"])
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
