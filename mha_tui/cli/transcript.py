"""`explain --dump`: the transcript, the comparison, the worksheet or one cell's story
written to its destination, whole or not at all; and a whole model's layer (`--hf`,
`--model induction`: loaded by `pipeline.whole`) in the app or a transcript.

A forward that raised is explained up to its error, and the run ends with exit code 1.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

from .. import collector
from ..config import DTYPE_BYTES, ConfigError
from ..records.request import Request
from ..stages import STAGE_IDS
from ..write import FORMATS, Page
from . import process
from .options import Format
from .process import exit_now, fail, open_app, say, where

if TYPE_CHECKING:
    from ..load.modules import LoadedTorch
    from ..load.numpy_modules import LoadedNumpy
    from ..records import Trace
    from ..write.destination import Destination


def explain_hf(request: Request, *, destination: Destination | None, interactive: bool,
               fmt: Format, width: int, full: bool, color: bool, ascii_only: bool,
               stage: str | None, only: bool = False, quiz: bool = False,
               why: tuple[str, tuple[int, ...]] | None = None, preflight: bool = False) -> None:
    """A whole model (--hf, or --model induction, trained here): what its files refuse and
    what cannot fit, before torch; the model loaded (`pipeline.whole`,
    refusals before any app); then the app, a transcript or --why's cell of the layer shown
    (--decode N: a trace per step, the app's d / D)."""
    from ..load.hf_error import HfError
    from ..pipeline import whole

    checkpoint = whole.checkpoint_of(request)
    try:  # what the checkpoint's files refuse, before torch and transformers are imported
        tokens = whole.refused_early(request)
        if not checkpoint.trained and checkpoint.context is None:
            _check_hf_budget(checkpoint.name, checkpoint.sentence, tokens, checkpoint.layer,
                             stream=checkpoint.stream, dtype=checkpoint.dtype,
                             destination=destination, fmt=fmt, full=full, why=why is not None,
                             quiz=quiz)
        elif not checkpoint.trained:  # an encoder-decoder, loaded whole (docs/hf.md)
            check_whole_budget(checkpoint.name, checkpoint.sentence,
                               f"--hf {checkpoint.name} with --context",
                               "use a smaller model or free memory")
        session = whole.session(request, ascii_only=ascii_only, one_layer=not interactive)
        if session.note:
            say(f"mha-tui: note: {session.note}")
        trace = (whole.traced(request, session, ascii_only=ascii_only) if checkpoint.steps
                 else None)
    except (HfError, ConfigError) as error:
        fail(str(error))
    layer = checkpoint.layer
    if interactive:
        def app() -> None:
            from ..app.run import run_app  # after open_app paused the collector

            if trace is not None:  # --decode: the steps, d / D
                run_app(trace.config, start=stage or STAGE_IDS[0], ascii_only=ascii_only,
                        loader=lambda config: trace, quiz=quiz)
                return
            run_app(session.config(layer), start=stage or STAGE_IDS[0], ascii_only=ascii_only,
                    loader=lambda config: session.trace(config.model.layer if config.model
                                                        else layer),
                    layers=session, quiz=quiz)

        open_app(app, preflight=preflight)
        return
    if trace is None:
        try:
            trace = session.trace(layer)
        except (HfError, ConfigError) as error:  # (a model's sizes this tool cannot show)
            fail(str(error))
    write_transcript(Request(trace.config), destination, fmt, width=width, full=full, color=color,
                      ascii_only=ascii_only, stage=stage, trace=trace, only=only, quiz=quiz,
                      why=why)


def write_comparison(request: Request, destination: Destination | None, fmt: Format, *,
                      width: int, full: bool,
                      color: bool, ascii_only: bool) -> None:
    """explain --against --dump: both modules built and compared before anything is opened,
    so bad input writes nothing."""
    from ..judge.roles import RoleCopyError
    from ..load.learner import LoadError
    from ..pipeline import comparison
    from ..render.options import RenderOptions
    from ..write.destination import DumpError, opened, resolve
    from ..write.dump import TranscriptError

    if destination is None:
        destination = resolve("-")
    try:
        compared = comparison(request)
    except (LoadError, RoleCopyError) as error:
        fail(str(error))
    try:
        with opened(destination) as out:
            FORMATS[fmt.value].comparison(compared, RenderOptions(full=full, ascii=ascii_only),  # type: ignore[misc]
                                          width, color, out)
    except DumpError as error:
        fail(str(error), error.code)
    except TranscriptError as error:
        fail(f"{error}. Nothing written to {where(destination)}", 1)
    except BrokenPipeError:
        exit_now(0)
    except OSError as error:
        fail(f"could not write the transcript to {where(destination)}: "
             f"{error.strerror or error}", 1)
    exit_now(0)


def write_transcript(request: Request, destination: Destination | None, fmt: Format, *, width: int,
                      full: bool, color: bool, ascii_only: bool, stage: str | None,
                      loaded: LoadedTorch | LoadedNumpy | None = None,
                      trace: Trace | None = None, only: bool = False,
                      why: tuple[str, tuple[int, ...]] | None = None, quiz: bool = False) -> None:
    from ..write.destination import DumpError, opened, resolve
    from ..write.dump import TranscriptError

    if destination is None:
        destination = resolve("-")
    try:
        from ..pipeline import traced
        from ..render.options import RenderOptions

        if trace is None:
            from ..load.learner import LoadError

            try:
                trace = traced(request, loaded=loaded)
            except LoadError as error:  # a forward that cannot decode (--decode): its one line
                fail(str(error))
        # A forward that raised has been explained up to its error: the stages before it and
        # the error stage (torch's message, the line, what it read) are the document, written
        # in full; the run then ends with exit 1 and says so (_ended).
        first = _first_stage(trace, stage, only=only)
        last = first + 1 if only else None
        page = Page(trace, RenderOptions(full=full, ascii=ascii_only), width, color, first, last)
        row = FORMATS[fmt.value]
        if quiz:  # the worksheet is built whole before anything is opened
            from ..quiz import questions

            text = row.worksheet(page, questions(trace))  # type: ignore[misc]
            with opened(destination) as out:
                out.write(text.encode("utf-8"))
            _ended(trace, destination)
        if why is not None:  # computed before anything is opened: a bad cell writes nothing
            from ..why import WhyError
            from ..why import why as explain_cell

            try:
                text = row.cell(page, explain_cell(trace, *why))  # type: ignore[misc]
            except WhyError as error:
                fail(f"--why: {error}")
            with opened(destination) as out:
                out.write(text.encode("utf-8"))
            _ended(trace, destination)
        with opened(destination) as out, (collector.off() if process.STANDALONE  # collector.py
                                          else nullcontext()):
            row.write(page, out)
        _ended(trace, destination)
    except DumpError as error:
        fail(str(error), error.code)
    except TranscriptError as error:
        fail(f"{error}. Nothing written to {where(destination)}", 1)
    except BrokenPipeError:  # the reader left early (| head): nothing more to deliver
        exit_now(0)
    except OSError as error:
        fail(f"could not write the transcript to {where(destination)}: "
             f"{error.strerror or error}", 1)
    except (MemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise
        config = request.config
        fail(f"ran out of memory for {config.seq_len} tokens, --embed-dim {config.embed_dim}, "
             f"--heads {config.num_heads}; try a smaller size", 1)


def _ended(trace: Trace, destination: Destination) -> NoReturn:
    """The transcript is written: exit 0, or, when the module's forward raised, exit 1 with
    one line saying so and that the transcript ends at its error."""
    if not trace.failed:
        exit_now(0)
    say(f"mha-tui: {_forward_error(trace).rstrip('.')}; the transcript written to "
         f"{where(destination)} ends at its error (stage {len(trace.stages)}/"
         f"{len(trace.stages)})")
    exit_now(1)


def _forward_error(trace: Trace) -> str:
    """`the module's forward raised RuntimeError at crash_attn.py line 23: view size is ...`."""
    return f"the module's forward raised {trace.raised}"


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
    say(f"mha-tui: note: this forward has no {stage!r} stage; the transcript starts at the "
         "first stage")
    return 0


def _check_hf_budget(source: str, sentence: str, tokens: int | None, layer: int, *,
                     stream: bool, dtype: str, destination: Destination | None, fmt: Format,
                     full: bool,
                     why: bool, quiz: bool) -> None:
    """--hf: refuse, before torch, transformers or any weight, a run that cannot fit in
    memory (streamed or whole, from config.json and the weight files' headers) or a JSON or
    --full transcript that cannot fit on its disk."""
    from .. import budget
    from ..load.hf_files import exact_tokens, run_shape

    shape = run_shape(source, tokens, sentence, DTYPE_BYTES.get(dtype))  # auto: as stored
    if shape is None:
        return
    available = budget.available_memory()
    big = fmt is Format.json or (full and FORMATS[fmt.value].sized)
    folder = str(destination.folder) if destination is not None else ""
    free = budget.free_disk(folder) if destination is not None and big and not why and not quiz \
        else None

    def problem(shape: budget.HfShape) -> str | None:
        return (budget.hf_memory_problem(source, shape, layer, stream, available)
                or budget.hf_disk_problem(source, shape, folder, free))

    found = problem(shape)
    if found is not None:  # estimated from a bound on the tokens: counted exactly first
        count = exact_tokens(source, sentence)
        if count is not None and count != shape.tokens:
            found = problem(replace(shape, tokens=count))
    if found is not None:
        fail(found)


def check_whole_budget(source: str, sentence: str, what: str, advice: str, *,
                       all_layers: bool = False) -> None:
    """A `--hf` run that loads the whole model (`heads`, `--context`): refused, before torch
    or any weight, when its estimate does not fit in memory (one line, exit 2)."""
    from .. import budget
    from ..load.hf_error import HfError
    from ..load.hf_files import exact_tokens, run_shape

    try:
        shape = run_shape(source, exact_tokens(source, sentence), sentence, None)
    except HfError as error:
        fail(str(error))
    if shape is None:
        return
    layers = len(shape.block_elements) if all_layers and shape.block_elements else 1
    found = budget.hf_whole_problem(what, shape, budget.available_memory(), advice, layers)
    if found is not None:
        fail(found)


def _out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    # torch reports a failed CPU allocation as a RuntimeError ("DefaultCPUAllocator: can't
    # allocate memory", "not enough memory"); there is no narrower public type for it.
    text = str(error)
    return isinstance(error, RuntimeError) and ("allocate memory" in text
                                                or "not enough memory" in text)
