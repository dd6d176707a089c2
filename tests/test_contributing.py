"""CONTRIBUTING.md's map of the house is pyproject's import-linter `layers` contract: the
same layers, in the same order, each with the same packages; and the files it names exist."""

from __future__ import annotations

import re
import sys
import textwrap
import tomllib
import types
from pathlib import Path

import pytest

from .conftest import ROOT

CONTRIBUTING = Path(ROOT, "CONTRIBUTING.md")


def _contract_layers() -> list[str]:
    """The layers contract, top first, each as CONTRIBUTING writes it: `app` | `notebook`."""
    config = tomllib.loads(Path(ROOT, "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers" and "containers" not in c]
    return [re.sub(r"mha_tui\.(\w+)", r"`\1`", layer).replace("|", "\\|") for layer in layers]


def _map_layers() -> list[str]:
    text = CONTRIBUTING.read_text(encoding="utf-8")
    table = text.split("## The map of the house", 1)[1].split("\n\n| layer |", 1)[1]
    rows = [line for line in table.split("\n\n", 1)[0].splitlines()[2:]]
    return [row.split(" | ", 1)[0].removeprefix("| ") for row in rows]


def test_the_map_is_the_layers_contract() -> None:
    assert _map_layers() == _contract_layers()


def test_the_files_and_folders_contributing_names_exist() -> None:
    text = CONTRIBUTING.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:mha_tui|tests|docs|benchmarks)/[\w/.]*|[\w.]+\.(?:toml|txt|md))`", text))
    named |= set(re.findall(r"\]\(([\w/.]+)\)", text))
    assert len(named) >= 5
    made_by_the_examples = {"mha_tui/kinds/clamp.py"}
    assert sorted(n for n in named - made_by_the_examples if not Path(ROOT, n).exists()) == []


def _section(heading: str) -> str:
    text = CONTRIBUTING.read_text(encoding="utf-8")
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def _python_blocks(section: str) -> list[str]:
    return [textwrap.dedent(body) for indent, body in
            re.findall(r"^( *)```python\n(.*?)^\1```", section, re.M | re.S)]


CLAMPED = '''
import math

import torch.nn as nn
import torch.nn.functional as F


class ClampedAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h, self.d_h = num_heads, embed_dim // num_heads
        self.W_Q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_K = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_V = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.W_Q(x).view(B, T, self.h, self.d_h).transpose(1, 2)  # (B, h, T, d_h)
        k = self.W_K(x).view(B, T, self.h, self.d_h).transpose(1, 2)  # (B, h, T, d_h)
        v = self.W_V(x).view(B, T, self.h, self.d_h).transpose(1, 2)  # (B, h, T, d_h)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_h)  # (B, h, T, T)
        scores = scores.clamp(-0.5, 0.5)  # (B, h, T, T)
        weights = F.softmax(scores, dim=-1)  # (B, h, T, T)
        return (weights @ v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
'''


def test_the_stage_kind_example_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CONTRIBUTING's `clamp` kind, its registry row and its rule's test, exactly as written:
    installed for this test only, the rule claims the scores' clamp and not a clamp of x, and
    a module that clamps its scores is explained with a clamp stage where it was an op."""
    from typer.testing import CliRunner

    from mha_tui.cli import app
    from mha_tui.kinds import registry
    from mha_tui.recognise import classify

    (tmp_path / "clamped.py").write_text(CLAMPED)
    argv = ["explain", "I love AI !", "--no-causal", "--module", f"{tmp_path}/clamped.py:ClampedAttention",
            "--dump", "-"]
    before = CliRunner().invoke(app, argv)
    assert before.exit_code == 0, before.output
    assert " clamp  · " not in before.stdout and "scores.clamp(-0.5, 0.5)" in before.stdout

    from mha_tui import stages

    source, title_source, row_source, test_source = _python_blocks(_section("## Add a stage kind"))
    monkeypatch.setattr(stages, "TITLES", {**stages.TITLES, **eval("{" + title_source + "}")})
    kind = types.ModuleType("mha_tui.kinds.clamp")
    kind.__package__ = "mha_tui.kinds"
    monkeypatch.setitem(sys.modules, kind.__name__, kind)
    exec(compile(source, "CONTRIBUTING.md: mha_tui/kinds/clamp.py", "exec"), kind.__dict__)
    row = eval(row_source.strip().rstrip(","), {"Kind": registry.Kind, "clamp": kind})
    at = [r.module for r in registry.KINDS].index(registry.scale)
    kinds = (*registry.KINDS[:at], row, *registry.KINDS[at:])
    monkeypatch.setattr(classify, "RULES", tuple(rule for r in kinds for rule in r.rules))
    monkeypatch.setitem(registry.BY_KIND, row.kind, row)

    from . import test_rules

    namespace = dict(vars(test_rules))
    exec(compile(test_source, "CONTRIBUTING.md: tests/test_rules.py", "exec"), namespace)
    namespace["test_clamp_claims_a_clamp_of_the_scores_only"]()

    after = CliRunner().invoke(app, argv)
    assert after.exit_code == 0, after.output
    assert "7/10 clamp  ·  Clamp the scores: each bounded before softmax" in after.stdout
    assert "clamp changed 5 of 32 scores" in after.stdout


_FORMAT_EXAMPLE = """
import sys
from pathlib import Path

from mha_tui import write

writer, row, test = sys.argv[1:4]
namespace = dict(vars(write))
exec(compile(writer, "CONTRIBUTING.md: mha_tui/write/__init__.py", "exec"), namespace)
added = eval(row.strip().rstrip(","), namespace)
write.FORMATS[added.name] = added
checks = {"Path": Path}
exec(compile(test, "CONTRIBUTING.md: tests/test_pictures.py", "exec"), checks)
checks["test_rst_notes_hold_the_text_transcript"](Path(sys.argv[4]))
print("ran")
"""


def test_the_format_example_runs(tmp_path: Path) -> None:
    """CONTRIBUTING's reStructuredText format, its FORMATS row and its test, exactly as
    written, in a process of their own: the CLI reads its --format choices from the table
    when it is imported, and importing it again inside this one would leave other test
    files holding the old Format."""
    import subprocess

    from mha_tui import write

    writer, row, test = _python_blocks(_section("## Add a format"))
    run = subprocess.run([sys.executable, "-c", _FORMAT_EXAMPLE, writer, row, test, str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ran", run.stderr[-3000:]
    assert "rst" not in write.FORMATS
