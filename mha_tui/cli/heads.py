"""`mha-tui heads SENTENCE`: every layer x head of a whole model as a small heatmap with its
label, in the app or a transcript; `--ablate` removes a head and runs the model again.
"""

from __future__ import annotations

from typing import Any

from ..config import TRAINED_MODEL_NAMES
from ..records.request import Checkpoint, Request
from . import options
from .options import Ablation, dump_format
from .process import exit_now, fail, interactive, open_app


def heads(
    sentence: options.WholeModelSentence,
    model: options.WholeModel = None,
    hf_source: options.HfWhole = None,
    repeat: options.RepeatHeads = False,
    ablate: options.Ablate = None,
    ablate_with: options.AblateWith = Ablation.zero,
    dump: options.DumpHeads = None,
    fmt: options.FormatHeads = None,
    width: options.WidthHeads = 100,
    color: options.Color = False,
    ascii_only: options.AsciiHeads = False,
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
    fmt = dump_format(fmt, dump, only=False, stage=None)
    sentence = f"{sentence} {sentence}" if repeat else sentence
    from ..roles import parse_head

    try:
        head = parse_head(ablate) if ablate is not None else None
    except ValueError as error:
        fail(str(error))
    destination = None
    if dump is not None:
        from ..write.destination import DumpError, resolve

        try:
            destination = resolve(dump)
        except DumpError as error:
            fail(str(error), error.code)
    request = Request(checkpoint=Checkpoint(model or hf_source or "", sentence,
                                            trained=model is not None))
    from ..load.hf_error import HfError
    from ..pipeline import whole
    from .transcript import check_whole_budget

    try:
        whole.refused_early(request)
        if hf_source is not None:  # every layer and the predictions: loaded whole (docs/heads.md)
            check_whole_budget(hf_source, sentence, f"heads --hf {hf_source}",
                               "use a smaller model, or explain one layer streamed: "
                               f"mha-tui explain SENTENCE --hf {hf_source} --layer L",
                               all_layers=True)
        session = whole.session(request, ascii_only=ascii_only)
        view = whole.model_view(session, ascii_only=ascii_only, ablate=head,
                                method=ablate_with.value)
    except HfError as error:
        fail(str(error))
    from ..render.options import RenderOptions

    opts = RenderOptions(ascii=ascii_only)
    if interactive(dump):
        _heads_app(view, session, opts, head)
        return
    from ..write import FORMATS
    from ..write.destination import DumpError, opened, resolve

    text = FORMATS[fmt.value].heads(view, opts, width, color, head)  # type: ignore[misc]
    try:
        with opened(destination or resolve("-")) as out:
            out.write(text.encode("utf-8"))
    except DumpError as error:
        fail(str(error), error.code)
    except BrokenPipeError:
        exit_now(0)
    exit_now(0)


def _heads_app(view: Any, session: Any, opts: Any, selected: tuple[int, int] | None) -> None:
    """The heads screen; enter on a head opens that layer's walk-through at that head, and
    quitting the walk-through comes back to the heads."""
    from ..pipeline import whole

    def ablate(layer: int, head: int, method: str) -> Any:
        return whole.model_view(session, ascii_only=opts.ascii, ablate=(layer, head),
                                method=method)

    def app() -> None:
        from ..app.heads import HeadsApp
        from ..app.run import run_app

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

    open_app(app)
