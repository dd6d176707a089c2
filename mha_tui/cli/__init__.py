"""`mha-tui`: the Typer app, its commands, and the console script's entry point (`main`).

The cli only parses: each command (a module here: explain, check, heads, serve) turns its
arguments, declared once in `options`, into a Request and hands it to `pipeline` and `write`,
then turns the result into an exit code. `process` holds what concerns the process itself
(one-line refusals, exit codes, closed standard streams, the app's opening).

Imports nothing heavy at module level: `--help` and `--version` must not pay for torch or
textual. Every refusal is one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

# Private, and no public way exists: typer >= 0.20 vendors click and does not re-export
# NoArgsIsHelpError, the only sign that a bare `mha-tui` asked for the help (exit 0) rather
# than made a usage error (exit 2).
from typer._click.exceptions import NoArgsIsHelpError

from . import check, explain, heads, options, process, serve
from .process import exit_now, fail

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


@app.callback()
def main_callback(version: options.Version = False) -> None:
    """mha-tui: see what every line of a multi-head attention module does to your numbers."""


app.command(cls=_PlainUsage)(explain.explain)
app.command(cls=_PlainUsage)(heads.heads)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
            options_metavar="[--host HOST] [--port PORT] SENTENCE [EXPLAIN OPTIONS]")(serve.serve)
app.command()(check.check)


def main() -> None:
    """Console-script entry point: usage errors become one line, never a traceback."""
    process.STANDALONE = True
    try:
        _main()
    finally:  # a test that calls main() leaves the process as it found it
        process.STANDALONE = False


def _main() -> None:
    process.guard_standard_streams()
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
        exit_now(code)
    raise SystemExit(code)
