"""A stage's words describe the ops the module ran and the numbers it made, not one fixed
text (issue 27, section 5): the concat of `transpose(1, 2).reshape(B, T, C)` or einops'
permute is not explained as `contiguous().view(B, T, C)`; a cross-attention score matrix is
T_q x T_k, not (T, T); rows that are NaN are named, with why, and no one says every row sums
to 1 there."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace

FIXTURES = Path(__file__).parent / "fixtures"


@cache
def _trace(target: str, context: str | None = None, **init: int):
    config = Config("I love AI", embed_dim=8, num_heads=2,
                    **({"context": context} if context else {}))
    return run_trace(config, Source(module=str(FIXTURES / target),
                                    init=tuple(init.items())))


def test_a_reshape_concat_is_explained_as_the_reshape_it_is() -> None:
    words = _trace("raw_bias_attn.py:RawBias").stage("concat").explanation
    assert words.startswith("transpose(1, 2) brings the token axis back"), words
    assert "reshape(B, T, C)" in words and "contiguous()" not in words and "view(B, T, C)" not in words


def test_an_einops_concat_names_its_permute() -> None:
    trace = _trace("einops_attn.py:CausalAttention")
    words = trace.stage("concat").explanation
    assert words.startswith("permute(0, 2, 1, 3) brings"), words
    assert "contiguous()" not in words


def test_cross_attention_scores_are_t_q_by_t_k() -> None:
    trace = _trace("two_sequences.py:SDCrossAttention", context="the cat sat on mats", query_dim=8)
    for stage_id in ("scores",):
        words = trace.stage(stage_id).explanation
        assert "(T, T)" not in words and "T_q x T_k = 3 x 5" in words, words


@pytest.mark.parametrize(("cls", "why"), [
    ("DiagonalMasked", "has every key blocked: its softmax is 0/0 = NaN"),
    ("Overflow", "not written by the mask (scores that overflowed float32 before it)"),
])
def test_nan_rows_are_named_with_why(cls: str, why: str) -> None:
    softmax = _trace(f"nan_rows.py:{cls}").stage("softmax")
    first = softmax.checks[0]
    assert first.ok is False, first.label
    assert first.label.startswith("query I (row 0) of head 0 ") and why in first.label, first.label
    assert not [c for c in softmax.checks if c.label.startswith("every row sums to 1")]
    assert "every row sums to 1" not in softmax.explanation, softmax.explanation
    assert "query I (row 0) of head 0 is NaN" in softmax.explanation, softmax.explanation


def test_rows_that_sum_to_1_keep_the_textbook_words() -> None:
    softmax = _trace("raw_bias_attn.py:RawBias").stage("softmax")
    assert "every row sums to 1" in softmax.explanation
    assert softmax.checks[0].label.startswith("every row sums to 1") and softmax.checks[0].ok
