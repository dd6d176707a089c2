"""ARENA / TransformerLens-style attention (issue 27, in part): a W_O of shape
(h, d_h, C) read by einsum is the module's output projection; `check` never says the
module lacks one. The head-axis weights are found by role (as (h*d_h, C) and (C, h*d_h) layers) and judged
end to end; the projections and W_O are project / w_o stages. (The separate bias adds,
`+ self.b_Q`, are still shown as plain `op` stages.)"""

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
    assert "concat @ W_O" in row["checked"] and row["ok"] is True, row
    assert row["line"] in (line, line + 1, line + 2), (row, line)


TL = Path(__file__).parent / "fixtures" / "transformerlens_attn.py"


def _check(target: str) -> dict:
    result = CliRunner().invoke(app, ["check", target, "--format", "json", "-H", "2", "-C", "8"])
    return json.loads(result.stdout)


@pytest.mark.parametrize("target", [f"{FIXTURE}:Attn", f"{TL}:TLAttention"])
def test_head_axis_weights_are_found_by_role_and_judged_equivalent(target: str) -> None:
    # W_Q (h, C, d_h) with b_Q (h, d_h) and W_O (h, d_h, C) with b_O, read by einsum: the
    # reference gets them as (h*d_h, C) and (C, h*d_h) layers (TL's biases are not zero).
    verdict = _check(target)
    (row,) = [row for row in verdict["stages"] if row["kind"] == "end_to_end"]
    assert row["ok"] is True and "head-axis weight" in row["checked"], row
    assert verdict["equivalent"] is True, verdict


def test_a_head_axis_module_without_its_scale_is_named() -> None:
    verdict = _check(f"{TL}:NoScale")
    assert verdict["equivalent"] is False
    assert verdict["diagnosis"]["kind"] == "not_scaled", verdict["diagnosis"]
    (row,) = [row for row in verdict["stages"] if row["kind"] == "end_to_end"]
    assert row["ok"] is False, row


def test_explain_names_the_head_axis_projections_and_w_o_as_stages() -> None:
    result = CliRunner().invoke(app, ["explain", "I love AI", "--module", f"{TL}:TLAttention",
                                      "-H", "2", "-C", "8", "--dump", "-", "--format", "json"])
    stages = json.loads(result.stdout)["stages"]
    kinds = [s["kind"] for s in stages]
    assert kinds.count("project") == 1 and kinds.count("w_o") == 1, kinds
    (project,) = [s for s in stages if s["kind"] == "project"]
    weight = project["tensors"]["W_Q"]  # (h, C, d_h), shown as the (h*d_h, C) layer it is
    assert weight["dims"] == ["C_out", "C_in"] and weight["shape"] == [8, 8], weight["dims"]
