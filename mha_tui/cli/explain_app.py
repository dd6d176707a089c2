"""`explain` in the app: the module checked (`--check`) or compared (`--against`) stage by
stage, built and run in the app's loading thread from the Request the command made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from .. import pipeline
from ..config import Config, Source, parse_module_ref
from ..records.request import Request
from ..stages import STAGE_IDS
from .process import fail, open_app

if TYPE_CHECKING:
    from ..judge import Verdict
    from ..load.modules import LoadedTorch
    from ..load.numpy_modules import LoadedNumpy
    from ..records import Trace


def open_explained(request: Request, *, stage: str | None, ascii_only: bool, quiz: bool,
                   preflight: bool) -> None:
    """explain in a terminal (or a browser tab): the step-through app. The default module on
    one sentence needs no building before the app opens; any other is built in the app's
    loading thread, and, for serve's check (`preflight`), once here first."""
    from ..load.learner import LoadError

    config, source = request.config, request.source
    plain = source.is_default and not config.cross and not config.batch and not request.steps
    if preflight and not plain:  # serve checks the input before the app
        try:
            pipeline.load(request)
        except LoadError as error:
            fail(str(error))

    def app() -> None:
        # The module is built in the app's loading thread: the app is on screen (q
        # quits) while a learner's file imports and its forward runs, which may never
        # return. Bad --module/--init/--weights end the app: one line here, exit 2.
        from ..app.run import run_app  # after open_app paused the collector

        # --decode: every step traced in the loading thread (pipeline.traced)
        decoding = {"loader": partial(decoded_for, request)} if request.steps else {}
        refusal = run_app(config, start=stage or STAGE_IDS[0], ascii_only=ascii_only,
                          build=None if plain or request.steps else partial(load_for, request),
                          running=whose_forward(source), refusals=(LoadError,),
                          quiz=quiz, request=request, **decoding)
        if refusal is not None:
            fail(refusal)

    open_app(app, preflight=preflight)


def open_compared(request: Request, *, ascii_only: bool, preflight: bool) -> None:
    """explain --against in a terminal: the comparison app, both modules built and run in
    its loading thread (bad input ends the app: one line, exit 2)."""
    from ..judge.roles import RoleCopyError
    from ..load.learner import LoadError
    from ..pipeline import comparison

    if preflight:  # serve checks the input before the app
        try:
            comparison(request)
        except (LoadError, RoleCopyError) as error:
            fail(str(error))

    def app() -> None:
        from ..app.compare import run_compare_app

        refusal = run_compare_app(request.config,
                                  compare=lambda c: comparison(replace(request, config=c)),
                                  ascii_only=ascii_only, running=whose_forward(request.source),
                                  refusals=(LoadError, RoleCopyError))
        if refusal is not None:
            fail(refusal)

    open_app(app, preflight=preflight)


def open_checked(request: Request, *, in_app: bool, stage: str | None, ascii_only: bool,
                 preflight: bool) -> None:
    """explain --check: the app, its rail marked with the verdict of every stage."""
    if not in_app:
        fail("--check marks the stages in the app (a terminal); for a table or JSON run "
             "mha-tui check with the same module")
    from ..load.learner import LoadError
    from ..pipeline import checked

    if preflight:  # serve checks the input before the app
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
        from ..app.run import run_app  # after open_app paused the collector

        refusal = run_app(request.config, start=stage or STAGE_IDS[0], ascii_only=ascii_only,
                          loader=run, checker=lambda trace: judges[-1](trace),
                          running=whose_forward(request.source), refusals=(LoadError,))
        if refusal is not None:
            fail(refusal)

    open_app(app, preflight=preflight)


def load_for(request: Request, config: Config) -> LoadedTorch | LoadedNumpy:
    """The request's module built for the config the app runs (pipeline.load)."""
    return pipeline.load(replace(request, config=config))


def decoded_for(request: Request, config: Config) -> Trace:
    """`--decode N` in the app: every step traced in the loading thread (pipeline.traced)."""
    return pipeline.traced(replace(request, config=config))


def whose_forward(source: Source) -> str:
    """Whose forward the app waits for, in its words: "M.forward from loop.py"."""
    if source.module is not None:
        where, cls, _ = parse_module_ref(source.module)
        return f"{cls}.forward from {where}"
    return f"--model {source.model}'s forward"
