"""A mask is what the mask op wrote (the tensor it added, the positions it filled), never a
threshold on its result (issue 27): BERT's `scores + (1 - tril) * -10000.0` leaves a blocked
score at -9999.3 or -10000.8 depending on the score's sign, and is the same causal mask as
-1e9, finfo.min and -inf, added, subtracted, filled or chosen with torch.where, held in a
buffer, passed as forward's mask argument or built inside forward (tests/fixtures/mask_values.py).
`check` calls each equivalent; the explained stage counts every blocked entry, its checks pass;
softmax, the quiz and the drill-down count and name the same entries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.quiz import questions
from mha_tui.why import why

FIXTURE = Path(__file__).parent / "fixtures" / "mask_values.py"
CLASSES = ["AddMinus10000Buffer", "AddMinus10000Argument", "SubtractTenThousandBuffer",
           "AddMinusBillionInForward", "AddFinfoMinInForward", "AddMinusInfInForward",
           "FillMinus10000Argument", "FillMinusBillionBuffer", "FillFinfoMinInForward",
           "FillMinusInfArgument", "WhereMinus10000Buffer"]
SENTENCE = "the cat sat on the mat"
H, C = 2, 8
runner = CliRunner()


def _trace(name: str, seed: int = 0):  # type: ignore[no-untyped-def]
    return run_trace(Config(SENTENCE, embed_dim=C, num_heads=H, seed=seed),
                     Source(module=f"{FIXTURE}:{name}"))


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_spelling_of_the_causal_mask_is_equivalent(name: str, seed: int) -> None:
    result = runner.invoke(app, ["check", f"{FIXTURE}:{name}", "--format", "json", "-H", str(H),
                                 "-C", str(C), "--seed", str(seed)])
    verdict = json.loads(result.stdout)
    mask = [row for row in verdict["stages"] if row["kind"] == "mask"]
    assert [row["ok"] for row in mask] == [True], (verdict["diagnosis"], mask)
    assert verdict["equivalent"] is True and result.exit_code == 0, verdict["diagnosis"]


@pytest.mark.parametrize("name", CLASSES)
def test_the_stage_counts_every_entry_the_mask_op_wrote(name: str) -> None:
    """The count is of the entries above the diagonal in every batch row and head (counted
    here from the stage's own tensor's shape), and the stage's checks all pass."""
    trace = _trace(name)
    stage = trace.stage("mask")
    shape = stage.tensors[-1].shape
    T = shape[-1]
    above = int(np.triu(np.ones((T, T), bool), 1).sum()) * int(np.prod(shape[:-2]))
    assert stage.title.startswith("Causal mask"), stage.title
    assert not [c.label for c in stage.checks if c.ok is False]
    assert any(c.label.startswith(f"{above} of {above} entries above the diagonal")
               for c in stage.checks), [c.label for c in stage.checks]
    softmax = trace.stage("softmax")
    assert f"{above} of {above} masked entries are exactly 0" in [c.label for c in softmax.checks]


@pytest.mark.parametrize("name", ["AddMinus10000Buffer", "SubtractTenThousandBuffer"])
def test_an_added_finite_mask_is_said_to_be_added(name: str) -> None:
    stage = _trace(name).stage("mask")
    words = "subtracted" if name.startswith("Subtract") else "added"
    assert f"10000 {words}" in stage.explanation, stage.explanation


@pytest.mark.parametrize("name", ["AddMinus10000Buffer", "FillMinusInfArgument"])
def test_the_quiz_and_the_drill_down_name_the_same_blocked_entries(name: str) -> None:
    trace = _trace(name)
    T = trace.stage("mask").tensors[-1].shape[-1]
    (question,) = [q for q in questions(trace) if q.stage == "mask"]
    assert question.expected == T * (T - 1) // 2  # one head's entries above the diagonal
    for i in range(T):
        for j in range(T):
            found = why(trace, "mask", (0, 1, i, j))
            assert found.formula.endswith("blocked" if j > i else "kept"), (i, j, found.formula)


PADDED = ["the", "cat", "sat", "down", "[PAD]", "[PAD]"]


def _padded_trace(real: list[list[int]]):  # type: ignore[no-untyped-def]
    """BertSelfAttention on B rows of the sentence, attention_mask 1 where a token is real."""
    import torch

    import mha_tui
    from tests.fixtures.mask_values import BertSelfAttention

    torch.manual_seed(0)
    module = BertSelfAttention(C, H).eval()
    x = torch.randn(len(real), len(PADDED), C)
    attention_mask = torch.tensor(real, dtype=torch.float32)
    return mha_tui.trace(module, x, tokens=PADDED,
                         call=lambda m, x: m(x, attention_mask=attention_mask))


def test_a_padding_mask_is_named_counted_and_labelled_with_its_tokens() -> None:
    """(1 - attention_mask[:, None, None, :]) * -10000 on one row with two padded keys: every
    query's score for them, in every head, is what the mask wrote (2 x 6 x 2 = 24, counted
    from the attention_mask here), named by their tokens, with why padding is blocked."""
    from mha_tui.notebook import text_of

    real = [1, 1, 1, 1, 0, 0]
    trace = _padded_trace([real])
    stage = trace.stage("mask")
    padded = [f"{word}·{t}" for t, word in enumerate(PADDED) if not real[t]]
    assert stage.title == f"Padding: keys {', '.join(padded)} blocked for every query"
    n = real.count(0) * len(PADDED) * H
    assert f"{n} entries blocked: every query's score for keys {', '.join(padded)} (padding)" in [
        c.label for c in stage.checks]
    assert not [c.label for c in stage.checks if c.ok is False]
    assert "not part of the text" in stage.explanation
    assert f"{n} of {n} masked entries are exactly 0" in [
        c.label for c in trace.stage("softmax").checks]
    drawn = text_of(trace.stage("mask")).splitlines()
    at = next(i for i, line in enumerate(drawn) if line.startswith("extended "))
    header = next(line for line in drawn[at:] if "[PAD]·5" in line)  # the added mask's columns
    assert header.split() == [*PADDED[:4], *padded]


def test_padding_of_each_batch_row_is_named_per_row() -> None:
    real = [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]
    trace = _padded_trace(real)
    stage = trace.stage("mask")
    assert stage.title.startswith("Padding: keys blocked for every query"), stage.title
    assert "row 0: [PAD]·5" in stage.title and "row 1: 4, 5" in stage.title
    n = sum(row.count(0) for row in real) * len(PADDED) * H
    assert any(c.label.startswith(f"{n} entries blocked") for c in stage.checks)
