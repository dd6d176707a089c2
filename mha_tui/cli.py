"""`mha-tui`: arguments, errors, and the choice between a transcript and the app.

Imports nothing heavy at module level: `--help` and `--version` must not pay for torch or
textual. Every refusal is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from typer._click.exceptions import NoArgsIsHelpError

from . import __version__
from .config import MAX_EMBED_DIM, MAX_SEQ_LEN, Config, ConfigError
from .stages import STAGE_IDS

app = typer.Typer(
    name="mha-tui",
    help="Step through a real PyTorch multi-head attention forward pass in the terminal.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Format(StrEnum):
    text = "text"
    json = "json"


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2."""
    sys.stderr.write(f"mha-tui: error: {message}\n")
    raise SystemExit(2)


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


@app.command()
def explain(
    sentence: Annotated[str, typer.Argument(help="The sentence; tokens are split on whitespace.")],
    heads: Annotated[int, typer.Option("--heads", "-H", help="Number of heads h; must divide --embed-dim.")] = 2,
    embed_dim: Annotated[int, typer.Option("--embed-dim", "-C", help=f"Embedding width C (at most {MAX_EMBED_DIM}).")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="torch.manual_seed before building the modules.")] = 0,
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Apply the causal mask.")] = True,
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", help=f"Longest sentence the module accepts (at most {MAX_SEQ_LEN}).")] = 64,
    dump: Annotated[Path | None, typer.Option("--dump", help="Write the transcript to PATH ('-' for stdout) instead of opening the app.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Transcript format.", case_sensitive=False)] = Format.text,
    width: Annotated[int, typer.Option("--width", help="Text transcript width in columns (40 to 400).")] = 100,
    full: Annotated[bool, typer.Option("--full", help="Never elide rows, columns or heads in the text transcript.")] = False,
    color: Annotated[bool, typer.Option("--color", help="Keep colours (ANSI codes) in the text transcript.")] = False,
    ascii_only: Annotated[bool, typer.Option("--ascii", help="Draw with plain ASCII only.")] = False,
    stage: Annotated[str, typer.Option("--stage", help="Stage to start the app at.")] = STAGE_IDS[0],
) -> None:
    """Explain one forward pass: open the step-through app, or write a transcript with --dump."""
    if sentence != sentence.encode("utf-8", "surrogateescape").decode("utf-8", "replace"):
        fail("the sentence is not valid UTF-8 text")
    try:
        config = Config(sentence, embed_dim=embed_dim, num_heads=heads, seed=seed,
                        causal=causal, max_seq_len=max_seq_len)
    except ConfigError as error:
        fail(str(error))
    if stage not in STAGE_IDS:
        fail(f"--stage {stage!r} is not a stage; choose one of: {', '.join(STAGE_IDS)}")
    if not 40 <= width <= 400:
        fail(f"--width must be between 40 and 400, got {width}")
    target = None if dump is None or str(dump) == "-" else dump
    if target is not None:
        from .dump import check_writable

        problem = check_writable(target)
        if problem:
            fail(problem)

    if dump is None and sys.stdout.isatty():
        from .app import prepare_terminal, run_app

        if problem := prepare_terminal():  # keys from the terminal; its real size
            fail(problem)
        run_app(config, start=stage, ascii_only=ascii_only)
        return
    _write_transcript(config, target, fmt, width=width, full=full, color=color,
                      ascii_only=ascii_only)


def _write_transcript(config: Config, target: Path | None, fmt: Format, *, width: int,
                      full: bool, color: bool, ascii_only: bool) -> None:
    from .dump import to_json, to_text, write_atomic
    from .render import RenderOptions
    from .tracing import run_trace

    trace = run_trace(config)
    if fmt is Format.json:
        content = to_json(trace)
    else:
        content = to_text(trace, RenderOptions(full=full, ascii=ascii_only), width=width,
                          color=color)
    if target is None:
        # UTF-8 whatever the locale says: the transcript's bytes do not depend on LANG.
        sys.stdout.buffer.write(content.encode("utf-8"))
    else:
        try:
            write_atomic(target, content)
        except OSError as error:
            fail(f"could not write --dump {target}: {error.strerror or error}")
    _exit_now(1 if trace.failed else 0)  # the module's forward raised: the transcript ends there


def _exit_now(code: int = 0) -> NoReturn:
    """Done and flushed: skip the interpreter's teardown of torch (about 0.5 s here).

    Everything the run promised is on disk or in the pipe; teardown would only free memory
    the process is about to give back anyway.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader left early (| head): nothing more to deliver
        pass
    os._exit(code)


def main() -> None:
    """Console-script entry point: usage errors become one line, never a traceback."""
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
    raise SystemExit(code if isinstance(code, int) else 0)
