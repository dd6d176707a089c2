"""Every option and argument of every command, declared once.

Each is an `Annotated` type: a command takes `heads: Heads = 2`, and the same declaration
(flag, help, metavar) serves every command that takes it. Where two commands give one flag
different words (`--width` of a transcript and of a table), each meaning has its own entry
here, side by side. The choices (`Format`, `Model`, ...) are read from the tables they
choose from (`write.FORMATS`, `config.MODEL_NAMES`).

A new option: its entry here, a parameter of the commands that take it, and its field on the
`Request` (`records/request.py`) set where the command builds it. Imports nothing heavy.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from .. import __version__
from ..config import (
    DEFAULT_MODEL,
    DTYPE_CHOICES,
    MAX_EMBED_DIM,
    MAX_SEQ_LEN,
    MODEL_NAMES,
    NUMPY_MODEL_NAMES,
    TRAINED_MODEL_NAMES,
    Config,
    ConfigError,
    Source,
    parse_init,
)
from ..records.request import MECHANISMS, Expect
from ..write import FORMATS, format_of
from .process import fail

# ---------------------------------------------------------------------------- choices

# --format's choices: the rows of write.FORMATS (text, json, svg, html, md).
Format = StrEnum("Format", [(name, name) for name in FORMATS])  # type: ignore[misc]
# --dtype's choices (config.DTYPE_CHOICES): auto, float32, bfloat16, float16.
DtypeName = StrEnum("DtypeName", [(name, name) for name in DTYPE_CHOICES])  # type: ignore[misc]


class CheckFormat(StrEnum):
    text = "text"
    json = "json"
    csv = "csv"
    gradescope = "gradescope"
    prairielearn = "prairielearn"


class SandboxMode(StrEnum):
    auto = "auto"
    required = "required"
    off = "off"


class AttentionKind(StrEnum):
    """--attention: which attention of an encoder-decoder's decoder layer --hf shows."""

    cross = "cross"
    self = "self"


class ExpectKind(StrEnum):
    attention = "attention"
    rotary = "rotary"
    alibi = "alibi"
    qk_norm = "qk_norm"
    cosine = "cosine"
    pos_bias = "pos_bias"
    softcap = "softcap"
    sinks = "sinks"
    differential = "differential"


class Ablation(StrEnum):
    zero = "zero"
    mean = "mean"


# --model's choices, listed in --help: the tutorials' modules in mha_tui/examples.
Model = StrEnum("Model", [(name.replace("-", "_"), name)
                         for name in MODEL_NAMES + NUMPY_MODEL_NAMES + TRAINED_MODEL_NAMES])

DEFAULT_SENTENCE = "I love AI !"

# ---------------------------------------------------------------------------- the input

Sentence = Annotated[str, typer.Argument(metavar="SENTENCE", help="The sentence; tokens are split on whitespace.", show_default=False)]
SentenceOption = Annotated[str, typer.Option("--sentence", "-s", help="The input sentence; tokens are split on whitespace.")]
WholeModelSentence = Annotated[str, typer.Argument(help='The sentence, e.g. "a b c d a b c d" (words numbered by first appearance with --model induction).')]
Repeat = Annotated[bool, typer.Option("--repeat", help="Run the sentence twice in a row (a b c -> a b c a b c): what an induction head needs to show itself.")]
RepeatHeads = Annotated[bool, typer.Option("--repeat", help="Run the sentence twice in a row (a b c -> a b c a b c): what an induction head needs.")]
Batch = Annotated[list[str] | None, typer.Option("--batch", metavar="SENTENCE", help="Another row of the batch (repeatable): the rows are padded with <pad> to the longest, and the module gets the padding mask by its parameter (attention_mask: 1 = a token; key_padding_mask or padding_mask: True = padding; else a mask that blocks the padded keys).")]
BatchJudged = Annotated[list[str] | None, typer.Option("--batch", metavar="SENTENCE", help="Another row of the batch (repeatable), padded with <pad> to the longest; the module gets the padding mask by its parameter.")]
Context = Annotated[str | None, typer.Option("--context", metavar="SENTENCE", help="Cross-attention: the queries come from the sentence, the keys and values from this second sentence (looked up in the same embedding); the forward gets it by its parameter (context, encoder_hidden_states, key_value_states, xa, memory, or key and value). Without --model or --module: --model cross. With --hf on an encoder-decoder (T5, BART, Marian): the encoder's input, the sentence the decoder's.")]
Attention = Annotated[AttentionKind | None, typer.Option("--attention", help="With --hf and --context on an encoder-decoder: the decoder layer's cross-attention (default: keys and values from the encoder's output on the context) or its self-attention.", case_sensitive=False, show_default=False)]
Decode = Annotated[int, typer.Option("--decode", metavar="N", help="Decode with a KV cache: the last N tokens of the sentence are generated one at a time after a prefill of the others, each step its own walk-through (d / D in the app), compared with the same row of the full, uncached forward. The cache is found from the forward's signature: passed in and returned (layer_past, past_key_value, past_kv), or kept in the module (use_cache with reset_cache(), start_pos, input_pos); with --hf, the model's own Cache.")]
DecodeJudged = Annotated[int, typer.Option("--decode", metavar="N", help="Judge decoding with a KV cache: the last N tokens generated one at a time against the module's cache must equal the full forward's rows, and a second run after the module's reset the first; a cache joined on the wrong axis, a mask or rotary position that ignores the cache's offset, a cache not reset between runs are named at their line.")]
ContextJudged = Annotated[str | None, typer.Option("--context", metavar="SENTENCE", help="Cross-attention: judge the module with queries from --sentence and keys and values from this sentence, against a reference that takes both (no causal mask across two sequences).")]

# ---------------------------------------------------------------------------- the sizes

Heads = Annotated[int, typer.Option("--heads", "-H", help="Number of heads h; must divide --embed-dim.")]
EmbedDim = Annotated[int, typer.Option("--embed-dim", "-C", help=f"Embedding width C (at most {MAX_EMBED_DIM}).")]
Seed = Annotated[int, typer.Option("--seed", help="torch.manual_seed before building the modules.")]
Causal = Annotated[bool, typer.Option("--causal/--no-causal", help="Apply the causal mask.")]
CausalJudged = Annotated[bool, typer.Option("--causal/--no-causal", help="Judge against causal attention (and pass the mask to a forward that takes one).")]
MaxSeqLen = Annotated[int, typer.Option("--max-seq-len", help=f"Longest sentence the module accepts (at most {MAX_SEQ_LEN}).")]

# ---------------------------------------------------------------------------- the module

ModelChoice = Annotated[Model | None, typer.Option("--model", help=f"A tutorial's module (default {DEFAULT_MODEL}).", case_sensitive=False)]
Models = Annotated[list[str] | None, typer.Option("--model", metavar="NAME", help=f"Also judge a tutorial's module (repeatable): {', '.join(MODEL_NAMES + NUMPY_MODEL_NAMES)}.")]
WholeModel = Annotated[str | None, typer.Option("--model", help="A model trained by this repository: induction.")]
Module = Annotated[str | None, typer.Option("--module", metavar="FILE.py:CLASS", help="Your own module instead: FILE.py:Class or package.module:Class.")]
Submissions = Annotated[list[str] | None, typer.Argument(metavar="SUBMISSION", help="The modules to judge: FILE.py:Class, package.module:Class, or (with --class) FILE.py, a folder of .py files or a quoted glob ('submissions/*/attn.py').", show_default=False)]
ClassName = Annotated[str | None, typer.Option("--class", metavar="CLASS", help="The class in every FILE.py, folder or glob given without one (check submissions/ --class MultiHeadAttention).")]
Init = Annotated[list[str] | None, typer.Option("--init", metavar="NAME=VALUE", help="A constructor argument, VALUE a Python literal; repeatable.")]
Weights = Annotated[Path | None, typer.Option("--weights", metavar="FILE", help="Load the module's tensors from a state dict (.pt via torch.load(weights_only=True), or .safetensors).")]
Hf = Annotated[str | None, typer.Option("--hf", metavar="PATH_OR_NAME", help='Explain one attention layer of a Hugging Face model (a causal LM, or an encoder such as BERT or T5): a local directory, or a name in the local Hugging Face cache (gpt2). Never downloads. Needs pip install "mha-tui[hf]".')]
HfWhole = Annotated[str | None, typer.Option("--hf", metavar="PATH_OR_NAME", help="A Hugging Face model in a local directory or the local cache. Never downloads.")]
HfRefused = Annotated[str | None, typer.Option("--hf", hidden=True)]
Layer = Annotated[int | None, typer.Option("--layer", help="With --hf or --model induction: the layer to explain, from 0; in the app [ and ] move between layers.")]
Dtype = Annotated[DtypeName, typer.Option("--dtype", help="The dtype the module runs and is recorded in. With --hf, auto is the checkpoint's own (a bfloat16 checkpoint is explained in bfloat16, with the model's own numbers); float32, bfloat16 or float16 on request (the header says so: float32 (upcast from bfloat16 on request)). With --model or a module file: the module and x are cast to it (auto: as the module is built); NumPy code is refused.", case_sensitive=False)]
DtypeJudged = Annotated[DtypeName, typer.Option("--dtype", help="The dtype the module is judged in: the module and x are cast to it (module.to(dtype)) before its forward, and every check allows that dtype's rounding (bfloat16: 2^-6 of the numbers' size); auto: as the module is built (float32). NumPy code is refused.", case_sensitive=False)]
NoStream = Annotated[bool, typer.Option("--no-stream", help="With --hf: load every weight of the model at once, instead of only the blocks up to the layer shown, one at a time from the checkpoint (streamed: the default for safetensors checkpoints).")]
Against = Annotated[str | None, typer.Option("--against", metavar="MODEL_OR_FILE.py:CLASS", help="Compare with a reference, stage by stage: a tutorial's module (mygpt, course, ...) or FILE.py:Class, run on the same x with your weights copied in by role; with --dump, text or JSON.")]

# ---------------------------------------------------------------------------- what is judged

ExpectChoice = Annotated[list[ExpectKind] | None, typer.Option("--expect", help="What you meant to build: plain multi-head attention, or with a mechanism (repeat --expect for several): rotary positions on Q and K (full, base --rotary-base; a partial rotary as the module turns it), ALiBi's fixed slopes on the scores, q/k normalisation (RMSNorm or LayerNorm, per head or whole), cosine attention with a learned scale, relative position terms added to the scores, logit soft-capping (--softcap), attention sinks, differential attention; each learned parameter is the module's own. Shared K/V heads are read from the K and V weights.", case_sensitive=False, show_default=False)]
Softcap = Annotated[float | None, typer.Option("--softcap", metavar="CAP", help="With --expect softcap: the cap, each score s becoming CAP * tanh(s / CAP) before softmax (Gemma 2: 50); by default the module's own.", show_default=False)]
RotaryBase = Annotated[float, typer.Option("--rotary-base", metavar="BASE", help="With --expect rotary: the base of the angles, pair i turning by BASE^(-2i/d_h) per position.")]
Window = Annotated[int | None, typer.Option("--window", metavar="N", help="You meant a causal sliding window: each token sees itself and the N - 1 tokens before it.", show_default=False)]
Check = Annotated[bool, typer.Option("--check", help="In the app: judge every stage as `mha-tui check` does, mark it in the rail and show the diagnosis beside it.")]

# ---------------------------------------------------------------------------- what is shown

Stage = Annotated[str | None, typer.Option("--stage", help="Stage to start at: in the app, or the transcript from that stage on.")]
Only = Annotated[bool, typer.Option("--only", help="With --stage and --dump: the transcript holds that one stage (a slide).")]
Quiz = Annotated[bool, typer.Option("--quiz", help="Quiz yourself: in the app each stage's numbers stay hidden until you answer a question about them, computed from this run; with --dump, a worksheet of the questions and an answer key (text, JSON or Markdown).")]
Why = Annotated[str | None, typer.Option("--why", metavar="STAGE[i, j, ...]", help='With --dump: instead of the transcript, how one number of a stage\'s result was made, recomputed by mha-tui from the recorded tensors, e.g. "softmax[0, 1, 2, 1]".')]
Ablate = Annotated[str | None, typer.Option("--ablate", metavar="LAYER.HEAD", help="Remove one head (e.g. 1.2) and run the model again: the change in loss and in each position's top prediction.")]
AblateWith = Annotated[Ablation, typer.Option("--ablate-with", help="zero: the head's slice of the input to W_O set to 0; mean: to its mean over the positions.", case_sensitive=False)]

# ---------------------------------------------------------------------------- where it is written

Dump = Annotated[str | None, typer.Option("--dump", metavar="PATH", help="Write the transcript to PATH ('-' for stdout) instead of opening the app. Devices, FIFOs and /dev/fd/N are written through; a file is replaced only once the transcript is complete.")]
DumpHeads = Annotated[str | None, typer.Option("--dump", metavar="PATH", help="Write the model view to PATH ('-' for stdout) instead of opening the app.")]
FormatChoice = Annotated[Format | None, typer.Option("--format", help="Transcript format; default: from --dump's extension (.json, .svg, .html, .md), else text.", case_sensitive=False, show_default=False)]
FormatHeads = Annotated[Format | None, typer.Option("--format", help="text, json, svg, html or md; default: from --dump's extension.", case_sensitive=False, show_default=False)]
FormatCheck = Annotated[CheckFormat, typer.Option("--format", help="text: a table and the diagnosis; json: for graders; csv: one row per student (points per stage), for a gradebook; gradescope, prairielearn: that LMS's results.json for one submission (judged in the sandbox).", case_sensitive=False)]
Width = Annotated[int | None, typer.Option("--width", help="Text transcript width in columns (40 to 400, default 100); JSON has no width.")]
WidthTable = Annotated[int, typer.Option("--width", help="Table width in columns when not on a terminal (40 to 400).")]
WidthHeads = Annotated[int, typer.Option("--width", help="Columns (40 to 400); GPT-2 small's 12 x 12 heads fit 120.")]
Full = Annotated[bool, typer.Option("--full", help="Never elide rows, columns or heads in the text transcript.")]
Color = Annotated[bool, typer.Option("--color", help="Keep colours (ANSI codes) in the text transcript.")]
Ascii = Annotated[bool, typer.Option("--ascii", help="Plain ASCII only (in JSON: every non-ASCII character as a \\u escape).")]
AsciiTable = Annotated[bool, typer.Option("--ascii", help="Draw with plain ASCII only.")]
AsciiHeads = Annotated[bool, typer.Option("--ascii", help="Plain ASCII only.")]

# ---------------------------------------------------------------------------- grading

Timeout = Annotated[float, typer.Option("--timeout", metavar="SECONDS", help="Grading several modules: the time each may take in its own process, torch's import included.")]
Jobs = Annotated[int | None, typer.Option("--jobs", "-j", help="Grading several modules: how many run at once (default: the number of CPUs, at most 4).", show_default=False)]
Memory = Annotated[int, typer.Option("--memory", metavar="MB", help="Grading several modules: the memory each may take beyond what mha-tui itself uses (Linux).")]
Rubric = Annotated[Path | None, typer.Option("--rubric", metavar="FILE.toml", help="Points per stage and for the whole module equivalent, and hidden stages (default: 1 a stage, 5 end to end). See docs/grading.md.", show_default=False)]
Feedback = Annotated[Path | None, typer.Option("--feedback", metavar="DIR", help="Grading: write one Markdown file per student into DIR, as each is graded.", show_default=False)]
Summary = Annotated[Path | None, typer.Option("--summary", metavar="FILE", help="Grading: write the class summary (verdicts, the stage that fails first most often, the common diagnoses) as JSON to FILE.", show_default=False)]
Results = Annotated[Path | None, typer.Option("--results", metavar="FILE", help="Grading: write each submission's verdict to FILE as it is graded (JSON lines).", show_default=False)]
Resume = Annotated[bool, typer.Option("--resume", help="With --results: do not grade again what FILE already holds (same file, same settings).")]
Sandbox = Annotated[SandboxMode, typer.Option("--sandbox", help="Grading several modules: each runs in a bubblewrap sandbox (no network, no other file of yours, its own scratch folder). auto: where bwrap works, else without one, said once; required: refuse to grade without it; off.", case_sensitive=False)]

# ---------------------------------------------------------------------------- serve

Host = Annotated[str, typer.Option("--host", help="Address to listen on. 127.0.0.1: this machine only; 0.0.0.0 opens it to the network (a classroom), with no password.")]
Port = Annotated[int, typer.Option("--port", help="Port to listen on (1-65535).")]


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"mha-tui {__version__}\n")
        raise typer.Exit()


Version = Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")]


# ---------------------------------------------------------------------------- onto the Request
# Each option reaches the Request here, checked (one line, exit 2) before anything heavy.


def valid_text(text: str, what: str) -> str:
    """A sentence as given on the command line, refused when it is not valid UTF-8."""
    if text != text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"):
        fail(f"{what} is not valid UTF-8 text")
    return text


def config_of(sentence: str, *, heads: int, embed_dim: int, seed: int, causal: bool,
              max_seq_len: int, context: str | None, batch: list[str] | None,
              dtype: str = "auto") -> Config:
    """The sentence, --context, --batch, the sizes and --dtype: the Request's `config`."""
    if context is not None:
        valid_text(context, "--context")
    try:
        return Config(sentence, embed_dim=embed_dim, num_heads=heads, seed=seed, causal=causal,
                      max_seq_len=max_seq_len, context=context or "", batch=tuple(batch or ()),
                      dtype="" if dtype == "auto" else dtype)
    except ConfigError as error:
        fail(str(error))


def source_of(model: str | None, module: str | None, init: list[str],
              weights: Path | None) -> Source:
    """--model or a module, --init, --weights: the Request's `source`."""
    try:
        return Source(model=model or DEFAULT_MODEL, module=module,
                      init=tuple(parse_init(text) for text in init),
                      weights=None if weights is None else str(weights))
    except ConfigError as error:
        fail(str(error))


def expect_of(expect: list[ExpectKind] | None, *, window: int | None, rotary_base: float,
              softcap: float | None = None) -> Expect:
    """--expect (repeatable), --window, --rotary-base, --softcap: what the check judges
    against, the Request's `expect`."""
    wanted = set(expect or ())
    if window is not None and window < 1:
        fail(f"--window must be at least 1, got {window}")
    if not rotary_base > 1:
        fail(f"--rotary-base must be above 1, got {rotary_base:g}")
    if ExpectKind.attention in wanted and len(wanted) > 1:
        fail("--expect attention means plain multi-head attention: it cannot go with "
             f"--expect {', '.join(sorted(w.value for w in wanted - {ExpectKind.attention}))}")
    if ExpectKind.cosine in wanted and ExpectKind.qk_norm in wanted:
        fail("--expect cosine already normalises q and k (to unit length): it cannot go with "
             "--expect qk_norm")
    if ExpectKind.alibi in wanted and ExpectKind.pos_bias in wanted:
        fail("--expect alibi is a position bias with fixed slopes: it cannot go with "
             "--expect pos_bias (a bias the module learns)")
    if softcap is not None and ExpectKind.softcap not in wanted:
        fail("--softcap CAP goes with --expect softcap")
    if softcap is not None and not softcap > 0:
        fail(f"--softcap must be above 0, got {softcap:g}")
    return Expect(rotary=ExpectKind.rotary in wanted, window=window,
                  alibi=ExpectKind.alibi in wanted, rotary_base=rotary_base,
                  mechanisms=tuple(w.value for w in wanted if w.value in MECHANISMS),
                  softcap=softcap)


def dump_format(fmt: Format | None, dump: str | None, *, only: bool, stage: str | None) -> Format:
    """--format, else --dump's extension (.json, .svg, .html, .md), else text; --only needs
    --stage."""
    if only and (stage is None or dump is None):
        fail("--only writes the one stage --stage names: give --stage ID and --dump PATH")
    if fmt is not None:
        return fmt
    return Format(format_of(dump or ""))


def check_decode(steps: int, config: Config) -> None:
    """--decode N: between 1 and T - 1 (the rest is the prompt). With --context or --batch the
    module says why it cannot decode (`pipeline.load`, once it is built)."""
    if not steps:
        return
    if not 1 <= steps < config.seq_len:
        fail(f"--decode {steps}: the sentence has {config.seq_len} tokens; decode between 1 and "
             f"{config.seq_len - 1} of them (at least one token is the prompt)")
