"""The running example's configuration: sentence -> tokens -> vocabulary -> ids.

Pure Python on purpose: the CLI validates every argument with this module before it
imports torch, so a typo is refused in milliseconds. Never import torch, rich, textual or
typer here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

# The token a padded row is filled with (`--batch`): its own id in the vocabulary.
PAD = "<pad>"

# Ceilings that keep a run within a laptop's memory and a terminal's patience. GPT-2 XL
# has C=1600 and h=25; 4096 leaves room above any textbook model (a `--hf` model's own C
# is not capped: Llama-3-70B's is 8192).
MAX_EMBED_DIM = 4096
MAX_SEQ_LEN = 4096
MAX_SEED = 2**63 - 1
# `--dtype` (with --hf): auto is the checkpoint's own dtype; the others are asked for. Bytes
# per weight in each, for the memory estimate (auto: as the checkpoint stores them).
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class ConfigError(ValueError):
    """An argument the explainer cannot run with; the message says what would work."""


def tokenize(sentence: str) -> tuple[str, ...]:
    """Split on whitespace, exactly as the reference chapter's running example does."""
    return tuple(sentence.split())


def divisors(n: int) -> list[int]:
    """The head counts that split an embedding of width n evenly."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _positive(flag: str, value: int, ceiling: int) -> None:
    if value <= 0:
        raise ConfigError(f"{flag} must be a positive whole number, got {value}")
    if value > ceiling:
        raise ConfigError(f"{flag} {value} is above this tool's ceiling of {ceiling}")


@dataclass(frozen=True)
class ModelSource:
    """A pretrained model explained with `--hf`: its tokenizer's tokens and the layer shown.

    tokens are the tokenizer's pieces made readable (GPT-2's `Ġcat` as `␣cat`); ids its ids.
    """

    name: str
    class_name: str
    layer: int
    n_layers: int
    vocab_size: int
    tokens: tuple[str, ...]
    ids: tuple[int, ...]
    # Every layer was recorded in the one forward pass (`[` and `]` move between them) when
    # the sentence has at most this many tokens; longer, only `layer` was.
    all_layers_limit: int = 0
    attention: str = ""  # the attention submodule's path, e.g. transformer.h.5.attn
    # An encoder (BERT, T5's encoder): its self-attention lets every token see every token.
    encoder: bool = False
    # The encoder of an encoder-decoder (T5, BART, Marian; shown without --context): its
    # model_type; "" for any other model.
    encoder_of: str = ""
    # What the model ran and was recorded in, and the checkpoint's own dtype (they differ
    # only when `--dtype` asked for another: see `dtype_words`).
    dtype: str = "float32"
    stored_dtype: str = "float32"

    def dtype_words(self) -> str:
        """`bfloat16`, or `float32 (upcast from bfloat16 on request)`."""
        if self.dtype == self.stored_dtype:
            return self.dtype
        wider = _BITS.get(self.dtype, 0) > _BITS.get(self.stored_dtype, 0)
        return f"{self.dtype} ({'upcast' if wider else 'cast'} from {self.stored_dtype} on request)"


# Significant bits of each float dtype: which way a cast goes.
_BITS = {"bfloat16": 8, "float16": 11, "float32": 24, "float64": 53}


@dataclass(frozen=True)
class Config:
    """Everything that determines a trace; two equal configs give byte-identical traces."""

    sentence: str
    embed_dim: int = 4
    num_heads: int = 2
    seed: int = 0
    causal: bool = True
    max_seq_len: int = 64
    model: ModelSource | None = None
    # Cross-attention (`--context`): the sentence the keys and values are made from; the
    # queries come from `sentence`. "" for self-attention (keys from the sentence itself).
    context: str = ""
    # The context's token labels when the caller gave a tensor rather than a sentence (the
    # Python API's context_tokens); else the context split on whitespace.
    context_labels: tuple[str, ...] = ()
    # A padded batch (`--batch`): more sentences, rows 1, 2, ... after the sentence's row 0,
    # every row padded with PAD to the longest.
    batch: tuple[str, ...] = ()
    # One decode step with a KV cache (`--decode`): the tokens before this step's, whose keys
    # and values the cache holds. The sentence is then the step's new token(s): the queries;
    # the keys are `cached` and the new tokens (`key_tokens`). () outside decoding.
    cached: tuple[str, ...] = ()
    # A decode step's vocabulary: the whole sentence's (the embedding table has a row for
    # the tokens still to come too). () : made from the tokens.
    vocabulary: tuple[str, ...] = ()
    # `--dtype` for a torch module built here: the module and its x in that dtype (bfloat16,
    # float16, float32). "": as built (float32). `--hf` says its dtype in `model` instead.
    dtype: str = ""

    def __post_init__(self) -> None:
        # A model's own sizes (--hf: Llama-3-70B's C is 8192) are not the tool's to cap: the
        # memory estimate decides whether they fit. The ceiling is for sizes asked for here.
        ceiling = MAX_EMBED_DIM if self.model is None else 2**31
        _positive("--embed-dim", self.embed_dim, ceiling)
        _positive("--heads", self.num_heads, ceiling)
        if self.embed_dim % self.num_heads:
            valid = ", ".join(map(str, divisors(self.embed_dim)))
            raise ConfigError(
                f"--heads {self.num_heads} does not divide --embed-dim {self.embed_dim}; "
                f"valid head counts for {self.embed_dim}: {valid}"
            )
        _positive("--max-seq-len", self.max_seq_len, MAX_SEQ_LEN)
        if self.dtype and self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPE_CHOICES)}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be between 0 and {MAX_SEED}, got {self.seed}")
        if not (self.model.tokens if self.model is not None else tokenize(self.sentence)):
            raise ConfigError("the sentence is empty; give at least one word, e.g. \"I love AI !\"")
        if len(self.tokens) > self.max_seq_len:
            if len(self.tokens) > MAX_SEQ_LEN:  # no --max-seq-len can help: say so
                raise ConfigError(
                    f"the sentence has {len(self.tokens)} tokens, above this tool's ceiling of "
                    f"{MAX_SEQ_LEN} (--max-seq-len {MAX_SEQ_LEN} at most); shorten it"
                )
            raise ConfigError(
                f"the sentence has {len(self.tokens)} tokens but --max-seq-len is "
                f"{self.max_seq_len}; raise it with --max-seq-len {len(self.tokens)}"
            )
        for n, row in enumerate(self.batch, start=1):
            if not tokenize(row):
                raise ConfigError(f"--batch row {n} is empty; give a sentence, e.g. --batch \"the cat\"")
            if len(tokenize(row)) > self.max_seq_len:
                raise ConfigError(f"--batch row {n} has {len(tokenize(row))} tokens but --max-seq-len "
                                  f"is {self.max_seq_len}; raise it with --max-seq-len "
                                  f"{len(tokenize(row))}")
        if PAD in tokenize(self.sentence) or any(PAD in tokenize(row) for row in self.batch):
            raise ConfigError(f"{PAD} is the padding token of --batch; use another word")
        if self.batch and self.cross:
            raise ConfigError(
                "--batch with --context is not built: --batch pads the sentence's rows (the "
                "queries), but a padding mask blocks keys, and here the keys come from the "
                "context, which is one sentence; give one of the two")
        if self.context and not tokenize(self.context):
            raise ConfigError("--context is empty; give the sentence the keys and values are "
                              "made from, e.g. --context \"le chat est sur le tapis\"")
        if len(self.key_tokens) > self.max_seq_len:
            raise ConfigError(
                f"--context has {len(self.key_tokens)} tokens but --max-seq-len is "
                f"{self.max_seq_len}; raise it with --max-seq-len {len(self.key_tokens)}")

    @property
    def tokens(self) -> tuple[str, ...]:
        """Row 0's tokens: the sentence's, padded to the batch's longest row."""
        return self.row_tokens(0)

    @property
    def rows(self) -> tuple[tuple[str, ...], ...]:
        """Every row of the batch as tokens, padded with PAD to the longest (one row without
        --batch)."""
        own = [self.model.tokens if self.model is not None else tokenize(self.sentence),
               *(tokenize(row) for row in self.batch)]
        T = max(len(row) for row in own)
        return tuple(row + (PAD,) * (T - len(row)) for row in own)

    def row_tokens(self, row: int) -> tuple[str, ...]:
        """Batch row `row`'s tokens (padded)."""
        if not self.batch:
            return self.model.tokens if self.model is not None else tokenize(self.sentence)
        return self.rows[row]

    @property
    def padding(self) -> tuple[tuple[bool, ...], ...]:
        """(B, T): True where a row's token is padding (the mask the module is given)."""
        lengths = [len(self.model.tokens if self.model is not None else tokenize(self.sentence)),
                   *(len(tokenize(row)) for row in self.batch)]
        T = max(lengths)
        return tuple(tuple(t >= n for t in range(T)) for n in lengths)

    @property
    def batch_ids(self) -> tuple[tuple[int, ...], ...]:
        """(B, T): every row's ids in the one vocabulary (PAD included when a row is padded)."""
        index = {token: i for i, token in enumerate(self.vocab)}
        return tuple(tuple(index[token] for token in row) for row in self.rows)

    @property
    def cross(self) -> bool:
        """Cross-attention: the keys and values come from another sequence (the context)."""
        return bool(self.context or self.context_labels)

    @property
    def key_tokens(self) -> tuple[str, ...]:
        """The tokens the keys are made from: the context's, or the sentence's own."""
        if self.context_labels:
            return self.context_labels
        if self.cached:
            return self.cached + self.tokens
        return tokenize(self.context) if self.context else self.tokens

    @property
    def vocab(self) -> tuple[str, ...]:
        """Distinct tokens in order of first appearance (the sentence's, then the context's)."""
        if self.vocabulary:
            return self.vocabulary
        # A decode step's cached tokens come first: the ids are the whole sentence's.
        words = self.cached + tuple(token for row in self.rows for token in row)
        return tuple(dict.fromkeys(words + (tokenize(self.context) if self.context else ())))

    @property
    def context_ids(self) -> tuple[int, ...]:
        """The context's ids in the same vocabulary as the sentence's (one embedding table)."""
        index = {token: i for i, token in enumerate(self.vocab)}
        return tuple(index[token] for token in tokenize(self.context))

    @property
    def ids(self) -> tuple[int, ...]:
        if self.model is not None:
            return self.model.ids
        index = {token: i for i, token in enumerate(self.vocab)}
        return tuple(index[token] for token in self.tokens)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def T_q(self) -> int:
        """The queries' length: the sentence's tokens (a padded batch's longest row; a decode
        step's new tokens)."""
        return len(self.tokens)

    @property
    def T_k(self) -> int:
        """The keys' length: the context's tokens (cross-attention), the cached and new
        tokens (a decode step), else the sentence's own: T_q."""
        return len(self.key_tokens)

    @property
    def seq_len(self) -> int:
        """T_q, by the name `--max-seq-len` speaks: the sentence's tokens (the queries)."""
        return self.T_q

    def as_dict(self) -> dict[str, object]:
        if self.model is not None:  # the tokenizer's ids index the model's own vocabulary
            return {
                "sentence": self.sentence, "tokens": list(self.tokens), "ids": list(self.ids),
                "embed_dim": self.embed_dim, "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "model": {"name": self.model.name, "class": self.model.class_name,
                          "layer": self.model.layer, "n_layers": self.model.n_layers,
                          "vocab_size": self.model.vocab_size, "encoder": self.model.encoder,
                          "dtype": self.model.dtype,
                          "checkpoint_dtype": self.model.stored_dtype,
                          **({"encoder_of": self.model.encoder_of} if self.model.encoder_of
                             else {})},
                # an encoder-decoder's decoder layer: the encoder's input, as its tokenizer cut it
                **({"context": self.context, "context_tokens": list(self.key_tokens)}
                   if self.cross else {}),
            }
        return {
            "sentence": self.sentence,
            "tokens": list(self.tokens),
            "vocab": list(self.vocab),
            "ids": list(self.ids),
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "seed": self.seed,
            "causal": self.causal,
            "max_seq_len": self.max_seq_len,
            **({"context": self.context, "context_tokens": list(self.key_tokens)}
               if self.cross else {}),
            **({"cached": list(self.cached)} if self.cached else {}),
            **({"dtype": self.dtype} if self.dtype else {}),
            **({"batch": [list(row) for row in self.rows],
                "padding": [list(row) for row in self.padding]} if self.batch else {}),
        }


# ---------------------------------------------------------------- which module to explain

# `--model NAME`: the tutorials' modules shipped in mha_tui/examples (built by mha_tui.load).
MODEL_NAMES = ("mygpt", "course", "raschka", "raschka-wrapper", "raschka-cache", "many-eyes",
               "cross")
# The tutorial module `--context` runs when no --model or --module is given.
CROSS_MODEL = "cross"
# ... and `--decode`: one that keeps a KV cache.
DECODE_MODEL = "raschka-cache"
# The NumPy blueprint (seed 002): its per-head loop and its einsum form; no torch.
NUMPY_MODEL_NAMES = ("blueprint", "blueprint-einsum")
DEFAULT_MODEL = "mygpt"
# Whole models trained by this repository (mha_tui/models), explained a layer at a time with
# --layer, by the --hf path (mha_tui.load.trained).
TRAINED_MODEL_NAMES = ("induction",)


def parse_init(text: str) -> tuple[str, object]:
    """`--init NAME=VALUE`: a constructor argument, VALUE a Python literal (ast.literal_eval)."""
    import ast
    import keyword

    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier() or keyword.iskeyword(name):
        raise ConfigError(f"--init {text!r} is not NAME=VALUE; e.g. --init qkv_bias=True")
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ConfigError(
            f"--init {text!r}: {value.strip()!r} is not a Python literal "
            f"(a number, True/False/None, a quoted string, a list or tuple of those)"
        ) from None
    return name, parsed


def parse_module_ref(text: str, taker: str = "--module") -> tuple[str, str, bool]:
    """`--module FILE.py:Class` or `package.module:Class` -> (where, class path, is a file);
    `taker` names what took it in a refusal (`check` takes it as its argument)."""
    where, sep, attr = text.rpartition(":")
    usage = f"{taker} takes FILE.py:Class or package.module:Class"
    if not sep or not where or not attr:
        raise ConfigError(f"{usage}, got {text!r}")
    if not all(part.isidentifier() for part in attr.split(".")):
        raise ConfigError(f"{usage}; {attr!r} is not a class name")
    is_file = where.endswith(".py") or "/" in where or "\\" in where
    if not is_file and not all(part.isidentifier() for part in where.split(".")):
        raise ConfigError(f"{usage}; {where!r} is neither a .py file nor a module name")
    if not is_file and os.path.isfile(where):  # README.md, notes.txt: a file, not Python
        raise ConfigError(f"{usage}; {where!r} is a file but not Python source: give a .py "
                          "file (FILE.py:Class) or an importable package.module")
    return where, attr, is_file


@dataclass(frozen=True, eq=False)
class Source:
    """Which attention module runs: a tutorial's (`--model`) or the learner's (`--module`),
    with constructor arguments (`--init`) and a weights file (`--weights`)."""

    model: str = DEFAULT_MODEL
    module: str | None = None
    init: tuple[tuple[str, object], ...] = ()
    weights: str | None = None

    def __post_init__(self) -> None:
        if self.model not in MODEL_NAMES + NUMPY_MODEL_NAMES:
            raise ConfigError(f"--model {self.model!r} is not one of: "
                              f"{', '.join(MODEL_NAMES + NUMPY_MODEL_NAMES)}")
        if self.module is not None:
            parse_module_ref(self.module)

    @property
    def is_default(self) -> bool:
        return (self.model == DEFAULT_MODEL and self.module is None and not self.init
                and self.weights is None)


def check_token_count(words: Sequence[str], shape: tuple[int, ...]) -> None:
    """The Python API's tokens label the T axis of x, shape[-2]: one per position."""
    if len(words) != int(shape[-2]):
        raise ConfigError(f"{len(words)} tokens for the {int(shape[-2])} positions of x, shape "
                          f"{tuple(shape)} (T is the second-to-last axis): give one token per "
                          "position")


def _own_heads(module: object, C: int) -> int | None:
    """The module's own head-count attribute, when it splits C evenly."""
    for attribute in ("num_heads", "n_head", "n_heads", "nhead", "h"):
        value = getattr(module, attribute, None)
        if isinstance(value, int) and value > 0 and C % value == 0:
            return value
    return None


def config_for(module: object, shape: tuple[int, ...], tokens: Sequence[str] | None) -> Config:
    """The configuration of a run the caller did not describe (the Python API): T and C from
    x's shape, h from the module's own head-count attribute (or the one nn.MultiheadAttention
    it wraps; else 1), tokens t0, t1, ..."""
    T, C = int(shape[-2]), int(shape[-1])
    words = list(tokens) if tokens is not None else [f"t{i}" for i in range(T)]
    check_token_count(words, shape)
    heads = _own_heads(module, C)
    if heads is None:  # a wrapper around torch's nn.MultiheadAttention: its num_heads
        modules = getattr(module, "modules", None)
        inner = {value for sub in (list(modules())[1:] if callable(modules) else [])
                 if type(sub).__name__ == "MultiheadAttention"
                 and (value := _own_heads(sub, C)) is not None}
        heads = inner.pop() if len(inner) == 1 else 1
    # w.split() == [w]: w is not empty and holds no whitespace (str.isspace's, as strip's)
    return Config(" ".join(w if w.split() == [w] else "_" for w in words),
                  embed_dim=C, num_heads=heads, max_seq_len=max(64, T))
