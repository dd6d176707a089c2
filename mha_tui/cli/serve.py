"""`mha-tui serve SENTENCE [EXPLAIN OPTIONS]`: the app in a browser tab, explain's arguments
checked first by running explain up to where the app would open.
"""

from __future__ import annotations

import sys

import typer

from . import options, process
from .process import fail

# explain's options that only shape a transcript: serve shows the app.
_TRANSCRIPT_ONLY = ("--dump", "--format", "--width", "--full", "--color", "--only")


def serve(
    ctx: typer.Context,
    host: options.Host = "127.0.0.1",
    port: options.Port = 8000,
) -> None:
    """Serve the app in a browser tab: SENTENCE and explain's options (--heads, --model, --module, --stage, --hf ...).

    Each tab that opens the URL runs its own app. Nothing is loaded from the internet."""
    args = list(ctx.args)
    for arg in args:
        if arg.split("=", 1)[0] in _TRANSCRIPT_ONLY:
            fail(f"serve shows the app; {arg.split('=', 1)[0]} is for transcripts "
                 "(mha-tui explain --dump)")
    if not 1 <= port <= 65535:
        fail(f"--port must be between 1 and 65535, got {port}")
    if not args:
        fail('serve needs the sentence, as explain does: mha-tui serve "I love AI !"')
    from ..serve import ServeError, available, check_address

    if not available():
        fail('serve needs textual-serve: pip install "mha-tui[serve]"')
    try:
        check_address(host, port)
    except ServeError as error:
        fail(str(error))
    explain_command = ctx.find_root().command.get_command(ctx, "explain")  # type: ignore[attr-defined]
    # explain's own checks and loading, stopping where the app would open
    explain_command.main(args=args, prog_name="mha-tui serve", standalone_mode=False,
                         obj=process.SERVE_CHECK)
    from ..serve import serve as run_server

    def say(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    try:
        run_server(args, host=host, port=port, say=say)
    except ServeError as error:
        fail(str(error), 1)
