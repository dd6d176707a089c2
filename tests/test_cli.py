"""The command line: help and version without torch, one-line refusals, both entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mha_tui import __version__
from mha_tui.cli import app

from .conftest import ROOT, run_cli


def test_version_and_help_with_typer_runner() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"mha-tui {__version__}\n"
    result = runner.invoke(app, ["explain", "--help"])
    assert result.exit_code == 0
    for flag in ("--heads", "--embed-dim", "--seed", "--no-causal", "--max-seq-len", "--dump",
                 "--format", "--width", "--full", "--color", "--ascii", "--stage"):
        assert flag in result.output
    assert "\x1b[" not in result.output


def test_no_arguments_prints_help() -> None:
    result = run_cli()
    assert result.returncode == 0 and result.stderr == b""
    assert b"explain" in result.stdout and b"Usage" in result.stdout


def test_python_dash_m_and_console_script_agree() -> None:
    module = run_cli("--version")
    assert module.returncode == 0 and module.stdout.decode() == f"mha-tui {__version__}\n"
    script = Path(sys.executable).parent / "mha-tui"
    if script.exists():
        assert subprocess.run([str(script), "--version"], capture_output=True).stdout == module.stdout


def _modules_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    return set(out.stdout.split())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["explain", "--help"]])
def test_help_and_version_import_neither_torch_nor_textual(argv: list[str]) -> None:
    code = (f"sys.argv = ['mha-tui', *{argv!r}]\nfrom mha_tui.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    loaded = _modules_after(code)
    assert "mha_tui.cli" in loaded
    assert "torch" not in loaded and "textual" not in loaded


def test_transcript_path_never_imports_textual() -> None:
    code = ("from mha_tui.config import Config\nfrom mha_tui.tracing import run_trace\n"
            "from mha_tui.dump import to_text, to_json\nfrom mha_tui.render import RenderOptions\n"
            "t = run_trace(Config('I love AI !'))\nto_text(t, RenderOptions()); to_json(t)")
    loaded = _modules_after(code)
    assert "torch" in loaded and "rich" in loaded
    assert "textual" not in loaded and "typer" not in loaded


def test_not_a_terminal_prints_the_transcript() -> None:
    result = run_cli("explain", "I love AI !")
    assert result.returncode == 0 and result.stderr == b""
    assert result.stdout == (Path(ROOT) / "tests/golden/default.txt").read_bytes()


BAD = [
    (["explain", "I love AI !", "--heads", "3"], "valid head counts for 4: 1, 2, 4"),
    (["explain", "", "--heads", "2"], "the sentence is empty"),
    (["explain", "   \t  "], "the sentence is empty"),
    (["explain", "a b c d e", "--max-seq-len", "4"], "has 5 tokens but --max-seq-len is 4"),
    (["explain", "a", "--heads", "0"], "--heads must be a positive whole number, got 0"),
    (["explain", "a", "--heads", "-2"], "--heads must be a positive whole number, got -2"),
    (["explain", "a", "--embed-dim", "0"], "--embed-dim must be a positive whole number"),
    (["explain", "a", "--embed-dim", "100000"], "above this tool's ceiling of 4096"),
    (["explain", "a", "--max-seq-len", "0"], "--max-seq-len must be a positive whole number"),
    (["explain", "a", "--max-seq-len", "99999"], "above this tool's ceiling of 4096"),
    (["explain", "a", "--heads", "8", "--embed-dim", "4"], "valid head counts for 4: 1, 2, 4"),
    (["explain", "a", "--seed", "-1"], "--seed must be between 0 and"),
    (["explain", "a", "--heads", "two"], "Invalid value for '--heads'"),
    (["explain", "a", "--format", "xml"], "'xml' is not one of"),
    (["explain", "a", "--stage", "nope"], "choose one of: embed, project, view, transpose"),
    (["explain", "a", "--width", "5"], "--width must be between 40 and 400"),
    (["explain", "a", "--bogus"], "No such option: --bogus"),
    (["explain"], "Missing argument 'sentence'"),
    (["explain", "a", "--dump", "/"], "is a directory"),
    (["explain", "a", "--dump", "/nonexistent-dir/x.txt"], "does not exist"),
    (["explain", "a", "--dump", "/proc/version"], "not writable"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a[1:]) or "none" for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(argv: list[str], message: str) -> None:
    result = run_cli(*argv)
    err = result.stderr.decode("utf-8")
    assert result.returncode == 2, err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("mha-tui: error: ")
    assert "Traceback" not in err and result.stdout == b""


def test_the_app_paints_without_torch_or_numpy_loaded() -> None:
    """Everything the first frame needs is importable without torch (and NumPy)."""
    loaded = _modules_after("import mha_tui.cli, mha_tui.app")
    assert "textual" in loaded
    assert "torch" not in loaded and "numpy" not in loaded and "pygments" not in loaded
