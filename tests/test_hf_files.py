"""`--hf` refusals from the checkpoint's files (load/hf_files.py, load/hf_tokens.py): the
token count equals the transformers tokenizer's for every family and kind of sentence, or is
left undecided; the refusals they make are word for word the full path's, and they import
neither torch nor transformers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoTokenizer

from mha_tui.load import hf, hf_files, hf_tokens
from mha_tui.pipeline.hf import Session

from .conftest import ROOT
from .hf_families import FAMILIES, tokenizer_for
from .hf_models import EOS, hub_cache_layout, save_tiny_gpt2

SENTENCES = [
    "", " ", "\t\n",  # nothing to read, or only spaces
    "The cat sat on the mat.",
    "THE Cat sAt",
    "It's 2024: we'LL see 12345 cats!!\r\n\r\n  ok...",  # contractions, digits, CR LF
    "Café, naïve, 😀, ß, ﬁ, Ångström, 中文字, عربى, ÅÅ\u0301",  # accents, ligature, CJK, RTL
    "  leading and trailing spaces\tand a tab\n",
    "a control \x1b[31m byte and a NUL \x00",
    " ".join(["the cat sat on the log"] * 40),  # 240 words: more than the families' 64 positions
    "x" * 300,  # one word longer than WordPiece's 100 characters
]
# Families whose tokenizer class is not rebuilt here: transformers decides (none now).
UNDECIDED: set[str] = set()


@pytest.fixture(scope="module")
def tokenizers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each family's config.json and tokenizer, as save_pretrained writes them (no weights)."""
    root = tmp_path_factory.mktemp("hf-files")
    for name, family in FAMILIES.items():
        tokenizer = tokenizer_for(family)
        tokenizer.save_pretrained(root / name)
        family.config(len(tokenizer)).save_pretrained(root / name)
    return root


def _theirs(directory: Path, sentence: str) -> int:
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return len(tokenizer(sentence, add_special_tokens=True)["input_ids"])


def _ours(directory: Path, sentence: str) -> int | None:
    """The count from the files, checked against its bound read without the vocabulary."""
    config = json.loads((directory / "config.json").read_text())
    count = hf_tokens.token_count(directory, config, sentence)
    bound = hf_tokens.token_bound(directory, config, sentence)
    if count is None:
        assert bound is None
    elif bound is not None:
        assert bound >= count and (bound == 0) == (count == 0), (sentence, bound, count)
    return count


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_count_is_the_transformers_tokenizers(tokenizers_dir: Path, name: str) -> None:
    directory = tokenizers_dir / name
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    config = json.loads((directory / "config.json").read_text())
    settings = json.loads((directory / "tokenizer_config.json").read_text())
    kind = hf_tokens.tokenizer_class(directory, config, settings,
                                    (directory / "tokenizer.json").read_text())
    if name in UNDECIDED:
        assert kind is None
        assert all(_ours(directory, sentence) is None for sentence in SENTENCES)
        return
    assert kind == type(tokenizer).__name__  # the class AutoTokenizer picked
    counts = []
    for sentence in SENTENCES:
        theirs = len(tokenizer(sentence, add_special_tokens=True)["input_ids"])
        assert _ours(directory, sentence) == theirs, (name, sentence)
        counts.append(theirs)
        # The bound read without the vocabulary: never below the count, 0 only where it is 0.
        bound = hf_tokens.token_bound(directory, config, sentence)
        assert bound is not None
        assert bound is None or (bound >= theirs and (bound == 0) == (theirs == 0)), (
            name, sentence, bound, theirs)
    assert counts[SENTENCES.index(" ".join(["the cat sat on the log"] * 40))] > 64
    # The family's own special tokens are counted: BERT's [CLS] and [SEP], RoBERTa's <s> and
    # </s>, Llama's <s>, T5's </s>, none for GPT-2's kind.
    added = counts[3] - len(tokenizer("The cat sat on the mat.", add_special_tokens=False)["input_ids"])
    assert added == {"bert": 2, "distilbert": 2, "roberta": 2, "llama": 1, "mistral": 1,
                     "gemma": 1, "t5": 1}.get(name, 0)


@pytest.mark.parametrize("name", ["gpt-neo", "bert", "llama", "roberta", "t5"])
def test_a_sentence_holding_a_special_token_is_left_to_transformers(tokenizers_dir: Path,
                                                                    name: str) -> None:
    directory = tokenizers_dir / name
    for sentence in (f"a {EOS} b", "[CLS] the [sep] cat", "<s> the </s> cat <unk>", "<pad>"):
        ours = _ours(directory, sentence)
        assert ours is None or ours == _theirs(directory, sentence)
    special = {"gpt-neo": EOS, "bert": "[SEP]", "llama": "</s>", "roberta": "<mask>", "t5": "</s>"}
    assert _ours(directory, f"the {special[name].lower()} cat") is None


def _variant(source: Path, target: Path, **changes: object) -> Path:
    """A copy of a checkpoint's files with tokenizer_config.json changed (None: key removed)."""
    shutil.copytree(source, target)
    settings = json.loads((target / "tokenizer_config.json").read_text())
    for key, value in changes.items():
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
    (target / "tokenizer_config.json").write_text(json.dumps(settings))
    return target


@pytest.mark.parametrize(("name", "changes"), [
    ("gpt-neo", {"tokenizer_class": None}),  # GPT-2 on the hub names no class: by model type
    ("gpt-neo", {"add_prefix_space": True}),
    ("llama", {"tokenizer_class": "PreTrainedTokenizerFast"}),  # Llama 3, BLOOM, Falcon
    ("llama", {"bos_token": None}),
    # transformers 5 drops add_bos_token and add_eos_token when there is a tokenizer.json
    ("gpt-neo", {"add_bos_token": True}),
    ("gpt-neo", {"add_bos_token": True, "add_eos_token": True, "bos_token": None}),
    ("llama", {"add_bos_token": False}),
    ("llama", {"add_eos_token": True}),
    # Pythia's and MPT's GPT-NeoX tokenizer: NFC, then byte-level
    ("gpt-neox", {"tokenizer_class": "GPTNeoXTokenizerFast", "add_bos_token": False,
                  "add_eos_token": False}),
    ("gpt-neox", {"tokenizer_class": "GPTNeoXTokenizer", "add_bos_token": True,
                  "add_prefix_space": True}),
    ("mpt", {"tokenizer_class": None}),
    ("bloom", {"tokenizer_class": "BloomTokenizerFast"}),  # bigscience/bloom-560m
    ("phi", {"tokenizer_class": "CodeGenTokenizer"}),  # microsoft/phi-2
    ("t5", {"tokenizer_class": None}),  # t5-small names none: T5Tokenizer by model type
    ("t5", {"tokenizer_class": "T5TokenizerFast", "extra_ids": 0}),
    # Llama 2, TinyLlama, Mistral 7B name LlamaTokenizer: its own Metaspace, no normalizer
    ("llama", {"tokenizer_class": "LlamaTokenizerFast"}),
    ("llama", {"tokenizer_class": "LlamaTokenizer", "legacy": True}),
    ("llama", {"tokenizer_class": "LlamaTokenizer", "legacy": False, "add_prefix_space": False}),
    ("mistral", {"tokenizer_class": "LlamaTokenizer"}),
    ("gemma", {"tokenizer_class": "LlamaTokenizerFast", "legacy": None}),
    ("gemma", {"tokenizer_class": "GemmaTokenizer"}),  # Gemma's own: spaces become ▁ first
    ("gemma", {"tokenizer_class": None}),
    ("gpt-neo", {"tokenizer_class": "LlamaTokenizer"}),  # byte-level: TokenizersBackend
    ("falcon", {"tokenizer_class": "LlamaTokenizerFast"}),  # byte-level: TokenizersBackend
    ("bert", {"do_lower_case": False}),
    ("bert", {"strip_accents": False, "tokenize_chinese_chars": False}),
    ("bert", {"tokenizer_class": None}),
    ("roberta", {"add_prefix_space": True}),
    ("opt", {"tokenizer_class": "GPT2TokenizerFast"}),
])
def test_what_tokenizer_config_says_is_counted(tokenizers_dir: Path, tmp_path: Path, name: str,
                                              changes: dict[str, object]) -> None:
    directory = _variant(tokenizers_dir / name, tmp_path / name, **changes)
    config = json.loads((directory / "config.json").read_text())
    settings = hf_tokens._settings(directory)
    assert settings is not None
    kind = hf_tokens.tokenizer_class(directory, config, settings,
                                    (directory / "tokenizer.json").read_text())
    assert kind == type(AutoTokenizer.from_pretrained(directory, local_files_only=True)).__name__
    for sentence in SENTENCES:
        assert _ours(directory, sentence) == _theirs(directory, sentence), (changes, sentence)


@pytest.mark.parametrize(("name", "legacy"), [
    ("roberta", "no tokenizer_config.json"),  # roberta-base on the hub: by model type
    ("bert", "no tokenizer_config.json"),
    ("bert", "special_tokens_map.json"),
    ("gpt-neo", "special_tokens_map.json"),
    ("llama", "added_tokens.json"),
])
def test_legacy_files_are_read_as_transformers_reads_them(tokenizers_dir: Path, tmp_path: Path,
                                                          name: str, legacy: str) -> None:
    directory = _variant(tokenizers_dir / name, tmp_path / name, added_tokens_decoder=None)
    if legacy == "no tokenizer_config.json":
        (directory / "tokenizer_config.json").unlink()
    elif legacy == "special_tokens_map.json":
        (directory / legacy).write_text(json.dumps(
            {"unk_token": {"content": "[UNK]" if name == "bert" else EOS, "lstrip": False,
                           "normalized": False, "rstrip": False, "single_word": False},
             "extra_special_tokens": ["<extra>"]}))
    else:
        (directory / legacy).write_text(json.dumps({"<extra>": 300}))
    for sentence in SENTENCES:
        assert _ours(directory, sentence) == _theirs(directory, sentence), sentence
    if legacy != "no tokenizer_config.json":
        assert _ours(directory, "an <EXTRA> token") is None


@pytest.mark.parametrize(("name", "change"), [
    ("gpt-neo", "no tokenizer.json"),  # a slow-only tokenizer: vocab.json and merges.txt
    ("gpt-neo", "broken tokenizer.json"),
    ("bert", "a model tokenizers does not know"),
    ("gpt-neo", "remote code"),
    ("gpt-neo", "another class"),
    ("bert", "unreadable special_tokens_map.json"),
    ("gpt-neo", "split special tokens"),
    ("mistral", "fix_mistral_regex"),
])
def test_files_that_do_not_decide_leave_it_to_transformers(tokenizers_dir: Path, tmp_path: Path,
                                                          name: str, change: str) -> None:
    directory = _variant(tokenizers_dir / name, tmp_path / name, **{
        "remote code": {"auto_map": {"AutoTokenizer": ["x.Tok", None]}},
        "another class": {"tokenizer_class": "XLNetTokenizer"},
        "split special tokens": {"split_special_tokens": True},
        "fix_mistral_regex": {"fix_mistral_regex": True},
    }.get(change, {}))
    if change == "no tokenizer.json":
        (directory / "tokenizer.json").unlink()
    if change == "broken tokenizer.json":
        (directory / "tokenizer.json").write_text("{")
    if change == "a model tokenizers does not know":
        document = json.loads((directory / "tokenizer.json").read_text())
        document["model"]["type"] = "Byte"
        (directory / "tokenizer.json").write_text(json.dumps(document))
    if change == "unreadable special_tokens_map.json":
        (directory / "special_tokens_map.json").write_text("{")
    assert _ours(directory, "The cat sat on the mat.") is None


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_layers_and_positions_are_what_autoconfig_reads(tokenizers_dir: Path, name: str) -> None:
    directory = tokenizers_dir / name
    document = json.loads((directory / "config.json").read_text())
    layers_key, positions_key = hf_files._LAYERS_AND_POSITIONS[document["model_type"]]
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    assert config.num_hidden_layers == document[layers_key]
    assert getattr(config, "max_position_embeddings", None) == (
        document[positions_key] if positions_key else None)


# ---------------------------------------------------------------- the refusals, before torch


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))  # 3 layers, 64 positions


def _full_path(source: str, sentence: str, layer: int) -> str:
    """The refusal the full path (transformers, the weights) makes."""
    with pytest.raises(hf.HfError) as caught:
        loaded = hf.load(source, sentence)
        hf.check_layer(loaded, layer)
        Session(loaded, sentence)
    return str(caught.value)


_PROBE = """
import atexit, sys
atexit.register(lambda: print(" ".join(m for m in ("torch", "transformers", "huggingface_hub")
                                        if m in sys.modules)))
sys.argv = ["mha-tui", "explain", *sys.argv[1:], "--dump", "-"]
from mha_tui.cli import main
main()
"""


def _refused_early(sentence: str, *args: str, env: dict[str, str] | None = None) -> str:
    """The real command in a process of its own: exit 2, one line, and neither torch nor
    transformers (nor the hub's library) imported by the time it exits."""
    result = subprocess.run([sys.executable, "-c", _PROBE, sentence, *args], capture_output=True,
                            text=True, cwd=ROOT, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "\n", f"imported: {result.stdout}"
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("mha-tui: error: ")
    return result.stderr[len("mha-tui: error: "):-1]


def test_refusals_the_files_decide_import_neither_torch_nor_transformers(
        tiny_dir: Path, tmp_path: Path) -> None:
    long = " ".join(["cat"] * 80)
    source = str(tiny_dir)
    cases = [(long, source, 0), ("The cat", source, 3), ("The cat", source, -1), ("", source, 0),
             ("", source, 5)]
    for sentence, where, layer in cases:
        message = _refused_early(sentence, "--hf", where, "--layer", str(layer))
        assert message == _full_path(where, sentence, layer)
    assert "has 80 tokens but" in _refused_early(long, "--hf", source)
    (tmp_path / "empty").mkdir()
    save_tiny_gpt2(tmp_path / "no-tok", with_tokenizer=False)
    for where in (str(tmp_path / "empty"), str(tmp_path / "no-tok"), str(tiny_dir / "config.json"),
                  str(tmp_path / "nowhere")):
        assert _refused_early("The cat", "--hf", where) == _full_path(where, "The cat", 0)


def test_a_name_in_the_cache_is_found_without_torch(tiny_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    hub_cache_layout(cache, "tiny-org/tiny-gpt2", tiny_dir)
    env = {"HF_HUB_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    message = _refused_early(" ".join(["cat"] * 80), "--hf", "tiny-gpt2", env=env)
    assert message == "the sentence has 80 tokens but tiny-gpt2 reads at most 64"
    message = _refused_early("The cat", "--hf", "tiny-org/tiny-gpt2", "--layer", "7", env=env)
    assert message == "--layer 7 is out of range: tiny-org/tiny-gpt2 has 3 layers, 0 to 2"


def test_undecided_files_go_on_to_transformers(tiny_dir: Path, tmp_path: Path) -> None:
    slow = tmp_path / "slow"
    shutil.copytree(tiny_dir, slow)
    (slow / "tokenizer.json").unlink()
    model = json.loads((tiny_dir / "tokenizer.json").read_text())["model"]
    (slow / "vocab.json").write_text(json.dumps(model["vocab"]))  # GPT-2's files before tokenizers
    (slow / "merges.txt").write_text("#version: 0.2\n" + "\n".join(
        merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]) + "\n")
    long = " ".join(["cat"] * 80)
    hf_files.refuse_early(str(slow), long, 0)  # not decided here: no refusal
    assert _full_path(str(slow), long, 0) == f"the sentence has 80 tokens but {slow} reads at most 64"


def test_a_model_type_not_in_the_table_goes_on_to_transformers(tiny_dir: Path,
                                                                tmp_path: Path) -> None:
    """An unknown model type is transformers' to refuse (in its own words), and one the table
    does not list is not refused here even when the sentence is too long for it."""
    long = " ".join(["cat"] * 80)
    for model_type in ("not-a-model", "gpt_bigcode"):
        directory = tmp_path / model_type
        shutil.copytree(tiny_dir, directory)
        config = json.loads((directory / "config.json").read_text())
        config["model_type"] = model_type
        (directory / "config.json").write_text(json.dumps(config))
        hf_files.refuse_early(str(directory), long, 7)  # undecided: no refusal here
    assert "does not recognize this architecture" in _full_path(str(tmp_path / "not-a-model"), long, 0)
