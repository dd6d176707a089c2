"""`mha-tui check` judges the mechanisms of modern attention (issue 18): the reference grows
shared K/V heads (read from the K and V weights' shapes), rotary positions (`--expect
rotary`), ALiBi (`--expect alibi`), a window (`--window N`) and no mask (`--no-causal`), so a
correct module is "equivalent" to what it says it is, and a module with one planted bug is
"NOT equivalent" at the bug's line, named in words.

The buggy modules are the correct fixtures of tests/fixtures/mechanisms/ with one line
replaced, written to a temporary folder; the test finds the replaced line by its text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mha_tui.cli import app

MECHANISMS = Path(__file__).parent / "fixtures" / "mechanisms"
UNSOUND = Path(__file__).parent / "fixtures" / "unsound"
runner = CliRunner()


def check(spec: str, *options: str) -> tuple[int, dict]:
    """Run `mha-tui check SPEC --format json OPTIONS`: (exit code, the verdict's JSON)."""
    result = runner.invoke(app, ["check", spec, "--format", "json", *options])
    assert result.exit_code in (0, 1, 3), result.output
    return result.exit_code, json.loads(result.stdout)


def text(spec: str, *options: str) -> tuple[int, str]:
    result = runner.invoke(app, ["check", spec, "--width", "400", *options])
    return result.exit_code, result.output


def planted(tmp_path: Path, fixture: Path, *edits: tuple[str, str]) -> tuple[Path, list[int]]:
    """The fixture with each line holding `old` replaced by `new`: (its path, the lines)."""
    lines = fixture.read_text().splitlines()
    at = []
    for old, new in edits:
        found = [i for i, line in enumerate(lines) if old in line]
        assert len(found) == 1, (old, found)
        lines[found[0]] = lines[found[0]].replace(old, new)
        at.append(found[0] + 1)
    path = tmp_path / fixture.name
    path.write_text("\n".join(lines) + "\n")
    return path, at


def line_of(path: Path, text: str) -> int:
    return next(i + 1 for i, line in enumerate(path.read_text().splitlines()) if text in line)


LLAMA = f"{MECHANISMS / 'llama_rotary.py'}:LlamaAttention"
META = f"{MECHANISMS / 'meta_llama.py'}:Attention"
BLOOM = f"{MECHANISMS / 'alibi.py'}:BloomAttention"
SIZES = ("-H", "4", "-C", "16")


# ---------------------------------------------------------------------------- correct modules


def test_a_llama_gqa_rotary_module_is_equivalent_to_what_it_is() -> None:
    code, out = text(LLAMA, *SIZES, "--expect", "rotary")
    assert code == 0, out
    assert ("equivalent to causal multi-head attention with rotary positions (full, base "
            "10000, rotate_half) and shared K/V heads (h_kv 2)") in out


def test_multi_query_attention_is_named() -> None:
    code, out = text(LLAMA, *SIZES, "--expect", "rotary", "--init", "num_key_value_heads=1")
    assert code == 0, out
    assert "one K/V head shared by all query heads (multi-query, h_kv 1)" in out


def test_meta_llama_with_complex_rotary_is_equivalent() -> None:
    code, out = text(META, *SIZES, "--init", "dim=16", "--init", "n_heads=4", "--expect", "rotary")
    assert code == 0, out
    assert "rotary positions (full, base 10000, interleaved pairs) and shared K/V heads" in out


def test_gqa_without_rotary_in_the_module_and_expected_is_said() -> None:
    """--expect rotary of a GQA module that turns nothing: "no rotary positions"."""
    code, data = check(LLAMA, *SIZES, "--expect", "rotary", "--rotary-base", "10000")
    assert code == 0
    code, data = check(LLAMA, *SIZES)
    assert code == 1
    assert data["diagnosis"]["kind"] == "mechanism"
    assert "rotary positions on Q and K" in data["diagnosis"]["message"]


def test_alibi_is_equivalent_when_expected_and_named_when_not() -> None:
    code, out = text(BLOOM, *SIZES, "--expect", "alibi")
    assert code == 0, out
    assert "equivalent to causal multi-head attention with ALiBi (slopes 0.25, 0.0625" in out
    code, data = check(BLOOM, *SIZES)
    assert code == 1
    bias_line = next(i + 1 for i, line in enumerate((MECHANISMS / "alibi.py").read_text()
                                                    .splitlines()) if "baddbmm(" in line)
    assert data["diagnosis"]["line"] == bias_line
    assert data["diagnosis"]["message"].startswith("differs: ALiBi bias added to the scores")


def test_bloom_scaling_inside_baddbmm_is_the_scale() -> None:
    """baddbmm(bias, q, k, alpha=1/sqrt(d_h)) scales the scores: no "scale (missing)" row."""
    _, data = check(BLOOM, *SIZES, "--expect", "alibi")
    assert not [s for s in data["stages"] if s["kind"] == "scale" and s["ok"] is False]


def test_expecting_alibi_of_a_plain_module_is_not_equivalent() -> None:
    code, data = check(f"{Path(__file__).parent / 'fixtures' / 'mistakes' / 'correct.py'}"
                       ":MultiHeadAttention", "--expect", "alibi")
    assert code == 1
    assert data["diagnosis"]["message"].startswith("differs: no ALiBi bias")


def test_a_bad_rotary_base_is_a_usage_error() -> None:
    result = runner.invoke(app, ["check", LLAMA, *SIZES, "--rotary-base", "1"])
    assert result.exit_code == 2
    assert "--rotary-base must be above 1" in result.output


# ---------------------------------------------------------------------------- one planted bug

ROTATES_Q = "q_embed = (q * cos)"  # apply_rotary_pos_emb's lines, where the rotation happens
ROTATES_K = "k_embed = (k * cos)"


@pytest.mark.parametrize(("name", "edits", "options", "kind", "words", "at"), [
    ("base 500", [("rope_theta: float = 10000.0", "rope_theta: float = 500.0")],
     ["-H", "2"], "rotary_base", "rotary base 500 where 10000 was expected", ROTATES_Q),
    ("V rotated", [("q, k = apply_rotary_pos_emb(q, k, cos, sin)",
                    "q, v = apply_rotary_pos_emb(q, v, cos, sin)")],
     ["-H", "4"], "rotary_v", "V is rotated: rotary applies to Q and K only", ROTATES_K),
    ("rotated after the scores", [
        ("        q, k = apply_rotary_pos_emb(q, k, cos, sin)", "        pass"),
        ("context = torch.matmul(weights, v)",
         "context, _ = apply_rotary_pos_emb(torch.matmul(weights, v), k, cos, sin)")],
     ["-H", "4"], "rotary_after_scores", "rotary turns the heads' outputs, after the scores",
     ROTATES_Q),
    ("repeat, not repeat_interleave", [
        ("k = repeat_kv(k, self.num_key_value_groups)",
         "k = k.repeat(1, self.num_key_value_groups, 1, 1)")],
     ["-H", "4"], "kv_repeat_order", "read K/V heads 0, 1, 0, 1 (torch's .repeat cycles",
     "k.repeat("),
])
def test_a_planted_gqa_rotary_bug_is_caught_at_its_line_and_named(
        tmp_path: Path, name: str, edits, options: list[str], kind: str, words: str,
        at: str) -> None:
    path, _ = planted(tmp_path, MECHANISMS / "llama_rotary.py", *edits)
    code, data = check(f"{path}:LlamaAttention", *options, "-C", "16", "--expect", "rotary")
    assert code == 1, data
    assert data["diagnosis"]["kind"] == kind, data["diagnosis"]
    assert words in data["diagnosis"]["message"]
    assert data["diagnosis"]["line"] == line_of(path, at)


def test_alibi_with_wrong_slopes_is_caught_at_its_line(tmp_path: Path) -> None:
    path, _ = planted(tmp_path, UNSOUND / "alibi.py", ("-8.0 * (i + 1)", "-4.0 * (i + 1)"))
    code, data = check(f"{path}:MultiHeadAttention", "--expect", "alibi")
    assert code == 1
    assert data["diagnosis"]["kind"] == "alibi_slopes"
    assert data["diagnosis"]["message"].startswith(
        "ALiBi slopes 0.25, 0.0625 where 0.0625, 0.003906 were expected")
    assert data["diagnosis"]["line"] == line_of(path, "# DIFFERS")


def test_a_window_of_the_wrong_width_is_caught_at_the_mask() -> None:
    path = MECHANISMS / "sliding_window.py"
    code, data = check(f"{path}:SlidingWindowAttention", "--window", "3")
    assert code == 1
    assert data["diagnosis"]["line"] == line_of(path, "scores.masked_fill(")
    assert "sliding window of 2" in data["diagnosis"]["message"]
    assert "--window 3 was given" in data["diagnosis"]["message"]
    assert check(f"{path}:SlidingWindowAttention", "--window", "2")[0] == 0


# ---------------------------------------------------------------------------- every stage judged

@pytest.mark.parametrize(("spec", "options", "kinds"), [
    (LLAMA, ("--expect", "rotary"), {"rotary", "kv_repeat"}),
    (BLOOM, ("--expect", "alibi"), {"pos_bias"}),
    (f"{MECHANISMS / 'prenorm.py'}:PreNormAttention", (), {"norm"}),
])
def test_the_new_kinds_are_judged_rows(spec: str, options: tuple[str, ...], kinds: set[str]
                                       ) -> None:
    """The rotary, shared-K/V, position-bias and norm stages each get a judged row (✓ or ✗
    with what was checked), not "not judged on its own"."""
    _, data = check(spec, *SIZES, *options)
    rows = {s["kind"]: s for s in data["stages"]}
    for kind in kinds:
        assert rows[kind]["ok"] is True, rows.get(kind)


# ---------------------------------------------------------------------------- partial, odd, unmasked


@pytest.mark.parametrize(("spec", "options", "words"), [
    (f"{MECHANISMS / 'neox_rotary.py'}:GPTNeoXAttention", ["-H", "4", "-C", "12"],
     "rotary positions (partial: 2 of each head's 3 channels, base 10000, rotate_half)"),
    (f"{MECHANISMS / 'gptj_rotary.py'}:GPTJAttention", ["-H", "2", "-C", "16", "--init",
                                                        "rotary_dim=4"],
     "rotary positions (partial: 4 of each head's 8 channels, base 10000, interleaved pairs)"),
])
def test_partial_rotary_and_an_odd_d_h_are_judged(spec: str, options: list[str], words: str
                                                  ) -> None:
    """--expect rotary with a partial rotary (GPT-NeoX, GPT-J) or an odd d_h: the reference
    turns as many channels as the module's rotation does, and says so."""
    code, out = text(spec, *options, "--expect", "rotary")
    assert code == 0, out
    assert f"equivalent to causal multi-head attention with {words}" in out


def test_expecting_rotary_with_an_odd_d_h_of_a_plain_module_is_said() -> None:
    code, data = check(f"{Path(__file__).parent / 'fixtures' / 'mistakes' / 'correct.py'}"
                       ":MultiHeadAttention", "-H", "2", "-C", "6", "--expect", "rotary")
    assert code == 1
    assert data["diagnosis"]["message"].startswith("differs: no rotary positions")


def test_an_unmasked_gqa_rotary_module_is_judged_with_no_causal(tmp_path: Path) -> None:
    path, _ = planted(tmp_path, MECHANISMS / "llama_rotary.py",
                      ("scores = scores + causal_mask", "scores = scores"))
    code, out = text(f"{path}:LlamaAttention", *SIZES, "--expect", "rotary", "--no-causal")
    assert code == 0, out
    assert ("equivalent to unmasked (bidirectional) multi-head attention with rotary positions "
            "(full, base 10000, rotate_half) and shared K/V heads (h_kv 2)") in out
    code, data = check(f"{path}:LlamaAttention", *SIZES, "--expect", "rotary")
    assert code == 1
    assert data["diagnosis"]["kind"] == "mask_missing"


def test_grading_passes_alibi_and_the_rotary_base_to_every_worker() -> None:
    """Several modules are judged in worker processes: --expect alibi and --rotary-base
    reach each of them."""
    plain = f"{Path(__file__).parent / 'fixtures' / 'mistakes' / 'correct.py'}:MultiHeadAttention"
    result = runner.invoke(app, ["check", BLOOM, plain, *SIZES, "--expect", "alibi",
                                 "--format", "json"])
    data = json.loads(result.stdout)
    assert [d["verdict"] for d in data] == ["equivalent", "NOT equivalent"], data
    result = runner.invoke(app, ["check", LLAMA, f"{UNSOUND / 'rotary.py'}:MultiHeadAttention",
                                 *SIZES, "--expect", "rotary", "--rotary-base", "500",
                                 "--format", "json"])
    data = json.loads(result.stdout)
    assert [d["diagnosis"]["kind"] for d in data] == ["rotary_base", "rotary_base"], data


def test_sdpa_sharing_kv_heads_itself_is_judged(tmp_path: Path) -> None:
    """F.scaled_dot_product_attention(..., enable_gqa=True) repeats the h_kv K/V heads itself:
    its expansion does the same, so the module is equivalent, and a planted mistake in it is
    caught at the call."""
    spec = f"{MECHANISMS / 'gqa_sdpa.py'}:GQAAttention"
    code, out = text(spec, *SIZES)
    assert code == 0, out
    assert "equivalent to causal multi-head attention with shared K/V heads (h_kv 2)" in out
    path, (line,) = planted(tmp_path, MECHANISMS / "gqa_sdpa.py",
                            ("is_causal=True, enable_gqa", "is_causal=False, enable_gqa"))
    code, data = check(f"{path}:GQAAttention", *SIZES)
    assert code == 1
    assert (data["diagnosis"]["kind"], data["diagnosis"]["line"]) == ("mask_missing", line)
