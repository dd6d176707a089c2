"""`explain --model/--module/--init/--weights` from the command line: choices in --help, and
every bad input refused with one line on stderr, exit code 2, no traceback, no file."""

from __future__ import annotations

import os
import pickle
import re
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.config import MODEL_NAMES, NUMPY_MODEL_NAMES, TRAINED_MODEL_NAMES

from .conftest import run_cli

GOOD = """
    import torch
    from torch import nn

    class Attn(nn.Module):
        def __init__(self, d_model, n_heads):
            super().__init__()
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x):
            return self.proj(x)
"""


def test_help_lists_the_new_options_and_the_models() -> None:
    result = CliRunner().invoke(app, ["explain", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for flag in ("--model", "--module", "--init", "--weights", "FILE.py:CLASS", "NAME=VALUE"):
        assert flag in result.output
    names = MODEL_NAMES + NUMPY_MODEL_NAMES + TRAINED_MODEL_NAMES
    assert "<" + "|".join(names) + ">" in " ".join(result.output.split())


class Evil:
    """A pickle that, if unpickled the unsafe way, creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _files(tmp: Path) -> dict[str, str]:
    def put(name: str, text: str) -> str:
        (tmp / name).write_text(textwrap.dedent(text))
        return str(tmp / name)

    good = put("good.py", GOOD)
    torch.save({"proj.weight": torch.zeros(3, 3), "proj.bias": torch.zeros(3)}, tmp / "small.pt")
    torch.save({"proj.weight": Evil(tmp / "pwned")}, tmp / "evil.pt")
    (tmp / "evil.pkl").write_bytes(pickle.dumps({"proj.weight": Evil(tmp / "pwned")}, protocol=2))
    return {
        "good": good,
        "syntax": put("syntax.py", "from torch import nn\nclass Attn(nn.Module)\n    pass\n"),
        "not_module": put("plain.py", "class Attn:\n    pass\n\ndef helper():\n    pass\n"),
        "unfilled": put("unfilled.py", GOOD.replace("d_model, n_heads", "d_model, n_heads, vocab")),
        "dict_out": put("dict_out.py", GOOD.replace("return self.proj(x)", "return {'out': x}")),
        "import_raises": put("import_raises.py", "import torch\n\nraise RuntimeError('no GPU here')\n"),
        "init_raises": put("init_raises.py", GOOD.replace("super().__init__()",
                                                          "super().__init__()\n            1 / 0")),
        "small_pt": str(tmp / "small.pt"),
        "evil_pt": str(tmp / "evil.pt"),
        "evil_pkl": str(tmp / "evil.pkl"),
    }


# (arguments built from the files above, what the one line must say)
BAD: list[tuple[str, list[str], str]] = [
    ("missing file", ["--module", "{tmp}/nope.py:Attn"], r"--module \S*nope\.py does not exist"),
    ("syntax error", ["--module", "{syntax}:Attn"], r"syntax\.py, line 2: SyntaxError: "),
    ("missing class", ["--module", "{good}:MHA"], r"good\.py has no 'MHA'; nn\.Module classes there: Attn"),
    ("not an nn.Module", ["--module", "{not_module}:Attn"],
     r"plain\.py:Attn is neither an nn\.Module subclass nor a class with a forward\(\) method"),
    ("a function", ["--module", "{not_module}:helper"], r"plain\.py:helper is a function, not a"),
    ("no such package", ["--module", "no_such_pkg.attn:Attn"], r"no module named 'no_such_pkg\.attn'"),
    ("bad --module form", ["--module", "good.py"], r"--module takes FILE\.py:Class or package\.module:Class"),
    ("unfilled argument", ["--module", "{unfilled}:Attn"],
     r"Attn\(\) needs a value for 'vocab'.*--init vocab=VALUE"),
    ("unknown --init", ["--module", "{good}:Attn", "--init", "colour=1"],
     r"--init colour: Attn\(\) has no parameter 'colour'"),
    ("bad --init syntax", ["--module", "{good}:Attn", "--init", "qkv_bias"],
     r"--init 'qkv_bias' is not NAME=VALUE"),
    ("bad --init literal", ["--model", "raschka", "--init", "qkv_bias=yes"],
     r"'yes' is not a Python literal"),
    ("wrong-shaped weights", ["--module", "{good}:Attn", "--weights", "{small_pt}"],
     r"'proj\.weight' is \(3, 3\) in the file but \(4, 4\) in Attn"),
    ("unsafe weights (torch.save)", ["--module", "{good}:Attn", "--weights", "{evil_pt}"],
     r"evil\.pt would run code when loaded \(it calls posix\.system\); refused"),
    ("unsafe weights (pickle)", ["--model", "course", "--weights", "{evil_pkl}"],
     r"evil\.pkl would run code when loaded \(it calls posix\.system\); refused"),
    ("missing weights", ["--weights", "{tmp}/none.pt"], r"--weights \S*none\.pt does not exist"),
    ("forward returns a dict", ["--module", "{dict_out}:Attn"],
     r"Attn\.forward returned a dict, not a tensor"),
    ("import-time exception", ["--module", "{import_raises}:Attn"],
     r"import_raises\.py, line 3: RuntimeError: no GPU here \(while importing"),
    ("construction-time exception", ["--module", "{init_raises}:Attn"],
     r"init_raises\.py, line 8: ZeroDivisionError: division by zero "
     r"\(while building Attn\(d_model=4, n_heads=2\)\)"),
    ("--model and --module", ["--model", "course", "--module", "{good}:Attn"], r"give one of them"),
    ("unknown --model", ["--model", "gpt5"], r"gpt5"),
    ("--no-causal with a built-in mask", ["--model", "many-eyes", "--no-causal"],
     r"--model many-eyes always applies its own causal mask"),
]


def _main(argv: list[str], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The console script's entry point, in this process (the table below is long)."""
    import sys

    from mha_tui.cli import main

    saved = sys.argv
    sys.argv = ["mha-tui", *argv]
    try:
        main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    else:
        code = 0
    finally:
        sys.argv = saved
    out, err = capfd.readouterr()
    return code, out, err


@pytest.mark.parametrize(("what", "args", "message"), BAD, ids=[case[0] for case in BAD])
def test_bad_module_input_is_one_line_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                             what: str, args: list[str], message: str) -> None:
    files = _files(tmp_path)
    argv = [a.format(tmp=tmp_path, **files) for a in args]
    out = tmp_path / "out.txt"
    code, stdout, stderr = _main(["explain", "I love AI !", *argv, "--dump", str(out)], capfd)
    assert code == 2, stderr
    assert stderr.startswith("mha-tui: error: ") and stderr.endswith("\n")
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert re.search(message, stderr), stderr
    assert stdout == "" and not out.exists()
    assert not (tmp_path / "pwned").exists()  # nothing in a weights file ever ran


@pytest.mark.parametrize("case", ["unsafe weights (torch.save)", "construction-time exception"])
def test_the_real_command_refuses_the_same_way(tmp_path: Path, case: str) -> None:
    """End to end, as a user runs it: a separate process, stdout a pipe."""
    _, args, message = next(c for c in BAD if c[0] == case)
    argv = [a.format(tmp=tmp_path, **_files(tmp_path)) for a in args]
    result = run_cli("explain", "I love AI !", *argv, "--dump", "-")
    stderr = result.stderr.decode()
    assert result.returncode == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr
    assert re.search(message, stderr) and result.stdout == b""
    assert not (tmp_path / "pwned").exists()


def test_a_hostile_file_name_is_shown_escaped(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """User text on the terminal: an ESC in a file name is shown, never sent."""
    name = str(tmp_path / "evil\x1b]0;owned\x07\u202e.py")
    code, _, stderr = _main(["explain", "I love AI !", "--module", f"{name}:Attn", "--dump", "-"], capfd)
    assert code == 2 and stderr.count("\n") == 1
    assert "\x1b" not in stderr and "\x07" not in stderr and "\u202e" not in stderr
    assert "evil\\x1b]0;owned\\x07\\u202e.py does not exist" in stderr
