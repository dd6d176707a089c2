"""What a caller asks mha-tui for: one frozen Request, the one door into `pipeline`.

The CLI (`explain`, `check`), the grader's worker and `screenshots` build a Request and hand
it to `pipeline` (`pipeline.traced`, `pipeline.verdict`, `pipeline.comparison`), which
returns a Trace, a Verdict or a Comparison. An option is declared once (in the CLI) and
reaches every command and the grader through a field here, never through a second
parameter list. Plain frozen data; never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import DEFAULT_MODEL, Config, Source, parse_init

# The named mechanisms `--expect` takes besides rotary and alibi, in the forward's order (the
# stage kind each grows the reference by: norm on q and k, cosine, pos_bias, softcap, sinks,
# differential).
MECHANISMS = ("qk_norm", "cosine", "pos_bias", "softcap", "sinks", "differential")


@dataclass(frozen=True)
class Expect:
    """What the learner meant to build, when it is not plain multi-head attention:
    `--expect rotary` (rotary positions, full, base `rotary_base`), `--expect alibi`
    (ALiBi's fixed slopes), `--window N` (a causal sliding window of N tokens), and the
    named mechanisms of `MECHANISMS` (`--expect softcap`, ... : `mechanisms`, each grown with
    the parameters the module's own stage shows, the cap `softcap` when given). The
    reference grows each mechanism. `--expect` is repeatable: several at once."""

    rotary: bool = False
    window: int | None = None
    alibi: bool = False
    rotary_base: float = 10000.0
    mechanisms: tuple[str, ...] = ()
    softcap: float | None = None

    def __post_init__(self) -> None:
        unknown = [m for m in self.mechanisms if m not in MECHANISMS]
        if unknown:
            raise ValueError(f"no such mechanism to expect: {', '.join(unknown)}")
        object.__setattr__(self, "mechanisms", tuple(m for m in MECHANISMS
                                                     if m in self.mechanisms))

    def facts(self) -> dict[str, Any]:
        return {"rotary": self.rotary, "window": self.window, "alibi": self.alibi,
                "rotary_base": self.rotary_base, "mechanisms": self.mechanisms,
                "softcap": self.softcap}


@dataclass(frozen=True, eq=False)
class Given:
    """A module object given in Python (the notebook's `mha_tui.trace`, `show`, `check`):
    the one `source` that is not built here. It runs as it is (its mode, its weights), on
    `x` as the caller made it; it is never built, seeded or edited.

    `tokens` label x's T axis (default t0, t1, ...). `context`: cross-attention's second
    sequence (B, T_k, C), labelled by `context_tokens` (default c0, c1, ...). `options`:
    `mha_tui.trace`'s own (`call`, `embedding` and `ids`, and for NumPy code `args`,
    `kwargs`, `table`, `lookup`), handed to the tracer as given.

    `causal`: None, the module is called as the caller said (`options["call"]`, else
    `module(x)`); a bool, it is called as the CLI calls a module it built (`load.signature`:
    x once or as query, key and value, or with the context; a `mask` or `attn_mask`
    parameter gets the causal mask, or None), and the check judges it with that mask
    (`mha_tui.check`). `label` names it in a verdict (default its class name)."""

    module: Any
    x: Any
    tokens: tuple[str, ...] | None = None
    context: Any = None
    context_tokens: tuple[str, ...] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    causal: bool | None = None
    label: str = ""

    @property
    def name(self) -> str:
        """How a verdict names the module: `label`, else its class's name."""
        return self.label or type(self.module).__name__


@dataclass(frozen=True)
class Checkpoint:
    """A whole model read from its weights, one layer shown: `--hf PATH_OR_NAME`, or a model
    trained here (`--model induction`: `trained`), on `sentence`. A `Request`'s `checkpoint`:
    `pipeline.whole` loads and traces it; the CLI (`explain`, `heads`) only builds the Request.

    `stream`: its blocks read one at a time (`--no-stream` unsets it); `dtype`: what it runs
    in (`--dtype`, auto: as stored); `context`: an encoder-decoder's encoder input
    (`--context`), whose decoder layer shows its cross- or self-attention (`attention`);
    `steps`: `--decode N`, the last N tokens decoded against the model's own cache.

    A request with a checkpoint has no `config`: a Config holds the sizes of a module built
    here, validated when built, and a whole model's sizes are its own, known once it is
    loaded (the trace's `config.model`); its sentence is refused by the model's tokenizer
    (`load.hf`), not by `Config` (which would refuse its length, `<pad>` or `--max-seq-len`)."""

    name: str
    sentence: str
    trained: bool = False
    layer: int = 0
    stream: bool = False
    dtype: str = "auto"
    context: str | None = None
    attention: str = "cross"
    steps: int = 0


@dataclass(frozen=True)
class Request:
    """One run asked of mha-tui: which module, on what input, with which options.

    Fields:

    - `config`: the sentence (the queries' tokens), the sizes the module is built with (C =
      `embed_dim`, h = `num_heads`; T = T_q is the sentence's length), `seed`, `causal`,
      `max_seq_len`; and the context sentence for cross-attention (`config.context`: the
      keys' and values' tokens, T_k = `len(config.key_tokens)`; "" for self-attention,
      where T_q == T_k). Validated when built (`ConfigError`, one line).
    - `source`: which module runs: a tutorial's (`--model`) or the learner's (`--module`,
      with `--init` and `--weights`), both built here; or a `Given` module object (the
      notebook), run as it is on its own x, with `config` its sizes (`pipeline.given_config`
      reads them from the module and x when the caller gives none).
    - `expect`: what the check judges against (`--expect`, `--window`, `--rotary-base`);
      plain multi-head attention by default. Read by `pipeline.verdict` and
      `pipeline.checked`.
    - `against`: `explain --against`'s reference module, or None. Read by
      `pipeline.comparison`.
    - `rows` (a property): a padded batch's other sentences (`--batch`), one per batch row
      after the first (B = 1 + len(rows)), padded with PAD to the longest. They live in
      `config.batch`, since the vocabulary, the ids and T are made from every row.
    - `steps`: `--decode N`: the last N tokens of the sentence are generated one at a time
      against the module's KV cache after a prefill of the others (`pipeline.decoded`: a
      Trace per step). 0: one forward over the whole sentence.
    - `checkpoint`: a whole model (`--hf`, `--model induction`) instead of a module built
      here; the request then has no `config` (None: the model's sizes are its own) and
      `pipeline.whole` loads and traces it (`whole.trace`; `pipeline.traced` refuses it, so
      that the app and the notebook never reach transformers). A request names exactly one
      of `config` and `checkpoint`.
    """

    config: Config | None = None
    source: Source | Given = field(default_factory=Source)
    expect: Expect = field(default_factory=Expect)
    against: Source | None = None
    steps: int = 0
    checkpoint: Checkpoint | None = None

    def __post_init__(self) -> None:
        if (self.config is None) == (self.checkpoint is None):
            raise ValueError("a Request names a module built here (config) or a whole model "
                             "(checkpoint): exactly one of them")

    def of_module(self, model: str | None = None, module: str | None = None) -> Request:
        """The same run of another module (`check`'s submissions, one by one): --model NAME
        or a module FILE.py:Class, with the same --init and --weights."""
        return replace(self, source=replace(self.source, model=model or DEFAULT_MODEL,
                                            module=module))

    @property
    def rows(self) -> tuple[str, ...]:
        """The batch's rows after the sentence's (`--batch`): `config.batch`."""
        return self.config.batch

    def as_json(self) -> dict[str, Any]:
        """The request as plain JSON types (the grader hands it to its worker processes).
        Only a request whose module is named (not --hf) travels this way."""
        config, source = self.config, self.source
        if config is None or not isinstance(source, Source):
            raise ValueError("only a request for a module built here (--model, --module) "
                             "travels as JSON")
        return {"sentence": config.sentence, "embed_dim": config.embed_dim,
                "heads": config.num_heads, "seed": config.seed, "causal": config.causal,
                "max_seq_len": config.max_seq_len, "context": config.context,
                "dtype": config.dtype, "model": source.model, "module": source.module,
                "init": [f"{name}={value!r}" for name, value in source.init],
                "weights": source.weights, **self.expect.facts(),
                "rows": list(self.rows), "steps": self.steps}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Request:
        """The request `as_json` wrote (extra keys, the grader's limits, are ignored)."""
        config = Config(data["sentence"], embed_dim=data["embed_dim"], num_heads=data["heads"],
                        seed=data["seed"], causal=data["causal"],
                        max_seq_len=data["max_seq_len"], context=data.get("context", ""),
                        batch=tuple(data.get("rows", ())), dtype=data.get("dtype", ""))
        source = Source(model=data.get("model") or DEFAULT_MODEL, module=data.get("module"),
                        init=tuple(parse_init(text) for text in data.get("init", ())),
                        weights=data.get("weights"))
        expect = Expect(rotary=bool(data.get("rotary")), window=data.get("window"),
                        alibi=bool(data.get("alibi")),
                        rotary_base=float(data.get("rotary_base", 10000.0)),
                        mechanisms=tuple(data.get("mechanisms", ())),
                        softcap=None if data.get("softcap") is None else float(data["softcap"]))
        return cls(config, source, expect, steps=int(data.get("steps", 0)))
