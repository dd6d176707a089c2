"""Shared fixtures: a clean environment for the CLI and a cached default trace."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache

import pytest

from mha_tui.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Colour and terminal settings of whoever runs the tests must not leak into them.
    for name in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES", "TEXTUAL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("_TYPER_FORCE_DISABLE_TERMINAL", "1")


@cache
def default_trace():
    from mha_tui.pipeline import run_trace

    return run_trace(Config("I love AI !"))


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            input_bytes: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """The real command, as a user runs it (stdout is a pipe, not a terminal)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "mha_tui", *args], capture_output=True,
                          env=full_env, timeout=timeout, cwd=ROOT, input=input_bytes)
