"""The first stage of `--hf` finds how the model built its first block's input from the
values (`pipeline/hf_input.py`): which table rows each token got, the one factor between two
tensors, which order of adding gives a tensor bit for bit. Each relation on small tensors
built here, and each one that does not hold."""

from __future__ import annotations

import math

import torch

from mha_tui.pipeline.hf_input import factor_between, factor_words, rows_read, rows_words, sum_order


def _table(rows: int = 10, C: int = 4) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(rows, C)


def test_rows_read_finds_positions_with_their_offset() -> None:
    table = _table()
    assert rows_read(table, table[0:5]) == [0, 1, 2, 3, 4]
    assert rows_read(table, table[2:7]) == [2, 3, 4, 5, 6]  # OPT, RoBERTa: from row 2
    caption, label = rows_words([2, 3, 4, 5, 6], "pos.weight", padding_idx=1)
    assert "row t + 2 of pos.weight" in caption
    assert "row 1 is the padding index" in label
    _, label = rows_words([2, 3, 4], "pos.weight", padding_idx=None)
    assert "rows 0..1 are never used for positions" in label


def test_rows_read_finds_one_row_for_every_token_and_any_other_order() -> None:
    table = _table()
    assert rows_read(table, table[3].expand(4, -1)) == [3, 3, 3, 3]
    assert "every token gets row 3" in rows_words([3, 3, 3, 3], "types.weight", None)[1]
    assert rows_read(table, table[[4, 1, 7]]) == [4, 1, 7]
    assert rows_words([4, 1, 7], "t.weight", None)[1] == "the tokens get rows [4, 1, 7] of t.weight"


def test_rows_read_says_none_when_a_row_is_not_in_the_table() -> None:
    table = _table()
    moved = table[0:5].clone()
    moved[3, 1] += 1e-6  # one number off: not a lookup
    assert rows_read(table, moved) is None
    assert rows_read(table, table[0:5] * 2) is None


def test_factor_between_is_exact_or_none() -> None:
    base = _table()
    root = torch.tensor(math.sqrt(32))  # Gemma's normaliser, float32
    s = factor_between(base, base * root)
    assert s == float(root)
    assert factor_words(s, 32) == f"{s:.6g} = sqrt(C) = sqrt(32)"
    assert factor_words(3.0, 32) == "3"
    assert factor_between(base, base.clone()) is None  # a factor of 1 is no scaling
    noisy = base * root
    noisy[0, 0] += 1e-3
    assert factor_between(base, noisy) is None
    assert factor_between(torch.zeros(3, 4), torch.ones(3, 4)) is None


def test_sum_order_finds_the_order_that_matches_bit_for_bit() -> None:
    torch.manual_seed(1)
    # Three float32 parts whose two orders of adding differ in the last bit somewhere.
    for _ in range(100):
        a, b, c = (torch.randn(64, 8) * scale for scale in (1.0, 1e-3, 1e3))
        if not torch.equal((a + b) + c, (a + c) + b):
            break
    assert not torch.equal((a + b) + c, (a + c) + b)
    assert sum_order([a, b, c], (a + b) + c) == (0, 1, 2)
    assert sum_order([a, b, c], (a + c) + b) in {(0, 2, 1), (2, 0, 1)}
    assert sum_order([a, b, c], a + b) is None
