"""`mha-tui serve`: the step-through app in a browser tab, served by textual-serve.

Each browser tab that opens the page starts one `mha-tui explain ...` process with the
arguments `serve` was given; textual-serve carries its screen and keys over a websocket
(`MHA_TUI_SERVE=1` in that process's environment tells `explain` to run the app, though its
stdout is a pipe). Everything the page loads comes from this server: textual-serve's own
static files (xterm.js in textual.js, its CSS, the Roboto Mono font files) and our copy of
its page (`web/app_index.html`), whose only change is that the font is no longer fetched
from Google Fonts. Loopback only unless `--host` says otherwise.

Never import torch here; textual-serve (aiohttp) is imported only when serving.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

SERVE_ENV = "MHA_TUI_SERVE"  # set for the app processes textual-serve starts
TEMPLATES = Path(__file__).parent / "web"


class ServeError(Exception):
    """serve cannot start: one line."""


def command_line(explain_args: Sequence[str]) -> str:
    """The shell command textual-serve runs for each tab: this Python, `-m mha_tui explain`."""
    return shlex.join([sys.executable, "-m", "mha_tui", "explain", *explain_args])


def url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def make_server(explain_args: Sequence[str], *, host: str, port: int,
                say: Callable[[str], None]) -> object:
    """A textual-serve Server for the app with these explain arguments (not yet running)."""
    try:
        from textual_serve.server import Server
    except ImportError as error:
        raise ServeError('serve needs textual-serve: pip install "mha-tui[serve]"') from error

    class AppServer(Server):  # type: ignore[misc]
        """textual-serve's Server with our page, and our one line instead of its banner."""

        async def on_startup(self, app: object) -> None:
            say(f"mha-tui: serving the app on {self.public_url}  (Ctrl+C stops it)")

        def initialize_logging(self) -> None:  # warnings only: no line per request
            import logging

            logging.basicConfig(level=logging.WARNING, format="mha-tui serve: %(message)s")

    os.environ[SERVE_ENV] = "1"  # inherited by every app process textual-serve starts
    return AppServer(command_line(explain_args), host=host, port=port, title="mha-tui",
                     public_url=url(host, port), templates_path=TEMPLATES)


def available() -> bool:
    """textual-serve is installed (the [serve] extra)."""
    from importlib.util import find_spec

    return find_spec("textual_serve") is not None


def check_address(host: str, port: int) -> None:
    """Refuse, before serving, an address this machine cannot listen on (a port in use, a
    host that is not one of its addresses): textual-serve would only say so after its start."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
            probe.bind(address)
    except OSError as error:
        raise ServeError(f"cannot listen on {url(host, port)}: {error.strerror or error}") from None


def serve(explain_args: Sequence[str], *, host: str, port: int,
          say: Callable[[str], None]) -> None:
    """Serve until interrupted (Ctrl+C, SIGTERM)."""
    check_address(host, port)
    server = make_server(explain_args, host=host, port=port, say=say)
    try:
        server.serve()  # type: ignore[attr-defined]
    except OSError as error:  # the port is taken, the host is not this machine's
        raise ServeError(f"cannot listen on {url(host, port)}: {error.strerror or error}") from None
