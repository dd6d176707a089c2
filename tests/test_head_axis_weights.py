"""ARENA / TransformerLens-style attention (issue 27, in part): a W_O of shape
(h, d_h, C) read by einsum is the module's output projection; `check` never says the
module lacks one. (Judging these weights by role, and naming the head-axis projections as
stages, is still to come: the row says so.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("einops")

from mha_tui.cli import app

FIXTURE = Path(__file__).parent / "fixtures" / "arena_attn.py"


def test_a_head_axis_w_o_is_never_said_to_be_missing() -> None:
    result = CliRunner().invoke(app, ["check", f"{FIXTURE}:Attn", "--format", "json",
                                      "-H", "2", "-C", "8"])
    verdict = json.loads(result.stdout)
    assert not [d for d in verdict["differences"] if "no output projection" in d], verdict
    (row,) = [row for row in verdict["stages"] if row["kind"] == "w_o"]
    line = next(i + 1 for i, text in enumerate(FIXTURE.read_text().splitlines())
                if "attn_out = einops.einsum(" in text)
    assert "W_O (2, 4, 8)" in row["checked"] and row["ok"] is None, row
    assert row["line"] in (line, line + 1, line + 2), (row, line)
