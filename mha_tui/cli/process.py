"""The `mha-tui` process around a command: one-line refusals, exit codes, standard streams,
and the app's opening.

Every refusal is one line on stderr and exit code 2 (a usage error) or 1 (a failure at run
time), never a traceback. Two facts about the process are set once, by `main` (the console
script) only, and read here: whether the process is the `mha-tui` command (`STANDALONE`:
then it ends with `os._exit` once everything is flushed, and pauses the garbage collector
while the app starts) and whether its standard output was closed (`STDOUT_CLOSED`). Called
in-process (Typer's CliRunner, a notebook), neither is set and a run ends as a Typer command
does. Imports nothing heavy.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import typer

from .. import collector

if TYPE_CHECKING:
    from ..write.destination import Destination

STDOUT_CLOSED = False
STANDALONE = False  # True once main() runs: the process is the mha-tui command, nothing else
# `ctx.obj` of the explain that `serve` runs to check its arguments (serve.py): explain stops
# where the app would open, every refusal made and the module built.
SERVE_CHECK = "mha-tui serve's check of explain's arguments"


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, exit code 2 (usage) or 1 (a failure at run time)."""
    say(f"mha-tui: error: {message}")
    raise SystemExit(code)


def say(line: str) -> None:
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


def exit_now(code: int = 0) -> NoReturn:
    """Done and flushed: skip the interpreter's teardown of torch (about 0.5 s here).

    Everything the run promised is on disk or in the pipe; teardown would only free memory
    the process is about to give back anyway. Only the command itself (`main`) ends this way:
    called in-process (Typer's CliRunner, a notebook), the run ends as a Typer command does,
    and the caller goes on.
    """
    if not STANDALONE:
        raise typer.Exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader left early (| head): nothing more to deliver
        pass
    os._exit(code)


def where(destination: Destination) -> str:
    """Where a transcript went, in the words of an error: standard output or --dump PATH."""
    return ("standard output" if destination.kind == "fd" and destination.fd == 1
            else f"--dump {destination.shown}")


def preflight(ctx: typer.Context) -> bool:
    """Whether this run is `serve`'s check of explain's arguments (ctx.obj is SERVE_CHECK)."""
    return ctx.obj == SERVE_CHECK


def interactive(dump: str | None, *, preflight: bool = False) -> bool:
    """The app rather than a transcript: no --dump, and stdout a terminal, or the app is
    served to a browser tab (`mha-tui serve` starts it with MHA_TUI_SERVE=1, after checking
    the arguments with `preflight`)."""
    from ..serve import SERVE_ENV

    return dump is None and (sys.stdout.isatty() or os.environ.get(SERVE_ENV) == "1"
                             or preflight)


def open_app(run: Callable[[], None], *, preflight: bool = False) -> None:
    """Run the app; in a terminal, prepare it first (keys, size). Under serve textual-serve
    brings the keys and the size; serve's check of its arguments stops here, every
    refusal having been made and the module built.

    The `mha-tui` process opens the app with the garbage collector paused, until a
    module's code runs or the first forward is done (collector.py: its passes over the
    start-up's objects found nothing to free and delayed the first frame and torch's
    import); `run` imports the app after this. With `preflight` (serve's check of the
    arguments) the app is not opened."""
    from ..serve import SERVE_ENV

    if preflight:
        return
    if STANDALONE:
        collector.pause()
    try:
        if os.environ.get(SERVE_ENV) != "1":
            from ..app.run import prepare_terminal

            if problem := prepare_terminal():  # keys from the terminal; its real size
                fail(problem)
        run()
    finally:
        collector.resume()


def guard_standard_streams() -> None:
    """A closed fd 0, 1 or 2 is held by /dev/null (read-only, so writes fail loudly): the
    next file opened must not become "standard output" by taking its number."""
    global STDOUT_CLOSED
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDONLY)
            if held != fd:  # a lower one was free too; it gets its own turn
                os.dup2(held, fd)
                os.close(held)
            if fd == 1:
                STDOUT_CLOSED = True
                sys.stdout = open(os.devnull, "w")
            elif fd == 2:
                sys.stderr = None  # type: ignore[assignment]
