"""`mha-tui`: arguments, errors, and the choice between a transcript and the app.

Imports nothing heavy at module level: `--help` and `--version` must not pay for torch or
textual. Every refusal is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

# Private, and no public way exists: typer >= 0.20 vendors click and does not re-export
# NoArgsIsHelpError, the only sign that a bare `mha-tui` asked for the help (exit 0) rather
# than made a usage error (exit 2).
from typer._click.exceptions import NoArgsIsHelpError

from . import __version__, collector, pipeline
from .config import (
    CROSS_MODEL,
    DEFAULT_MODEL,
    MAX_EMBED_DIM,
    MAX_SEQ_LEN,
    MODEL_NAMES,
    NUMPY_MODEL_NAMES,
    TRAINED_MODEL_NAMES,
    Config,
    ConfigError,
    Source,
    parse_init,
    parse_module_ref,
)
from .records.request import Expect, Request
from .stages import STAGE_IDS
from .write import FORMATS, Page, format_of

if TYPE_CHECKING:
    from .grade.options import GradingOutputs
    from .grade.rubric import Rubric
    from .judge import Verdict
    from .load.modules import Loaded
    from .load.numpy_modules import LoadedNumpy
    from .records import Trace
    from .write.destination import Destination

app = typer.Typer(
    name="mha-tui",
    help="Step through a real PyTorch multi-head attention forward pass in the terminal.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class _PlainUsage(typer.core.TyperCommand):
    """`Usage: mha-tui explain [OPTIONS] SENTENCE`: a required argument as its plain name
    (Typer writes `{SENTENCE}`), the way Unix usage lines and the README spell it."""

    def collect_usage_pieces(self, ctx):  # type: ignore[no-untyped-def]
        return [piece[1:-1] if piece.startswith("{") and piece.endswith("}") else piece
                for piece in super().collect_usage_pieces(ctx)]


# --format's choices: the rows of write.FORMATS (text, json, svg, html, md).
Format = StrEnum("Format", [(name, name) for name in FORMATS])  # type: ignore[misc]


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


# --model's choices, listed in --help: the tutorials' modules in mha_tui/examples.
Model = StrEnum("Model", [(name.replace("-", "_"), name)
                         for name in MODEL_NAMES + NUMPY_MODEL_NAMES + TRAINED_MODEL_NAMES])


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, exit code 2 (usage) or 1 (a failure at run time)."""
    _say(f"mha-tui: error: {message}")
    raise SystemExit(code)


def _say(line: str) -> None:
    """One line on stderr; the user's text in it (a path, a name) can hold any character,
    so every control, format or lone-surrogate character is written as its escape
    (`\\x07`, `\\u202e`), whichever message carried it (ZWJ and ZWNJ of emoji are kept)."""
    line = "".join(repr(ch)[1:-1] if unicodedata.category(ch) in ("Cc", "Cf", "Cs")
                   and ch not in "\u200c\u200d" else ch for ch in line.replace("\n", " "))
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError):  # stderr closed: the exit code is all we can give
        pass


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"mha-tui {__version__}\n")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """mha-tui: see what every line of a multi-head attention module does to your numbers."""


@app.command(cls=_PlainUsage)
def explain(
    sentence: Annotated[str, typer.Argument(metavar="SENTENCE", help="The sentence; tokens are split on whitespace.", show_default=False)],
    heads: Annotated[int, typer.Option("--heads", "-H", help="Number of heads h; must divide --embed-dim.")] = 2,
    embed_dim: Annotated[int, typer.Option("--embed-dim", "-C", help=f"Embedding width C (at most {MAX_EMBED_DIM}).")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="torch.manual_seed before building the modules.")] = 0,
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Apply the causal mask.")] = True,
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", help=f"Longest sentence the module accepts (at most {MAX_SEQ_LEN}).")] = 64,
    dump: Annotated[str | None, typer.Option("--dump", metavar="PATH", help="Write the transcript to PATH ('-' for stdout) instead of opening the app. Devices, FIFOs and /dev/fd/N are written through; a file is replaced only once the transcript is complete.")] = None,
    fmt: Annotated[Format | None, typer.Option("--format", help="Transcript format; default: from --dump's extension (.json, .svg, .html, .md), else text.", case_sensitive=False, show_default=False)] = None,
    width: Annotated[int | None, typer.Option("--width", help="Text transcript width in columns (40 to 400, default 100); JSON has no width.")] = None,
    full: Annotated[bool, typer.Option("--full", help="Never elide rows, columns or heads in the text transcript.")] = False,
    color: Annotated[bool, typer.Option("--color", help="Keep colours (ANSI codes) in the text transcript.")] = False,
    ascii_only: Annotated[bool, typer.Option("--ascii", help="Plain ASCII only (in JSON: every non-ASCII character as a \\u escape).")] = False,
    stage: Annotated[str | None, typer.Option("--stage", help="Stage to start at: in the app, or the transcript from that stage on.")] = None,
    only: Annotated[bool, typer.Option("--only", help="With --stage and --dump: the transcript holds that one stage (a slide).")] = False,
    model: Annotated[Model | None, typer.Option("--model", help=f"A tutorial's module (default {DEFAULT_MODEL}).", case_sensitive=False)] = None,
    module: Annotated[str | None, typer.Option("--module", metavar="FILE.py:CLASS", help="Your own module instead: FILE.py:Class or package.module:Class.")] = None,
    init: Annotated[list[str] | None, typer.Option("--init", metavar="NAME=VALUE", help="A constructor argument, VALUE a Python literal; repeatable.")] = None,
    weights: Annotated[Path | None, typer.Option("--weights", metavar="FILE", help="Load the module's tensors from a state dict (.pt via torch.load(weights_only=True), or .safetensors).")] = None,
    check_stages: Annotated[bool, typer.Option("--check", help="In the app: judge every stage as `mha-tui check` does, mark it in the rail and show the diagnosis beside it.")] = False,
    hf_source: Annotated[str | None, typer.Option("--hf", metavar="PATH_OR_NAME", help='Explain one attention layer of a Hugging Face model (a causal LM, or an encoder such as BERT or T5): a local directory, or a name in the local Hugging Face cache (gpt2). Never downloads. Needs pip install "mha-tui[hf]".')] = None,
    layer: Annotated[int | None, typer.Option("--layer", help="With --hf or --model induction: the layer to explain, from 0; in the app [ and ] move between layers.")] = None,
    repeat: Annotated[bool, typer.Option("--repeat", help="Run the sentence twice in a row (a b c -> a b c a b c): what an induction head needs to show itself.")] = False,
    quiz: Annotated[bool, typer.Option("--quiz", help="Quiz yourself: in the app each stage's numbers stay hidden until you answer a question about them, computed from this run; with --dump, a worksheet of the questions and an answer key (text, JSON or Markdown).")] = False,
    against: Annotated[str | None, typer.Option("--against", metavar="MODEL_OR_FILE.py:CLASS", help="Compare with a reference, stage by stage: a tutorial's module (mygpt, course, ...) or FILE.py:Class, run on the same x with your weights copied in by role; with --dump, text or JSON.")] = None,
    why_cell: Annotated[str | None, typer.Option("--why", metavar="STAGE[i, j, ...]", help='With --dump: instead of the transcript, how one number of a stage\'s result was made, recomputed by mha-tui from the recorded tensors, e.g. "softmax[0, 1, 2, 1]".')] = None,
    batch: Annotated[list[str] | None, typer.Option("--batch", metavar="SENTENCE", help="Another row of the batch (repeatable): the rows are padded with <pad> to the longest, and the module gets the padding mask by its parameter (attention_mask: 1 = a token; key_padding_mask or padding_mask: True = padding; else a mask that blocks the padded keys).")] = None,
    context: Annotated[str | None, typer.Option("--context", metavar="SENTENCE", help="Cross-attention: the queries come from the sentence, the keys and values from this second sentence (looked up in the same embedding); the forward gets it by its parameter (context, encoder_hidden_states, key_value_states, xa, memory, or key and value). Without --model or --module: --model cross. With --hf on an encoder-decoder (T5, BART, Marian): the encoder's input, the sentence the decoder's.")] = None,
    attention: Annotated[AttentionKind | None, typer.Option("--attention", help="With --hf and --context on an encoder-decoder: the decoder layer's cross-attention (default: keys and values from the encoder's output on the context) or its self-attention.", case_sensitive=False, show_default=False)] = None,
) -> None:
    """Explain one forward pass: open the step-through app, or write a transcript with --dump."""
    if sentence != sentence.encode("utf-8", "surrogateescape").decode("utf-8", "replace"):
        fail("the sentence is not valid UTF-8 text")
    if repeat:
        sentence = f"{sentence} {sentence}"
    trained = model is not None and model.value in TRAINED_MODEL_NAMES
    if trained:  # a whole model trained here: explained a layer at a time, like --hf
        hf_source, model = model.value, None  # type: ignore[union-attr]
    if hf_source is not None:
        for flag, given in (("--heads", heads != 2), ("--embed-dim", embed_dim != 4),
                            ("--seed", seed != 0), ("--no-causal", not causal),
                            ("--max-seq-len", max_seq_len != 64), ("--check", check_stages),
                            ("--model", model is not None), ("--module", module is not None),
                            ("--init", bool(init)), ("--weights", weights is not None),
                            ("--batch", bool(batch))):
            if given:
                fail(f"{flag} does not apply with {'--model ' + hf_source if trained else '--hf'}: "
                     f"the model brings its own sizes, weights and mask")
        if context is not None and trained:
            fail(f"--context with --model {hf_source} is not there: it explains one "
                 f"self-attention layer")
        if context is not None and context != context.encode("utf-8", "surrogateescape").decode(
                "utf-8", "replace"):
            fail("--context is not valid UTF-8 text")
        if context is not None and not context.split():
            fail("--context is empty; give the encoder's input sentence, e.g. --context "
                 "\"le chat est sur le tapis\"")
        if attention is not None and context is None:
            fail("--attention picks the cross- or self-attention of an encoder-decoder's "
                 "decoder layer: give the encoder's input with --context SENTENCE")
    elif layer is not None:
        fail("--layer picks a layer of a whole model: use it with --hf PATH_OR_NAME or "
             "--model induction")
    if hf_source is None:
        if attention is not None:
            fail("--attention picks the cross- or self-attention of an encoder-decoder's "
                 "decoder layer: use it with --hf PATH_OR_NAME and --context SENTENCE")
        if context is not None and context != context.encode("utf-8", "surrogateescape").decode(
                "utf-8", "replace"):
            fail("--context is not valid UTF-8 text")
        try:
            config = Config(sentence, embed_dim=embed_dim, num_heads=heads, seed=seed,
                            causal=causal, max_seq_len=max_seq_len, context=context or "",
                            batch=tuple(batch or ()))
        except ConfigError as error:
            fail(str(error))
        if context is not None and model is None and module is None:
            model = Model(CROSS_MODEL)  # the tutorial module that takes a second sequence
        source = _source(model, module, init or [], weights)
        request = Request(config, source)
        if stage is not None and stage not in STAGE_IDS and not _a_stage_kind(stage):
            fail(f"--stage {stage!r} is not a stage; choose one of: {', '.join(STAGE_IDS)} (or "
                 "one of a module's own: rotary, qkv_split, kv_repeat, op-2 ...)")
    fmt = _dump_format(fmt, dump, only=only, stage=stage)
    reference = _against(against, dump=dump, fmt=fmt, hf=hf_source is not None, why=why_cell,
                         check=check_stages, stage=stage)
    cell = _why_cell(why_cell, dump=dump, fmt=fmt, hf=hf_source is not None)
    if quiz:
        if reference is not None:
            fail("--quiz and --against both say what to write; give one of them")
        _check_quiz(dump=dump, fmt=fmt, why=cell is not None, check=check_stages, only=only)
    if color and not FORMATS[fmt.value].colours and FORMATS[fmt.value].sized:
        _say(f"mha-tui: note: in {fmt.value}, --color changes nothing (SVG and HTML "
             "are always in the app's colours; Markdown is plain text)")
    if not FORMATS[fmt.value].sized:
        _note_unused_for_json(width=width, full=full, color=color)
    elif width is not None and not 40 <= width <= 400:
        fail(f"--width must be between 40 and 400, got {width}")
    destination = None
    if _STDOUT_CLOSED and (dump is None or dump == "-"):
        fail(f"{'--dump -: ' if dump else ''}standard output is closed; give --dump PATH "
             "to write the transcript to a file")
    if dump is not None:
        from .write.destination import DumpError, resolve

        try:
            destination = resolve(dump)
        except DumpError as error:
            fail(str(error), error.code)
    if hf_source is not None:
        _explain_hf(sentence, hf_source, layer or 0, destination=destination,
                    interactive=_interactive(dump), fmt=fmt, width=width or 100,
                    full=full, color=color, ascii_only=ascii_only, stage=stage, only=only,
                    quiz=quiz, why=cell, trained=trained, context=context,
                    attention=(attention or AttentionKind.cross).value)
        return
    _check_budget(config, destination, fmt)
    # The default module on one sentence needs no building before the app opens; anything
    # else is built first, so that bad input (a forward that takes no context) exits 2.
    plain = source.is_default and not config.cross and not config.batch

    if check_stages:
        _explain_checked(request, dump=dump, stage=stage, ascii_only=ascii_only)
        return
    if reference is not None and _interactive(dump):
        _explain_compared(replace(request, against=reference), ascii_only=ascii_only)
        return
    if reference is not None:
        _write_comparison(replace(request, against=reference), destination, fmt,
                          width=width or 100, full=full, color=color, ascii_only=ascii_only)
        return

    if _interactive(dump):
        from .load.learner import LoadError

        if _PREFLIGHT and not plain:  # serve checks the input before the app
            try:
                pipeline.load(request)
            except LoadError as error:
                fail(str(error))

        def app() -> None:
            # The module is built in the app's loading thread: the app is on screen (q
            # quits) while a learner's file imports and its forward runs, which may never
            # return. Bad --module/--init/--weights end the app: one line here, exit 2.
            from .app.run import run_app  # after _open_app paused the collector

            refusal = run_app(config, start=stage or STAGE_IDS[0], ascii_only=ascii_only,
                              build=None if plain else partial(_load, request),
                              running=_whose_forward(source), refusals=(LoadError,),
                              quiz=quiz)
            if refusal is not None:
                fail(refusal)

        _open_app(app)
        return
    if _STANDALONE:  # as the app starts (collector.py): torch's import without the collector,
        collector.pause()  # which the module's build (load.learner.learner_code) resumes
    loaded: Loaded | LoadedNumpy | None = None
    if not plain:  # build it now: bad --module/--init/--weights/--context fail here, exit 2
        from .load.learner import LoadError

        try:
            loaded = pipeline.load(request)
        except LoadError as error:
            fail(str(error))
    _write_transcript(request, destination, fmt, width=width or 100, full=full, color=color,
                      ascii_only=ascii_only, stage=stage, loaded=loaded, only=only, why=cell,
                      quiz=quiz)


def _check_quiz(*, dump: str | None, fmt: Format, why: bool, check: bool, only: bool) -> None:
    """--quiz: the app asks; with --dump, a worksheet in text, JSON or Markdown."""
    if why:
        fail("--quiz and --why both say what to write; give one of them")
    if check:
        fail("--quiz hides the numbers that --check judges; give one of them")
    if _interactive(dump):
        return  # the app asks, stage by stage
    if not FORMATS[fmt.value].worksheet:
        fail(f"--quiz writes a worksheet as text, JSON or Markdown, not {fmt.value}")
    if only:
        fail("--quiz writes the questions of every stage; --only does not apply")


def _against(text: str | None, *, dump: str | None, fmt: Format, hf: bool, why: str | None,
             check: bool, stage: str | None) -> Source | None:
    """--against MODEL or FILE.py:Class, checked before anything heavy runs."""
    if text is None:
        return None
    if hf:
        fail("--against does not apply with --hf: it compares two modules built here "
             "(--model or --module) on the same x")
    for flag, given in (("--why", why is not None), ("--check", check), ("--stage", stage)):
        if given:
            fail(f"--against does not take {flag} yet")
    if not _interactive(dump) and not FORMATS[fmt.value].comparison:
        fail(f"--against writes text or JSON, not {fmt.value}")
    if text in NUMPY_MODEL_NAMES:
        fail(f"--against {text}: the reference must be a torch module (your weights are "
             "copied into its parameters); give your NumPy module as --module or --model")
    if text in MODEL_NAMES:
        return _check_source(text, None, [], None)
    if ":" not in text:
        fail(f"--against {text!r} is neither a tutorial's module ({', '.join(MODEL_NAMES)}) "
             "nor FILE.py:Class")
    return _check_source(None, text, [], None)


def _explain_compared(request: Request, *, ascii_only: bool) -> None:
    """explain --against in a terminal: the comparison app, both modules built and run in
    its loading thread (bad input ends the app: one line, exit 2)."""
    from .judge.roles import RoleCopyError
    from .load.learner import LoadError
    from .pipeline import comparison

    if _PREFLIGHT:  # serve checks the input before the app
        try:
            comparison(request)
        except (LoadError, RoleCopyError) as error:
            fail(str(error))

    def app() -> None:
        from .app.compare import run_compare_app

        refusal = run_compare_app(request.config,
                                  compare=lambda c: comparison(replace(request, config=c)),
                                  ascii_only=ascii_only, running=_whose_forward(request.source),
                                  refusals=(LoadError, RoleCopyError))
        if refusal is not None:
            fail(refusal)

    _open_app(app)


def _write_comparison(request: Request, destination: Destination | None, fmt: Format, *,
                      width: int, full: bool,
                      color: bool, ascii_only: bool) -> None:
    """explain --against --dump: both modules built and compared before anything is opened,
    so bad input writes nothing."""
    from .judge.roles import RoleCopyError
    from .load.learner import LoadError
    from .pipeline import comparison
    from .render.options import RenderOptions
    from .write.destination import DumpError, opened, resolve
    from .write.dump import TranscriptError, comparison_text, write_comparison_json

    if destination is None:
        destination = resolve("-")
    try:
        compared = comparison(request)
    except (LoadError, RoleCopyError) as error:
        fail(str(error))
    try:
        with opened(destination) as out:
            if fmt is Format.json:
                write_comparison_json(compared, out, ascii_only=ascii_only)
            else:
                out.write(comparison_text(compared, RenderOptions(full=full, ascii=ascii_only),
                                          width=width, color=color).encode("utf-8"))
    except DumpError as error:
        fail(str(error), error.code)
    except TranscriptError as error:
        fail(f"{error}. Nothing written to {_where(destination)}", 1)
    except BrokenPipeError:
        _exit_now(0)
    except OSError as error:
        fail(f"could not write the transcript to {_where(destination)}: "
             f"{error.strerror or error}", 1)
    _exit_now(0)


def _why_cell(text: str | None, *, dump: str | None, fmt: Format, hf: bool
              ) -> tuple[str, tuple[int, ...]] | None:
    """--why STAGE[i, j, ...], checked before anything heavy runs."""
    if text is None:
        return None
    from .why import KINDS as WHY_KINDS
    from .why import WhyError, parse_cell

    if _interactive(dump):
        fail("--why prints how one number was made: give --dump - (or --dump PATH)")
    if not FORMATS[fmt.value].cell:
        fail(f"--why writes text, not {fmt.value}")
    try:
        cell = parse_cell(text)
    except WhyError as error:
        fail(str(error))
    # A module's own stages (rotary, kv_repeat, op-7 ...) are known once it ran: a name that
    # is no stage kind at all is refused now, one of another module's stages after its run.
    if cell[0] not in STAGE_IDS and cell[0].split("-")[0] not in WHY_KINDS:
        fail(f"--why {text!r}: {cell[0]!r} is not a stage; choose one of: {', '.join(STAGE_IDS)}")
    return cell


def _load(request: Request, config: Config) -> Loaded | LoadedNumpy:
    """The request's module built for the config the app runs (pipeline.load)."""
    return pipeline.load(replace(request, config=config))


def _whose_forward(source: Source) -> str:
    """Whose forward the app waits for, in its words: "M.forward from loop.py"."""
    if source.module is not None:
        where, cls, _ = parse_module_ref(source.module)
        return f"{cls}.forward from {where}"
    return f"--model {source.model}'s forward"


def _dump_format(fmt: Format | None, dump: str | None, *, only: bool, stage: str | None) -> Format:
    """--format, else --dump's extension (.json, .svg, .html, .md), else text; --only needs
    --stage."""
    if only and (stage is None or dump is None):
        fail("--only writes the one stage --stage names: give --stage ID and --dump PATH")
    if fmt is not None:
        return fmt
    return Format(format_of(dump or ""))


def _source(model: Model | None, module: str | None, init: list[str], weights: Path | None) -> Source:
    """--model, --module, --init, --weights, checked before anything heavy is imported."""
    if model is not None and module is not None:
        fail(f"--model {model.value} and --module {module} both name the module; give one of them")
    return _check_source(model.value if model else None, module, init, weights)


def _explain_checked(request: Request, *, dump: str | None, stage: str | None,
                     ascii_only: bool) -> None:
    """explain --check: the app, its rail marked with the verdict of every stage."""
    if not _interactive(dump):
        fail("--check marks the stages in the app (a terminal); for a table or JSON run "
             "mha-tui check with the same module")
    from .load.learner import LoadError
    from .pipeline import checked

    if _PREFLIGHT:  # serve checks the input before the app
        try:
            checked(request)
        except LoadError as error:
            fail(str(error))
    judges: list[Callable[[Trace], Verdict]] = []

    def run(config: Config) -> Trace:  # in the app's loading thread, as for explain
        traced, checker = checked(replace(request, config=config))  # bad input: LoadError, exit 2
        judges.append(checker)
        return traced(config)

    def app() -> None:
        from .app.run import run_app  # after _open_app paused the collector

        refusal = run_app(request.config, start=stage or STAGE_IDS[0], ascii_only=ascii_only,
                          loader=run, checker=lambda trace: judges[-1](trace),
                          running=_whose_forward(request.source), refusals=(LoadError,))
        if refusal is not None:
            fail(refusal)

    _open_app(app)


def _interactive(dump: str | None) -> bool:
    """The app rather than a transcript: no --dump, and stdout a terminal, or the app is
    served to a browser tab (`mha-tui serve` starts it with MHA_TUI_SERVE=1)."""
    from .serve import SERVE_ENV

    return dump is None and (sys.stdout.isatty() or os.environ.get(SERVE_ENV) == "1"
                             or _PREFLIGHT)


def _open_app(run: Callable[[], None]) -> None:
    """Run the app; in a terminal, prepare it first (keys, size). Under serve textual-serve
    brings the keys and the size; serve's check of its arguments stops here, every
    refusal having been made and the module built.

    The `mha-tui` process opens the app with the garbage collector paused, until a
    module's code runs or the first forward is done (collector.py: its passes over the
    start-up's objects found nothing to free and delayed the first frame and torch's
    import); `run` imports the app after this."""
    from .serve import SERVE_ENV

    if _PREFLIGHT:
        return
    if _STANDALONE:
        collector.pause()
    try:
        if os.environ.get(SERVE_ENV) != "1":
            from .app.run import prepare_terminal

            if problem := prepare_terminal():  # keys from the terminal; its real size
                fail(problem)
        run()
    finally:
        collector.resume()


def _note_unused_for_json(*, width: int | None, full: bool, color: bool) -> None:
    """JSON is always complete and has no width or colours: say so rather than ignore."""
    unused = [flag for flag, given in (("--width", width is not None), ("--color", color))
              if given]
    parts = []
    if full:
        parts.append("--full changes nothing (JSON is never elided)")
    if unused:
        parts.append(f"{' and '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply "
                     "(JSON has no width or colours)")
    if parts:
        _say(f"mha-tui: note: with --format json, {'; '.join(parts)}")


def _check_budget(config: Config, destination: Destination | None, fmt: Format) -> None:
    """Refuse, before building anything, a size that cannot fit in memory or on disk."""
    from . import budget

    problem = budget.memory_problem(config, budget.available_memory())
    if problem:
        fail(problem)
    if fmt is Format.json and destination is not None:
        folder = str(destination.folder)
        problem = budget.disk_problem(config, folder, budget.free_disk(folder))
        if problem:
            fail(problem)


def _out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    # torch reports a failed CPU allocation as a RuntimeError ("DefaultCPUAllocator: can't
    # allocate memory", "not enough memory"); there is no narrower public type for it.
    text = str(error)
    return isinstance(error, RuntimeError) and ("allocate memory" in text
                                                or "not enough memory" in text)


def _explain_hf(sentence: str, source: str, layer: int, *, destination: Destination | None,
                interactive: bool, fmt: Format, width: int, full: bool, color: bool,
                ascii_only: bool, stage: str | None, only: bool = False, quiz: bool = False,
                why: tuple[str, tuple[int, ...]] | None = None, trained: bool = False,
                context: str | None = None, attention: str = "cross") -> None:
    """--hf (or --model induction, trained: a model of mha_tui/models): load the model
    (refusals here, before any app), then the app, a transcript or --why's cell of the layer
    shown. context: an encoder-decoder's encoder input; the sentence is its decoder's, and
    layer L of the decoder is shown, its cross- or self-attention (attention)."""
    from .load.hf_error import HfError
    from .load.hf_files import refuse_early

    try:  # what the checkpoint's files refuse, before torch and transformers are imported
        if not trained and context is None:
            refuse_early(source, sentence, layer)
    except HfError as error:
        fail(str(error))
    from .load import trained as trained_models
    from .load.hf import check_layer, load
    from .pipeline.hf import Session

    try:
        # too many tokens: refused before the weights load
        if context is not None:
            from .load import hf_seq2seq
            from .pipeline.hf_cross import CrossSession

            seq2seq = hf_seq2seq.load(source, attention)
            check_layer(seq2seq, layer)
            session: Session = CrossSession(seq2seq, sentence, context, ascii_only=ascii_only,
                                            one_layer=not interactive)
        else:
            loaded = trained_models.load(source, sentence) if trained else load(source, sentence)
            check_layer(loaded, layer)
            session = Session(loaded, sentence, ascii_only=ascii_only, one_layer=not interactive)
    except HfError as error:
        fail(str(error))
    if interactive:
        def app() -> None:
            from .app.run import run_app  # after _open_app paused the collector

            run_app(session.config(layer), start=stage or STAGE_IDS[0], ascii_only=ascii_only,
                    loader=lambda config: session.trace(config.model.layer if config.model
                                                        else layer),
                    layers=session, quiz=quiz)

        _open_app(app)
        return
    try:
        trace = session.trace(layer)
    except HfError as error:
        fail(str(error))
    _write_transcript(Request(trace.config), destination, fmt, width=width, full=full, color=color,
                      ascii_only=ascii_only, stage=stage, trace=trace, only=only, quiz=quiz,
                      why=why)


def _write_transcript(request: Request, destination: Destination | None, fmt: Format, *, width: int,
                      full: bool, color: bool, ascii_only: bool, stage: str | None,
                      loaded: Loaded | LoadedNumpy | None = None,
                      trace: Trace | None = None, only: bool = False,
                      why: tuple[str, tuple[int, ...]] | None = None, quiz: bool = False) -> None:
    from .write.destination import DumpError, opened, resolve
    from .write.dump import TranscriptError

    if destination is None:
        destination = resolve("-")
    try:
        from .pipeline import traced
        from .render.options import RenderOptions

        if trace is None:
            trace = traced(request, loaded=loaded)
        # A forward that raised has been explained up to its error: the stages before it and
        # the error stage (torch's message, the line, what it read) are the document, written
        # in full; the run then ends with exit 1 and says so (_ended).
        first = _first_stage(trace, stage, only=only)
        last = first + 1 if only else None
        if quiz:  # the worksheet is built whole before anything is opened
            from .quiz import questions
            from .write.dump import worksheet_json, worksheet_text

            asked = questions(trace)
            if fmt is Format.md:
                from .write.pictures import worksheet_markdown

                text = worksheet_markdown(trace, asked, RenderOptions(ascii=ascii_only), width)
            else:
                text = (worksheet_json(trace, asked, ascii_only) if fmt is Format.json else
                        worksheet_text(trace, asked, RenderOptions(ascii=ascii_only), width=width))
            with opened(destination) as out:
                out.write(text.encode("utf-8"))
            _ended(trace, destination)
        if why is not None:  # computed before anything is opened: a bad cell writes nothing
            from .why import WhyError
            from .why import why as explain_cell
            from .write.dump import why_text

            try:
                text = why_text(explain_cell(trace, *why), RenderOptions(ascii=ascii_only),
                                width=width, color=color)
            except WhyError as error:
                fail(f"--why: {error}")
            with opened(destination) as out:
                out.write(text.encode("utf-8"))
            _ended(trace, destination)
        page = Page(trace, RenderOptions(full=full, ascii=ascii_only), width, color, first, last)
        with opened(destination) as out, (collector.off() if _STANDALONE  # collector.py
                                          else nullcontext()):
            FORMATS[fmt.value].write(page, out)
        _ended(trace, destination)
    except DumpError as error:
        fail(str(error), error.code)
    except TranscriptError as error:
        fail(f"{error}. Nothing written to {_where(destination)}", 1)
    except BrokenPipeError:  # the reader left early (| head): nothing more to deliver
        _exit_now(0)
    except OSError as error:
        fail(f"could not write the transcript to {_where(destination)}: "
             f"{error.strerror or error}", 1)
    except (MemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise
        config = request.config
        fail(f"ran out of memory for {config.seq_len} tokens, --embed-dim {config.embed_dim}, "
             f"--heads {config.num_heads}; try a smaller size", 1)


def _where(destination: Destination) -> str:
    return ("standard output" if destination.kind == "fd" and destination.fd == 1
            else f"--dump {destination.shown}")


def _ended(trace: Trace, destination: Destination) -> NoReturn:
    """The transcript is written: exit 0, or, when the module's forward raised, exit 1 with
    one line saying so and that the transcript ends at its error."""
    if not trace.failed:
        _exit_now(0)
    _say(f"mha-tui: {_forward_error(trace).rstrip('.')}; the transcript written to "
         f"{_where(destination)} ends at its error (stage {len(trace.stages)}/"
         f"{len(trace.stages)})")
    _exit_now(1)


def _forward_error(trace: Trace) -> str:
    """`the module's forward raised RuntimeError at crash_attn.py line 23: view size is ...`."""
    return f"the module's forward raised {trace.raised}"


def _a_stage_kind(stage: str) -> bool:
    """A stage only some modules have (rotary, qkv_split, op-7 ...): known once it ran, so it
    is looked for then. Imported only here: the recogniser loads NumPy, the app must not."""
    from .kinds.registry import BY_KIND

    return stage.split("-")[0] in BY_KIND


def _first_stage(trace: Trace, stage: str | None, *, only: bool = False) -> int:
    """Where a transcript with --stage starts: the first stage of that kind in this trace."""
    if stage is None:
        return 0
    for index, recorded in enumerate(trace.stages):
        if stage in (recorded.id, recorded.kind):
            return index
    if only:
        fail(f"--only: this forward has no {stage!r} stage; its stages: "
             f"{', '.join(recorded.id for recorded in trace.stages)}")
    _say(f"mha-tui: note: this forward has no {stage!r} stage; the transcript starts at the "
         "first stage")
    return 0


# ---------------------------------------------------------------------------- heads


class Ablation(StrEnum):
    zero = "zero"
    mean = "mean"


@app.command(cls=_PlainUsage)
def heads(
    sentence: Annotated[str, typer.Argument(help='The sentence, e.g. "a b c d a b c d" (words numbered by first appearance with --model induction).')],
    model: Annotated[str | None, typer.Option("--model", help="A model trained by this repository: induction.")] = None,
    hf_source: Annotated[str | None, typer.Option("--hf", metavar="PATH_OR_NAME", help="A Hugging Face model in a local directory or the local cache. Never downloads.")] = None,
    repeat: Annotated[bool, typer.Option("--repeat", help="Run the sentence twice in a row (a b c -> a b c a b c): what an induction head needs.")] = False,
    ablate: Annotated[str | None, typer.Option("--ablate", metavar="LAYER.HEAD", help="Remove one head (e.g. 1.2) and run the model again: the change in loss and in each position's top prediction.")] = None,
    ablate_with: Annotated[Ablation, typer.Option("--ablate-with", help="zero: the head's slice of the input to W_O set to 0; mean: to its mean over the positions.", case_sensitive=False)] = Ablation.zero,
    dump: Annotated[str | None, typer.Option("--dump", metavar="PATH", help="Write the model view to PATH ('-' for stdout) instead of opening the app.")] = None,
    fmt: Annotated[Format | None, typer.Option("--format", help="text, json, svg, html or md; default: from --dump's extension.", case_sensitive=False, show_default=False)] = None,
    width: Annotated[int, typer.Option("--width", help="Columns (40 to 400); GPT-2 small's 12 x 12 heads fit 120.")] = 100,
    color: Annotated[bool, typer.Option("--color", help="Keep colours (ANSI codes) in the text transcript.")] = False,
    ascii_only: Annotated[bool, typer.Option("--ascii", help="Plain ASCII only.")] = False,
) -> None:
    """Every layer x head of a whole model as a small heatmap with its label (previous-token,
    induction, ...), scored from this run's weights; --ablate removes a head."""
    if (model is None) == (hf_source is None):
        fail("heads needs a whole model: --model induction or --hf PATH_OR_NAME (one of them)")
    if model is not None and model not in TRAINED_MODEL_NAMES:
        fail(f"--model {model!r}: heads shows a whole model; choose one of: "
             f"{', '.join(TRAINED_MODEL_NAMES)} (or --hf PATH_OR_NAME)")
    if not 40 <= width <= 400:
        fail(f"--width must be between 40 and 400, got {width}")
    fmt = _dump_format(fmt, dump, only=False, stage=None)
    sentence = f"{sentence} {sentence}" if repeat else sentence
    from .roles import parse_head

    try:
        head = parse_head(ablate) if ablate is not None else None
    except ValueError as error:
        fail(str(error))
    destination = None
    if dump is not None:
        from .write.destination import DumpError, resolve

        try:
            destination = resolve(dump)
        except DumpError as error:
            fail(str(error), error.code)
    from .load.hf_error import HfError

    try:
        if model is not None:
            from .load.trained import load as load_trained

            loaded = load_trained(model, sentence)
        else:
            from .load.hf import load as load_hf
            from .load.hf_files import refuse_early

            refuse_early(hf_source, sentence, 0)  # type: ignore[arg-type]
            loaded = load_hf(hf_source, sentence)  # type: ignore[arg-type]
        from .pipeline.heads import model_view

        view = model_view(loaded, sentence, ascii_only=ascii_only, ablate=head,
                          method=ablate_with.value)
    except HfError as error:
        fail(str(error))
    from .render.options import RenderOptions

    opts = RenderOptions(ascii=ascii_only)
    if _interactive(dump):
        _heads_app(view, loaded, sentence, opts, head)
        return
    from .heads_transcript import WRITERS
    from .write.destination import DumpError, opened, resolve

    text = WRITERS[fmt.value](view, opts, width, **({"color": color} if fmt is Format.text else {}),
                              selected=head)
    try:
        with opened(destination or resolve("-")) as out:
            out.write(text.encode("utf-8"))
    except DumpError as error:
        fail(str(error), error.code)
    except BrokenPipeError:
        _exit_now(0)
    _exit_now(0)


def _heads_app(view: Any, loaded: Any, sentence: str, opts: Any, selected: tuple[int, int] | None
               ) -> None:
    """The heads screen; enter on a head opens that layer's walk-through at that head, and
    quitting the walk-through comes back to the heads."""
    from .pipeline.heads import model_view
    from .pipeline.hf import Session

    session = Session(loaded, sentence, ascii_only=opts.ascii)

    def ablate(layer: int, head: int, method: str) -> Any:
        return model_view(loaded, sentence, ascii_only=opts.ascii, ablate=(layer, head),
                          method=method)

    def app() -> None:
        from .app.heads import HeadsApp
        from .app.run import run_app

        def trace(config: Any) -> Any:
            return session.trace(config.model.layer)

        at = selected or (0, 0)
        while True:
            chosen = HeadsApp(view, opts, selected=at, ablate=ablate).run()
            if chosen is None:
                return
            at = chosen
            run_app(session.config(chosen[0]), start="softmax", ascii_only=opts.ascii,
                    loader=trace, layers=session, focus=chosen[1])

    _open_app(app)


# ---------------------------------------------------------------------------- serve

_PREFLIGHT = False  # serve checks explain's arguments by running it up to the app
# explain's options that only shape a transcript: serve shows the app.
_TRANSCRIPT_ONLY = ("--dump", "--format", "--width", "--full", "--color", "--only")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[--host HOST] [--port PORT] SENTENCE [EXPLAIN OPTIONS]")
def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to listen on. 127.0.0.1: this machine only; 0.0.0.0 opens it to the network (a classroom), with no password.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (1-65535).")] = 8000,
) -> None:
    """Serve the app in a browser tab: SENTENCE and explain's options (--heads, --model, --module, --stage, --hf ...).

    Each tab that opens the URL runs its own app. Nothing is loaded from the internet."""
    global _PREFLIGHT
    args = list(ctx.args)
    for arg in args:
        if arg.split("=", 1)[0] in _TRANSCRIPT_ONLY:
            fail(f"serve shows the app; {arg.split('=', 1)[0]} is for transcripts "
                 "(mha-tui explain --dump)")
    if not 1 <= port <= 65535:
        fail(f"--port must be between 1 and 65535, got {port}")
    if not args:
        fail('serve needs the sentence, as explain does: mha-tui serve "I love AI !"')
    from .serve import ServeError, available, check_address

    if not available():
        fail('serve needs textual-serve: pip install "mha-tui[serve]"')
    try:
        check_address(host, port)
    except ServeError as error:
        fail(str(error))
    explain_command = typer.main.get_command(app).get_command(ctx, "explain")  # type: ignore[attr-defined]
    _PREFLIGHT = True  # explain's own checks and loading, stopping where the app would open
    try:
        explain_command.main(args=args, prog_name="mha-tui serve", standalone_mode=False)
    finally:
        _PREFLIGHT = False
    from .serve import serve as run_server

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    try:
        run_server(args, host=host, port=port, say=say)
    except ServeError as error:
        fail(str(error), 1)


# ---------------------------------------------------------------------------- check

DEFAULT_SENTENCE = "I love AI !"


@app.command()
def check(
    specs: Annotated[list[str] | None, typer.Argument(metavar="SUBMISSION", help="The modules to judge: FILE.py:Class, package.module:Class, or (with --class) FILE.py, a folder of .py files or a quoted glob ('submissions/*/attn.py').", show_default=False)] = None,
    models: Annotated[list[str] | None, typer.Option("--model", metavar="NAME", help=f"Also judge a tutorial's module (repeatable): {', '.join(MODEL_NAMES + NUMPY_MODEL_NAMES)}.")] = None,
    class_name: Annotated[str | None, typer.Option("--class", metavar="CLASS", help="The class in every FILE.py, folder or glob given without one (check submissions/ --class MultiHeadAttention).")] = None,
    sentence: Annotated[str, typer.Option("--sentence", "-s", help="The input sentence; tokens are split on whitespace.")] = DEFAULT_SENTENCE,
    heads: Annotated[int, typer.Option("--heads", "-H", help="Number of heads h; must divide --embed-dim.")] = 2,
    embed_dim: Annotated[int, typer.Option("--embed-dim", "-C", help=f"Embedding width C (at most {MAX_EMBED_DIM}).")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="torch.manual_seed before building the modules.")] = 0,
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Judge against causal attention (and pass the mask to a forward that takes one).")] = True,
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", help=f"Longest sentence the module accepts (at most {MAX_SEQ_LEN}).")] = 64,
    init: Annotated[list[str] | None, typer.Option("--init", metavar="NAME=VALUE", help="A constructor argument, VALUE a Python literal; repeatable.")] = None,
    weights: Annotated[Path | None, typer.Option("--weights", metavar="FILE", help="Load the module's tensors from a state dict (.pt via torch.load(weights_only=True), or .safetensors).")] = None,
    fmt: Annotated[CheckFormat, typer.Option("--format", help="text: a table and the diagnosis; json: for graders; csv: one row per student (points per stage), for a gradebook; gradescope, prairielearn: that LMS's results.json for one submission (judged in the sandbox).", case_sensitive=False)] = CheckFormat.text,
    width: Annotated[int, typer.Option("--width", help="Table width in columns when not on a terminal (40 to 400).")] = 100,
    ascii_only: Annotated[bool, typer.Option("--ascii", help="Draw with plain ASCII only.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", help="Grading several modules: the time each may take in its own process, torch's import included.")] = 20.0,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Grading several modules: how many run at once (default: the number of CPUs, at most 4).", show_default=False)] = None,
    memory: Annotated[int, typer.Option("--memory", metavar="MB", help="Grading several modules: the memory each may take beyond what mha-tui itself uses (Linux).")] = 2048,
    expect: Annotated[ExpectKind, typer.Option("--expect", help="What you meant to build: plain multi-head attention, with rotary positions on Q and K (full, base --rotary-base; a partial rotary as the module turns it), or with ALiBi's fixed slopes on the scores. Shared K/V heads are read from the K and V weights.", case_sensitive=False)] = ExpectKind.attention,
    rotary_base: Annotated[float, typer.Option("--rotary-base", metavar="BASE", help="With --expect rotary: the base of the angles, pair i turning by BASE^(-2i/d_h) per position.")] = 10000.0,
    window: Annotated[int | None, typer.Option("--window", metavar="N", help="You meant a causal sliding window: each token sees itself and the N - 1 tokens before it.", show_default=False)] = None,
    rubric: Annotated[Path | None, typer.Option("--rubric", metavar="FILE.toml", help="Points per stage and for the whole module equivalent, and hidden stages (default: 1 a stage, 5 end to end). See docs/grading.md.", show_default=False)] = None,
    feedback: Annotated[Path | None, typer.Option("--feedback", metavar="DIR", help="Grading: write one Markdown file per student into DIR, as each is graded.", show_default=False)] = None,
    summary: Annotated[Path | None, typer.Option("--summary", metavar="FILE", help="Grading: write the class summary (verdicts, the stage that fails first most often, the common diagnoses) as JSON to FILE.", show_default=False)] = None,
    results: Annotated[Path | None, typer.Option("--results", metavar="FILE", help="Grading: write each submission's verdict to FILE as it is graded (JSON lines).", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="With --results: do not grade again what FILE already holds (same file, same settings).")] = False,
    sandbox: Annotated[SandboxMode, typer.Option("--sandbox", help="Grading several modules: each runs in a bubblewrap sandbox (no network, no other file of yours, its own scratch folder). auto: where bwrap works, else without one, said once; required: refuse to grade without it; off.", case_sensitive=False)] = SandboxMode.auto,
    hf_source: Annotated[str | None, typer.Option("--hf", hidden=True)] = None,
    batch: Annotated[list[str] | None, typer.Option("--batch", metavar="SENTENCE", help="Another row of the batch (repeatable), padded with <pad> to the longest; the module gets the padding mask by its parameter.")] = None,
    context: Annotated[str | None, typer.Option("--context", metavar="SENTENCE", help="Cross-attention: judge the module with queries from --sentence and keys and values from this sentence, against a reference that takes both (no causal mask across two sequences).")] = None,
) -> None:
    """Is my attention module right? Judge every stage; name the first wrong line and why.

    Several modules (files, a folder, a glob, --model) are graded each in its own process,
    with --timeout and --memory, and summed up one row each.

    Exit code 0: equivalent (every module); 1: NOT equivalent (at least one); 3: could not
    judge (a forward that raised, a module that could not be built among several, or one
    that hung, exited or crashed); 2: usage error. Several modules exit with the worst.
    """
    if hf_source is not None:  # named, not "no such option": a user may well try it
        fail("check does not take --hf: it judges a module you give as FILE.py:Class or "
             "--model NAME; to look at a Hugging Face model's attention use "
             "mha-tui explain --hf PATH_OR_NAME")
    if sentence != sentence.encode("utf-8", "surrogateescape").decode("utf-8", "replace"):
        fail("the sentence is not valid UTF-8 text")
    if context is not None and context != context.encode("utf-8", "surrogateescape").decode(
            "utf-8", "replace"):
        fail("--context is not valid UTF-8 text")
    try:
        config = Config(sentence, embed_dim=embed_dim, num_heads=heads, seed=seed,
                        causal=causal, max_seq_len=max_seq_len, context=context or "",
                        batch=tuple(batch or ()))
    except ConfigError as error:
        fail(str(error))
    if not 40 <= width <= 400:
        fail(f"--width must be between 40 and 400, got {width}")
    if not 0 < timeout <= 24 * 3600:
        fail(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be at least 1, got {jobs}")
    if memory < 64:
        fail(f"--memory must be at least 64 MB, got {memory}")
    if window is not None and window < 1:
        fail(f"--window must be at least 1, got {window}")
    from .pipeline import verdict as verdict_of

    if not rotary_base > 1:
        fail(f"--rotary-base must be above 1, got {rotary_base:g}")
    wanted = Expect(rotary=expect is ExpectKind.rotary, window=window,
                    alibi=expect is ExpectKind.alibi, rotary_base=rotary_base)
    from .grade import GradeError, Submission, find_submissions, is_batch

    if class_name is not None and not all(part.isidentifier() for part in class_name.split(".")):
        fail(f"--class takes the name of a class; {class_name!r} is not one")
    try:
        submissions = find_submissions(specs or [], class_name)
    except GradeError as error:
        fail(str(error))
    for submission in submissions:  # a malformed spec, --init or --weights: exit 2 now
        try:  # the module is check's argument here, not --module
            parse_module_ref(submission.module, taker="check")
        except ConfigError as error:
            fail(str(error))
        _check_source(None, submission.module, init or [], weights)
    for model in models or []:
        _check_source(model, None, init or [], weights)
        submissions.append(Submission(shown=model, model=model))
    if not submissions:
        fail("give the module to check: FILE.py:Class (or package.module:Class), "
             "or --model NAME; e.g. mha-tui check my_attn.py:MultiHeadAttention")
    from .grade.options import grading_outputs
    from .judge.outcome import EXIT_CODES, worst

    try:
        outputs = grading_outputs(rubric=rubric, feedback=feedback, summary=summary,
                                  results=results, resume=resume, fmt=fmt.value,
                                  count=len(submissions))
    except GradeError as error:
        fail(str(error))
    verdict = None
    lms = fmt in (CheckFormat.gradescope, CheckFormat.prairielearn)
    if len(submissions) > 1 or is_batch(specs or []) or lms or outputs.grading:
        reports = _grade(config, submissions, init=init or [], weights=weights,
                         timeout=timeout, jobs=jobs, memory=memory, expect=wanted,
                         sandbox=sandbox, outputs=outputs.session)
        if summary is not None:
            from .grade.options import write_summary

            write_summary(summary, reports, outputs.session.rubric)
    else:  # one module, judged here: the whole report
        from .judge.report import verdict_json
        from .load.learner import LoadError

        one = submissions[0]
        try:
            verdict = verdict_of(Request(config, _check_source(one.model, one.module, init or [],
                                                               weights), wanted))
        except LoadError as error:
            # here the module is an argument, not --module
            fail(str(error).removeprefix("--module: ").removeprefix("--module "))
        reports = [verdict_json(verdict)]
    _write_verdicts(reports, verdict, fmt, width=width, ascii_only=ascii_only,
                    rubric=outputs.session.rubric)
    raise typer.Exit(EXIT_CODES[worst(report["verdict"] for report in reports)])


def _grade(config: Config, submissions: list, *, init: list[str], weights: Path | None,
           timeout: float, jobs: int | None, memory: int, expect: Expect,
           sandbox: SandboxMode, outputs: GradingOutputs) -> list[dict]:
    """Each submission in its own process (grade/pool.py); a progress bar on stderr while
    they run, when stderr is a terminal."""
    from .grade import Limits, sandbox_or_why, watched_folders

    sandboxed, why = sandbox_or_why(sandbox.value)
    if why is not None and sandbox is SandboxMode.required:
        fail(f"--sandbox required: {why}")
    if why is not None and sandbox is SandboxMode.auto:
        sys.stderr.write(f"mha-tui: warning: grading WITHOUT a sandbox ({why}): each "
                         "submission can read, write and reach what you can. Install "
                         "bubblewrap, or pass --sandbox off to grade so without this warning.\n")
    watched = watched_folders(submissions)
    from .grade.session import grade_class

    limits = Limits(sentence=config.sentence, embed_dim=config.embed_dim, heads=config.num_heads,
                    seed=config.seed, causal=config.causal, max_seq_len=config.max_seq_len,
                    init=tuple(init), weights=None if weights is None else str(weights),
                    timeout=timeout, memory=memory << 20, rotary=expect.rotary,
                    window=expect.window, alibi=expect.alibi, rotary_base=expect.rotary_base,
                    context=config.context, batch=config.batch)
    jobs = jobs or max(1, min(os.cpu_count() or 1, 4))
    if not (sys.stderr is not None and sys.stderr.isatty()):
        return grade_class(submissions, limits, outputs, jobs=jobs, sandbox=sandboxed,
                           watched=watched)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}", markup=False), console=Console(stderr=True),
                  transient=True) as progress:
        task = progress.add_task("", total=len(submissions))

        def done(graded) -> None:  # type: ignore[no-untyped-def]
            from .render.text import printable  # a file name is the learner's text

            progress.update(task, advance=1, description=f"{printable(graded.submission.shown)}: "
                                                         f"{graded.outcome}")

        return grade_class(submissions, limits, outputs, jobs=jobs, sandbox=sandboxed,
                           watched=watched, progress=done)


def _check_source(model: str | None, module: str | None, init: list[str],
                  weights: Path | None) -> Source:
    """--model or a module, --init, --weights, checked before anything heavy is imported."""
    try:
        return Source(model=model or DEFAULT_MODEL, module=module,
                      init=tuple(parse_init(text) for text in init),
                      weights=None if weights is None else str(weights))
    except ConfigError as error:
        fail(str(error))


def _write_verdicts(reports: list[dict], verdict: Verdict | None, fmt: CheckFormat, *,
                    width: int, ascii_only: bool, rubric: Rubric) -> None:
    """One module: its whole report (`verdict`); several: one row each and the tally."""
    from .judge.report import summary_table, tally, to_json, verdict_renderable

    if fmt is CheckFormat.json:
        sys.stdout.buffer.write(to_json(reports).encode("utf-8"))
        return
    if fmt in (CheckFormat.csv, CheckFormat.gradescope, CheckFormat.prairielearn):
        from .grade.options import write_gradebook

        write_gradebook(sys.stdout, reports, fmt.value, rubric)
        return
    import io

    from rich.console import Console

    tty = sys.stdout.isatty()
    # Not a terminal (a file, a pipe, course notes): drawn into a buffer first, so that the
    # table's padding leaves no trailing spaces on its lines, as the transcripts have none.
    console = Console(file=sys.stdout if tty else io.StringIO(), width=None if tty else width,
                      highlight=False, soft_wrap=False, no_color=not tty or None, emoji=False,
                      markup=False, force_terminal=tty or None)
    if verdict is not None:
        console.print(verdict_renderable(verdict, ascii_only=ascii_only))
    else:
        from .grade.summary import class_summary, summary_renderable

        console.print(summary_table(reports, ascii_only=ascii_only))
        console.print(tally(reports))
        console.print()
        console.print(summary_renderable(class_summary(reports, rubric)))
    if not tty:
        drawn = console.file.getvalue()  # type: ignore[attr-defined]
        sys.stdout.write("".join(line.rstrip() + "\n" for line in drawn.splitlines()))


def _exit_now(code: int = 0) -> NoReturn:
    """Done and flushed: skip the interpreter's teardown of torch (about 0.5 s here).

    Everything the run promised is on disk or in the pipe; teardown would only free memory
    the process is about to give back anyway. Only the command itself (`main`) ends this way:
    called in-process (Typer's CliRunner, a notebook), the run ends as a Typer command does,
    and the caller goes on.
    """
    if not _STANDALONE:
        raise typer.Exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader left early (| head): nothing more to deliver
        pass
    os._exit(code)


_STDOUT_CLOSED = False
_STANDALONE = False  # True once main() runs: the process is the mha-tui command, nothing else


def _guard_standard_streams() -> None:
    """A closed fd 0, 1 or 2 is held by /dev/null (read-only, so writes fail loudly): the
    next file opened must not become "standard output" by taking its number."""
    global _STDOUT_CLOSED
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDONLY)
            if held != fd:  # a lower one was free too; it gets its own turn
                os.dup2(held, fd)
                os.close(held)
            if fd == 1:
                _STDOUT_CLOSED = True
                sys.stdout = open(os.devnull, "w")
            elif fd == 2:
                sys.stderr = None  # type: ignore[assignment]


def main() -> None:
    """Console-script entry point: usage errors become one line, never a traceback."""
    global _STANDALONE
    _STANDALONE = True
    try:
        _main()
    finally:  # a test that calls main() leaves the process as it found it
        _STANDALONE = False


def _main() -> None:
    _guard_standard_streams()
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as help_request:  # plain `mha-tui`: the help, not an error
        sys.stdout.write(help_request.format_message() + "\n")
        raise SystemExit(0) from None
    except typer.TyperException as error:
        fail(error.format_message().replace("\n", " "))
    except typer.Abort:
        sys.stderr.write("mha-tui: aborted\n")
        raise SystemExit(130) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BrokenPipeError:
        sys.stderr.close()
        raise SystemExit(0) from None
    code = code if isinstance(code, int) else 0
    if "torch" in sys.modules:  # a finished run (check): skip torch's teardown, see _exit_now
        _exit_now(code)
    raise SystemExit(code)
