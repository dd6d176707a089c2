"""Running the app for the CLI: the terminal made fit for it, ASCII when the streams cannot
encode its glyphs, and the app for one run (`explain_app`, `run_app`).
Never import typer, torch or the CLI here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..records.request import Request
from .explain import ExplainApp
from .loading import load_trace

if TYPE_CHECKING:
    from ..load.modules import LoadedTorch
    from ..load.numpy_modules import LoadedNumpy


def prepare_terminal() -> str | None:
    """Make the process fit to run the app; returns why not, in one line, or None.

    - COLUMNS/LINES exported in the shell would lock the app's size: Textual asks
      shutil.get_terminal_size, which prefers them to the terminal's real size, on start
      and on every resize. The app follows the terminal, so they go.
    - Textual draws on stderr (its Linux driver writes frames there). With stderr
      redirected (2>log) the frames would fill the file and the terminal stay blank: the
      CLI chose the app because stdout is a terminal, so draw there.
    - Textual reads keys from stdin. When stdin is a pipe or a file, the keys typed in the
      terminal (even q) would never arrive: read them from the controlling terminal
      instead, as less and fzf do. No controlling terminal: refuse.
    """
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    if not os.isatty(0):
        try:
            tty = os.open("/dev/tty", os.O_RDWR)
        except OSError as error:
            return (f"the app reads keys from the terminal, and there is none "
                    f"({error.strerror}); use --dump to write a transcript")
        os.dup2(tty, 0)
        os.close(tty)
    if os.isatty(1) and not os.isatty(2):  # after any refusal: that goes to the real stderr
        os.dup2(1, 2)
    return None


def wants_ascii() -> bool:
    """True when the terminal streams cannot encode the app's glyphs (PYTHONIOENCODING=ascii).

    Textual writes its frames to stderr; the CLI chose the app because stdout is a terminal."""
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            "→━▇".encode(getattr(stream, "encoding", None) or "utf-8")
        except (UnicodeEncodeError, LookupError):
            return True
    return False


def explain_app(config: Config, *, start: str | None = None, ascii_only: bool = False,
                loaded: LoadedTorch | LoadedNumpy | None = None,
                build: Callable[[Config], LoadedTorch | LoadedNumpy] | None = None,
                request: Request | None = None, **options: Any) -> ExplainApp:
    """The app for one run, not started yet.

    request: the Request the CLI built (None: the default module), run again with each
    input the app is given; loaded: its module, built by the CLI; build: builds it instead,
    in the app's loading thread, so that the app is on screen while a learner's module
    imports and its forward runs (it may never return); options: ExplainApp's, e.g. loader
    and checker for --check, running, refusals."""
    if build is not None:
        options.setdefault("loader", lambda c: load_trace(c, loaded=build(c), request=request))
    options.setdefault("loader", partial(load_trace, loaded=loaded, request=request))
    return ExplainApp(config, start=start, ascii_only=ascii_only or wants_ascii(),
                      batched=getattr(loaded, "batched", True), **options)  # NumPy: (T, C)


def run_app(config: Config, **options: Any) -> str | None:
    """Run the app in this terminal (call prepare_terminal first); returns a refusal of the
    input (one line, for exit code 2), or None. options: explain_app's."""
    app = explain_app(config, **options)
    app.run()
    return app.refusal
