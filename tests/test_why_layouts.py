"""Why this number, for learners' modules whose layout is not the tutorial's: each cell is
explained by what the module's own ops did (found by replaying them), checked against an
independent NumPy computation from the stage before.

- A merge without the transpose back (`context.reshape(B, T, C)` on (B, h, T, d_h)): the
  cell is attend's number at the element the reshape reads, not head c // d_h's channel.
- A forward that raised before the merge (`.view` after `.transpose` without `.contiguous()`):
  concat's tensor is still (B, T, h, d_h).
- A softmax over the query axis (dim=-2, torch or NumPy written out): down the column.
"""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.pipeline import checked
from mha_tui.records import Trace
from mha_tui.records.request import Request
from mha_tui.why import main_tensor, why

FIXTURES = Path(__file__).parent / "fixtures"


@cache
def trace_of(ref: str) -> Trace:
    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
    run, _ = checked(Request(config, Source(module=str(FIXTURES / ref))))
    return run(config)


def _every_cell(trace: Trace, stage_id: str, expected: np.ndarray) -> None:
    record = main_tensor(trace.stage(stage_id))
    assert record.values.shape == expected.shape
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, stage_id, index)
        want = expected[index]
        if np.isnan(want):
            assert np.isnan(cell.computed), index
        else:
            assert cell.computed == pytest.approx(want, rel=1e-5, abs=1e-7), index
        assert cell.agrees, (stage_id, index, cell.computed, cell.recorded)


def test_a_merge_without_the_transpose_reads_attend_in_memory_order() -> None:
    trace = trace_of("mistakes/merge_no_transpose.py:MultiHeadAttention")
    context = main_tensor(trace.stage("attend")).values  # (B, h, T, d_h)
    B, h, T, d_h = context.shape
    _every_cell(trace, "concat", context.reshape(B, T, h * d_h))
    cell = why(trace, "concat", (0, 3, 8))  # element 3 * 16 + 8 = 56 = 2 * 24 + 2 * 4 + 0
    assert cell.formula.startswith("context[0, 3, 8] = context[0, 2, 2, 0]"), cell.formula
    assert any("holds head 2's channel 0 of token sat, not head 2's channel 0 of token on"
               in note for note in cell.notes), cell.notes


@pytest.mark.parametrize("ref", ["crash_attn.py:CrashingAttention",
                                 "mistakes/crash.py:MultiHeadAttention"])
def test_concat_before_the_merge_is_attend_transposed(ref: str) -> None:
    trace = trace_of(ref)
    assert trace.failed
    context = main_tensor(trace.stage("attend")).values
    _every_cell(trace, "concat", context.transpose(0, 2, 1, 3))  # (B, T, h, d_h)
    cell = why(trace, "concat", (0, 3, 1, 2))
    assert cell.formula.startswith("context[0, 3, 1, 2] = context[0, 1, 3, 2]"), cell.formula


def _softmax(values: np.ndarray, axis: int) -> np.ndarray:
    values = values.astype(np.float64)
    exps = np.exp(values - values.max(axis=axis, keepdims=True))
    return exps / exps.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("ref", ["mistakes/softmax_axis.py:MultiHeadAttention",
                                 "numpy_attn.py:SoftmaxOverQueries"])
def test_a_softmax_over_the_queries_is_explained_down_the_column(ref: str) -> None:
    trace = trace_of(ref)
    stages = [s.id for s in trace.stages]
    before = trace.stages[stages.index("softmax") - 1]  # the scores it normalises
    _every_cell(trace, "softmax", _softmax(main_tensor(before).values, axis=-2))
    index = (0, 1, 3, 2) if main_tensor(before).values.ndim == 4 else (1, 3, 2)
    cell = why(trace, "softmax", index)
    assert "max_k s[k, 2]" in cell.formula
    assert "runs over the query axis (dim -2)" in cell.notes[0]
    assert [t.label for t in cell.terms][:2] == ["query the: exp(s[0, 2] - max)",
                                                 "query cat: exp(s[1, 2] - max)"]


@pytest.mark.parametrize("model", ["mygpt", "blueprint"])
def test_without_a_mask_the_mask_stage_is_the_scaled_score_unchanged(model: str) -> None:
    """--no-causal: the mask stage holds no op (the module's mask lines did not run; it was
    "holds no op"); each cell is Q·K / √d_h, computed here from the transpose stage's q and k."""
    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4, causal=False)
    run, _ = checked(Request(config, Source(model=model)))
    trace = run(config)
    q, k = (r.values.astype(np.float64) for r in trace.stage("transpose").tensors[:2])
    _every_cell(trace, "mask", q @ np.swapaxes(k, -1, -2) / 2.0)  # d_h = 4
    cell = why(trace, "mask", (*([0] if model == "mygpt" else []), 1, 2, 4))
    assert "(no mask ran)" in cell.formula and "--no-causal" in cell.notes[0]


@pytest.mark.parametrize("ref", ["mechanisms/gptj_rotary.py:GPTJAttention",
                                 "check_variants.py:WhereMinusBillion",
                                 "numpy_attn.py:NumpyAttention"])
def test_a_where_mask_of_one_token_and_one_head_keeps_its_score(ref: str) -> None:
    """One token, one head: torch.where / np.where get two one-number arguments (it was
    "cannot tell the scores from the fill value"); the score is told by its value, kept."""
    config = Config("hi", embed_dim=16, num_heads=1)
    run, _ = checked(Request(config, Source(module=str(FIXTURES / ref))))
    trace = run(config)
    stages = [s.id for s in trace.stages]
    before = main_tensor(trace.stages[stages.index("mask") - 1]).values
    record = main_tensor(trace.stage("mask"))
    assert record.values.size == 1
    cell = why(trace, "mask", (0,) * record.values.ndim)
    assert cell.agrees and cell.computed == before.reshape(-1)[0]
    assert "kept" in cell.terms[-1].label
