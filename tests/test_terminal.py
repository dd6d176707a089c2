"""The real app in a pseudo-terminal: keys from the terminal, its real size, ASCII output.

These start `mha-tui explain` as a user does (a few seconds each: torch is imported), wait
for the app's "values" mark, type keys into the terminal and read what the app wrote.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")


@dataclass
class Session:
    code: int | None  # None: the app did not quit when q was typed
    output: bytes
    stderr: bytes


def _make_controlling_terminal() -> None:
    # In the child, after setsid: the pty on stdout becomes the controlling terminal, as in
    # a login shell, so /dev/tty opens even when stdin is a pipe.
    fcntl.ioctl(1, termios.TIOCSCTTY, 0)


def run_in_pty(*args: str, env: dict[str, str] | None = None, stdin_pipe: bool = False,
               controlling_terminal: bool = True, stderr_pipe: bool = False,
               keys: tuple[bytes, ...] = (),
               size: tuple[int, int] = (100, 32), until: str = "values",
               quit_key: bytes = b"q", cwd: str | Path = ROOT,
               sentence: str = "I love AI !") -> Session:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks"
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("NO_COLOR", "COLUMNS", "LINES", "PYTHONIOENCODING")}
        full_env.update({"MHA_TUI_MARKS": str(marks), "TERM": "xterm-256color", **(env or {})})
        proc = subprocess.Popen(
            [sys.executable, "-m", "mha_tui", "explain", sentence, *args],
            stdin=subprocess.PIPE if stdin_pipe else slave, stdout=slave,
            stderr=subprocess.PIPE if stderr_pipe or not controlling_terminal else slave,
            start_new_session=True, env=full_env, cwd=cwd, close_fds=True,
            preexec_fn=_make_controlling_terminal if controlling_terminal else None)
        os.close(slave)
        output = bytearray()

        def read() -> None:  # a pty nobody reads fills up and blocks the app
            try:
                while chunk := os.read(master, 65536):
                    output.extend(chunk)
            except OSError:
                return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None and not (
                marks.exists() and until in marks.read_text()):
            time.sleep(0.05)
        for key in (*keys, quit_key):
            if proc.poll() is not None:
                break
            time.sleep(0.4)
            os.write(master, key)
        try:
            code: int | None = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        stderr = proc.stderr.read() if proc.stderr else b""
        if proc.stdin:
            proc.stdin.close()
        reader.join(timeout=5)
        os.close(master)
    return Session(code, bytes(output), stderr)


def test_with_stdin_a_pipe_the_app_reads_keys_from_the_terminal() -> None:
    """Issue 8 item 13: with stdin not a terminal the app ignored every key, even q."""
    session = run_in_pty(stdin_pipe=True, keys=(b"G", b"l"))
    assert session.code == 0, session.output[-2000:]
    assert b"1/11" in session.output and b"2/11" in session.output  # `l` went to the next stage


def test_without_a_terminal_to_read_keys_from_it_refuses_in_one_line() -> None:
    session = run_in_pty(stdin_pipe=True, controlling_terminal=False)
    assert session.code == 2
    lines = session.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mha-tui: error: the app reads keys from the terminal")
    assert b"Traceback" not in session.stderr


def test_with_stderr_redirected_the_app_still_draws_on_the_terminal() -> None:
    """Textual draws on stderr: `2>log` filled the log with frames and left the screen blank."""
    session = run_in_pty(stderr_pipe=True, keys=(b"l",))
    assert session.code == 0
    assert b"1/11" in session.output and b"2/11" in session.output
    assert session.stderr == b""


def test_exported_columns_and_lines_do_not_lock_the_size() -> None:
    """Issue 8 item 13: COLUMNS=50 LINES=12 in the environment kept a 100x32 terminal at 50x12."""
    session = run_in_pty(env={"COLUMNS": "50", "LINES": "12"})
    assert session.code == 0
    assert b"Make the terminal larger" not in session.output
    assert b"B=1 T=4 C=4 h=2 d_h=2 seed=0 causal" in session.output  # the 100-column header


@pytest.mark.parametrize("how", ["--ascii", "PYTHONIOENCODING=ascii"])
def test_ascii_means_only_ascii_reaches_the_terminal(how: str) -> None:
    """Issue 8 item 13: the app wrote `\\u2192`-style escapes and non-ASCII heading glyphs."""
    args, env = (("--ascii",), None) if how == "--ascii" else ((), {"PYTHONIOENCODING": "ascii"})
    session = run_in_pty(*args, env=env, keys=(b"G", b"l", b"j", b"?", b"q"))  # the help, closed
    assert session.code == 0
    assert b"2/11" in session.output and b"Keys" in session.output  # it did draw, and the help
    assert max(session.output) < 0x80, sorted({chr(b) for b in session.output if b >= 0x80})
    assert b"\\u2" not in session.output and b"\\x" not in session.output


@pytest.mark.parametrize("quit_key", [b"q", b"\x03"])
def test_a_forward_that_never_returns_shows_the_app_and_quits(quit_key: bytes) -> None:
    """Issue 15, item 4: a forward that never returns left the terminal blank and q was
    echoed as text. The app paints at once, names the forward it is running, and q or
    ctrl+c ends the process while the forward still spins."""
    session = run_in_pty("--module", "tests/fixtures/endless.py:Spinning", until="paint",
                         quit_key=quit_key)
    assert session.code == 0, session.output[-2000:]
    assert b"running Spinning.forward from tests/fixtures/endless.py" in session.output
    assert session.output.count(b"\x1b[?1049l") >= 1  # the terminal given back
