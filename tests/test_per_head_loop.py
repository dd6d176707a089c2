"""A per-head loop (`for h in range(n_heads): ... masked_fill ...`) masks once per head:
`check` judges every pass of the mask line, not only the last (issue 27)."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "per_head_loop.py"


def _check(cls: str) -> dict:
    result = run_cli("check", f"{FIXTURE}:{cls}", "--format", "json")
    return json.loads(result.stdout)


def test_a_correct_per_head_loop_is_equivalent() -> None:
    verdict = _check("PerHeadLoop")
    assert verdict["equivalent"] is True, verdict
    (mask,) = [row for row in verdict["stages"] if row["kind"] == "mask"]
    assert mask["ok"] is True, mask


def test_the_first_heads_wrong_mask_is_named_at_the_mask_line() -> None:
    """Head 0 lets each token see the next one; head 1 (the last pass) is right: the mask
    row is wrong, the diagnosis is the mask's, at its line, naming the pass."""
    verdict = _check("LeakyFirstHead")
    assert verdict["equivalent"] is False
    (mask,) = [row for row in verdict["stages"] if row["kind"] == "mask"]
    assert mask["ok"] is False, mask
    line = next(i + 1 for i, text in enumerate(FIXTURE.read_text().splitlines())
                if "scores.masked_fill(future" in text)
    diagnosis = verdict["diagnosis"]
    assert diagnosis["kind"] == "mask_wrong" and diagnosis["line"] == line, diagnosis
    assert "the 1st of this line's 2 mask ops" in diagnosis["message"], diagnosis
