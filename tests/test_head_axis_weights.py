"""ARENA / TransformerLens-style attention (issue 27, in part): a W_O of shape
(h, d_h, C) read by einsum is the module's output projection; `check` never says the
module lacks one. The head-axis weights are found by role (as (h*d_h, C) and (C, h*d_h) layers) and judged
end to end; the projections and W_O are project / w_o stages, and a bias added apart from
the product (`+ self.b_Q` of shape (h, d_h), `x @ self.W_q + self.b_q`) is part of its
projection's stage: shown, checked, judged and explained there."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("einops")

from mha_tui.cli import app
from mha_tui.config import Config, Source
from mha_tui.judge.roles import roles_of
from mha_tui.pipeline import compared

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


# ------------------------------------------------ biases added apart from the product


RAW = Path(__file__).parent / "fixtures" / "raw_bias_attn.py"


def _explain(target: str, *extra: str) -> CliRunner:
    return CliRunner().invoke(app, ["explain", "I love AI", "--module", target, "-H", "2",
                                    "-C", "8", "--dump", "-", *extra])


@pytest.mark.parametrize("target", [f"{FIXTURE}:Attn", f"{TL}:TLAttention", f"{RAW}:RawBias"])
def test_a_bias_added_apart_is_part_of_its_projection(target: str) -> None:
    # `einsum(...) + self.b_Q` / `x @ self.W_q + self.b_q`: the add belongs to the projection
    # (or W_O) stage, its bias is shown there, and no anonymous `op` stage is left.
    result = _explain(target, "--format", "json")
    stages = json.loads(result.stdout)["stages"]
    assert not [s["kind"] for s in stages if s["kind"] == "op"], [s["title"] for s in stages]
    (project,) = [s for s in stages if s["kind"] == "project"]
    (w_o,) = [s for s in stages if s["kind"] == "w_o"]
    biases = [name for name in project["tensors"] if name.lower().startswith("b_")]
    assert len(biases) == 3, list(project["tensors"])
    assert any(name.lower().startswith("b_o") for name in w_o["tensors"]), list(w_o["tensors"])
    # q as the stage shows it is the product plus the bias, recomputed here from the stage's own
    # tensors (x from the embed stage, W_Q as the (h*d_h, C) layer it shows, b_Q)
    x = np.array(stages[0]["tensors"]["x"]["values"], dtype=np.float64)
    weight = next(t for n, t in project["tensors"].items() if n.lower() == "w_q")
    w = np.array(weight["values"], dtype=np.float64)
    b = np.array(project["tensors"][biases[0]]["values"], dtype=np.float64).reshape(-1)
    q = np.array(project["tensors"]["q"]["values"])
    product = x @ w.T if weight["dims"][0] == "C_out" else x @ w
    assert np.allclose(product.reshape(q.shape) + b.reshape(q.shape[2:] if q.ndim == 4 else -1),
                       q, atol=1e-5)
    checks = [c["label"] for c in project["checks"]]
    assert any("+ b" in c and "with bias" in c for c in checks), checks
    assert "added after the product" in project["explanation"], project["explanation"]


@pytest.mark.parametrize("target", [f"{TL}:TLAttention", f"{RAW}:RawBias"])
def test_the_judge_checks_a_bias_added_apart(target: str) -> None:
    verdict = _check(target)
    rows = {row["kind"]: row for row in verdict["stages"]}
    assert "+ b" in rows["project"]["checked"] and rows["project"]["ok"] is True, rows["project"]
    assert "+ b" in rows["w_o"]["checked"] and rows["w_o"]["ok"] is True, rows["w_o"]
    assert verdict["equivalent"] is True, verdict
    assert any("biases" in d for d in verdict["differences"]), verdict["differences"]


@pytest.mark.parametrize(("target", "cell", "bias"),
                         [(f"{TL}:TLAttention", "project[0, 1, 0, 2]", "b_V[0, 2]"),
                          (f"{RAW}:RawBias", "w_o[0, 1, 2]", "b_o[2]")])
def test_why_adds_the_bias_term(target: str, cell: str, bias: str) -> None:
    result = _explain(target, "--why", cell)
    assert result.exit_code == 0, result.output
    assert f"+ {bias}" in result.stdout and "✓ equal" in result.stdout, result.stdout


def test_why_names_w_os_input_by_its_role() -> None:
    """TransformerLens' W_O reads z (B, T, h, d_h), which the attend stage shows as (B, h, T,
    d_h): --why names it the attend stage's z, says in which layout it is indexed, and never
    falls back to "z (made by einsum at line N)"."""
    result = _explain(f"{TL}:TLAttention", "--why", "w_o[0, 1, 3]")
    assert result.exit_code == 0, result.output
    assert "made by" not in result.stdout, result.stdout
    assert "attend's z[b,q,h,e] × W_O[h,e,d]" in result.stdout, result.stdout
    assert "attend's z is read as this op received it, (1, 3, 2, 4); the attend stage shows it " \
           "as (1, 2, 3, 4)" in " ".join(result.stdout.split()), result.stdout


@pytest.mark.parametrize(("mine", "reference"), [
    (Source(model="mygpt"), f"{TL}:TLAttention"),       # 2-D weights into head-axis ones
    (Source(module=f"{TL}:TLAttention"), "course"),      # head-axis into 2-D (with biases)
    (Source(module=f"{FIXTURE}:Attn"), f"{TL}:TLAttention"),  # head-axis both ways
    (Source(module=f"{TL}:TLAttention"), f"{FIXTURE}:Attn"),
])
def test_against_copies_head_axis_weights_by_role(mine: Source, reference: str) -> None:
    """--against with a TransformerLens / ARENA reference, W_Q (h, C, d_h), b_Q (h, d_h),
    W_O (h, d_h, C): the learner's weights are copied in by role (and back to 2-D layers
    the other way), so the reference's Q, K, V and O are the learner's, row for row, and the
    two outputs are the same numbers."""
    config = Config("I love AI", embed_dim=8, num_heads=2)
    ref = Source(module=reference) if ":" in reference else Source(model=reference)
    c = compared(config, mine, ref)
    assert c.rows[-1].status == "agree", [(r.kind, r.status) for r in c.rows]
    mine_roles, their_roles = roles_of(c.mine, 2), roles_of(c.theirs, 2)
    for role in "qkvo":
        ours, theirs = getattr(mine_roles, role), getattr(their_roles, role)
        np.testing.assert_allclose(theirs[0], ours[0], rtol=0, atol=1e-7)
        if ours[1] is not None and theirs[1] is not None:
            np.testing.assert_allclose(theirs[1], ours[1], rtol=0, atol=1e-7)
    got = c.theirs.recording.snapshot(c.theirs.recording.output).values
    want = c.mine.recording.snapshot(c.mine.recording.output).values
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if ref.module == f"{TL}:TLAttention":
        assert any("W_Q <- your Q rows 0-7 (stored with a head axis as (2, 8, 4))" in line
                   for line in c.weights), c.weights
