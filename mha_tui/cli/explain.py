"""`mha-tui explain SENTENCE`: its arguments checked and turned into a Request, then the app,
a transcript, a comparison or one cell's story.

Every refusal is made here, before anything heavy is imported: one line, exit code 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .. import collector, pipeline
from ..config import (
    CROSS_MODEL,
    DECODE_MODEL,
    MODEL_NAMES,
    NUMPY_MODEL_NAMES,
    TRAINED_MODEL_NAMES,
    Config,
    Source,
)
from ..records.request import Checkpoint, Request
from ..stages import STAGE_IDS
from ..write import FORMATS
from . import options, process
from .explain_app import open_checked, open_compared, open_explained
from .options import AttentionKind, Format, Model, check_decode, dump_format, source_of, valid_text
from .process import fail, interactive, say
from .transcript import explain_hf, write_comparison, write_transcript

if TYPE_CHECKING:
    from ..load.modules import LoadedTorch
    from ..load.numpy_modules import LoadedNumpy
    from ..write.destination import Destination


def explain(
    ctx: typer.Context,
    sentence: options.Sentence,
    heads: options.Heads = 2,
    embed_dim: options.EmbedDim = 4,
    seed: options.Seed = 0,
    causal: options.Causal = True,
    max_seq_len: options.MaxSeqLen = 64,
    dump: options.Dump = None,
    fmt: options.FormatChoice = None,
    width: options.Width = None,
    full: options.Full = False,
    color: options.Color = False,
    ascii_only: options.Ascii = False,
    stage: options.Stage = None,
    only: options.Only = False,
    model: options.ModelChoice = None,
    module: options.Module = None,
    init: options.Init = None,
    weights: options.Weights = None,
    check_stages: options.Check = False,
    hf_source: options.Hf = None,
    layer: options.Layer = None,
    no_stream: options.NoStream = False,
    dtype: options.Dtype = options.DtypeName.auto,  # type: ignore[attr-defined]
    repeat: options.Repeat = False,
    quiz: options.Quiz = False,
    against: options.Against = None,
    why_cell: options.Why = None,
    batch: options.Batch = None,
    context: options.Context = None,
    attention: options.Attention = None,
    decode: options.Decode = 0,
) -> None:
    """Explain one forward pass: open the step-through app, or write a transcript with --dump."""
    valid_text(sentence, "the sentence")
    preflight = process.preflight(ctx)  # serve's check: stop where the app would open
    in_app = interactive(dump, preflight=preflight)
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
        if context is not None:
            valid_text(context, "--context")
        if context is not None and not context.split():
            fail("--context is empty; give the encoder's input sentence, e.g. --context "
                 "\"le chat est sur le tapis\"")
        if context is not None and decode:
            fail("--decode with --context on --hf is not there yet: it decodes a causal LM's "
                 "own cache; explain the encoder-decoder's layer without --decode")
        if attention is not None and context is None:
            fail("--attention picks the cross- or self-attention of an encoder-decoder's "
                 "decoder layer: give the encoder's input with --context SENTENCE")
    elif layer is not None:
        fail("--layer picks a layer of a whole model: use it with --hf PATH_OR_NAME or "
             "--model induction")
    if no_stream and (hf_source is None or trained):
        fail("--no-stream applies with --hf PATH_OR_NAME: it loads a checkpoint whole")
    if dtype.value != "auto" and trained:
        fail(f"--dtype {dtype.value} applies with --hf PATH_OR_NAME or a torch module built "
             f"here (--model, --module)")
    if hf_source is None:
        if attention is not None:
            fail("--attention picks the cross- or self-attention of an encoder-decoder's "
                 "decoder layer: use it with --hf PATH_OR_NAME and --context SENTENCE")
        config = options.config_of(sentence, heads=heads, embed_dim=embed_dim, seed=seed,
                                   causal=causal, max_seq_len=max_seq_len, context=context,
                                   batch=batch, dtype=dtype.value)
        if context is not None and model is None and module is None:
            model = Model(CROSS_MODEL)  # the tutorial module that takes a second sequence
        elif decode and model is None and module is None:
            model = Model(DECODE_MODEL)  # the tutorial module that keeps a KV cache
        source = _source(model, module, init or [], weights)
        check_decode(decode, config)
        request = Request(config, source, steps=decode)
        if stage is not None and stage not in STAGE_IDS and not _a_stage_kind(stage):
            fail(f"--stage {stage!r} is not a stage; choose one of: {', '.join(STAGE_IDS)} (or "
                 "one of a module's own: rotary, qkv_split, kv_repeat, op-2 ...)")
    fmt = dump_format(fmt, dump, only=only, stage=stage)
    reference = _against(against, in_app=in_app, fmt=fmt, hf=hf_source is not None, why=why_cell,
                         check=check_stages, stage=stage)
    cell = _why_cell(why_cell, in_app=in_app, fmt=fmt)
    if quiz:
        if reference is not None:
            fail("--quiz and --against both say what to write; give one of them")
        _check_quiz(in_app=in_app, fmt=fmt, why=cell is not None, check=check_stages, only=only)
    if color and not FORMATS[fmt.value].colours and FORMATS[fmt.value].sized:
        say(f"mha-tui: note: in {fmt.value}, --color changes nothing (SVG and HTML "
             "are always in the app's colours; Markdown is plain text)")
    if not FORMATS[fmt.value].sized:
        _note_unused_for_json(width=width, full=full, color=color)
    elif width is not None and not 40 <= width <= 400:
        fail(f"--width must be between 40 and 400, got {width}")
    destination = None
    if process.STDOUT_CLOSED and (dump is None or dump == "-"):
        fail(f"{'--dump -: ' if dump else ''}standard output is closed; give --dump PATH "
             "to write the transcript to a file")
    if dump is not None:
        from ..write.destination import DumpError, resolve

        try:
            destination = resolve(dump)
        except DumpError as error:
            fail(str(error), error.code)
    if hf_source is not None:
        whole = Request(checkpoint=Checkpoint(
            hf_source, sentence, trained=trained, layer=layer or 0,
            stream=not no_stream and not decode, dtype=dtype.value, context=context,
            attention=(attention or AttentionKind.cross).value, steps=decode))
        explain_hf(whole, destination=destination,
                   interactive=in_app, preflight=preflight, fmt=fmt, width=width or 100,
                   full=full, color=color, ascii_only=ascii_only, stage=stage, only=only,
                   quiz=quiz, why=cell)
        return
    _check_budget(config, destination, fmt)
    if check_stages:
        open_checked(request, in_app=in_app, stage=stage, ascii_only=ascii_only,
                     preflight=preflight)
        return
    if reference is not None and in_app:
        open_compared(replace(request, against=reference), ascii_only=ascii_only,
                      preflight=preflight)
        return
    if reference is not None:
        write_comparison(replace(request, against=reference), destination, fmt,
                          width=width or 100, full=full, color=color, ascii_only=ascii_only)
        return

    if in_app:
        open_explained(request, stage=stage, ascii_only=ascii_only, quiz=quiz,
                       preflight=preflight)
        return
    # As the app starts (collector.py): torch's import without the collector, which the
    # module's build (load.learner.learner_code) resumes.
    if process.STANDALONE:
        collector.pause()
    loaded: LoadedTorch | LoadedNumpy | None = None
    # The default module on one sentence needs no building before the transcript; anything
    # else is built now, so that bad input (--module, --init, --weights, a forward that takes
    # no context) exits 2 before anything is written.
    if not (source.is_default and not config.cross and not config.batch and not request.steps):
        from ..load.learner import LoadError

        try:
            loaded = pipeline.load(request)
        except LoadError as error:
            fail(str(error))
    write_transcript(request, destination, fmt, width=width or 100, full=full, color=color,
                      ascii_only=ascii_only, stage=stage, loaded=loaded, only=only, why=cell,
                      quiz=quiz)


def _check_quiz(*, in_app: bool, fmt: Format, why: bool, check: bool, only: bool) -> None:
    """--quiz: the app asks; with --dump, a worksheet in text, JSON or Markdown."""
    if why:
        fail("--quiz and --why both say what to write; give one of them")
    if check:
        fail("--quiz hides the numbers that --check judges; give one of them")
    if in_app:
        return  # the app asks, stage by stage
    if not FORMATS[fmt.value].worksheet:
        fail(f"--quiz writes a worksheet as text, JSON or Markdown, not {fmt.value}")
    if only:
        fail("--quiz writes the questions of every stage; --only does not apply")


def _against(text: str | None, *, in_app: bool, fmt: Format, hf: bool, why: str | None,
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
    if not in_app and not FORMATS[fmt.value].comparison:
        fail(f"--against writes text or JSON, not {fmt.value}")
    if text in NUMPY_MODEL_NAMES:
        fail(f"--against {text}: the reference must be a torch module (your weights are "
             "copied into its parameters); give your NumPy module as --module or --model")
    if text in MODEL_NAMES:
        return source_of(text, None, [], None)
    if ":" not in text:
        fail(f"--against {text!r} is neither a tutorial's module ({', '.join(MODEL_NAMES)}) "
             "nor FILE.py:Class")
    return source_of(None, text, [], None)


def _why_cell(text: str | None, *, in_app: bool, fmt: Format
              ) -> tuple[str, tuple[int, ...]] | None:
    """--why STAGE[i, j, ...], checked before anything heavy runs."""
    if text is None:
        return None
    from ..why import KINDS as WHY_KINDS
    from ..why import WhyError, parse_cell

    if in_app:
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



def _source(model: Model | None, module: str | None, init: list[str], weights: Path | None) -> Source:
    """--model, --module, --init, --weights, checked before anything heavy is imported."""
    if model is not None and module is not None:
        fail(f"--model {model.value} and --module {module} both name the module; give one of them")
    return source_of(model.value if model else None, module, init, weights)


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
        say(f"mha-tui: note: with --format json, {'; '.join(parts)}")


def _check_budget(config: Config, destination: Destination | None, fmt: Format) -> None:
    """Refuse, before building anything, a size that cannot fit in memory or on disk."""
    from .. import budget

    problem = budget.memory_problem(config, budget.available_memory())
    if problem:
        fail(problem)
    if fmt is Format.json and destination is not None:
        folder = str(destination.folder)
        problem = budget.disk_problem(config, folder, budget.free_disk(folder))
        if problem:
            fail(problem)


def _a_stage_kind(stage: str) -> bool:
    """A stage only some modules have (rotary, qkv_split, op-7 ...): known once it ran, so it
    is looked for then. Imported only here: the recogniser loads NumPy, the app must not."""
    from ..kinds.registry import BY_KIND

    return stage.split("-")[0] in BY_KIND
