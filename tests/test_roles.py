"""Head scores (mha_tui.roles) on hand-built weights: each score averages the entries it says,
each label goes to the highest score at or above the threshold, and a sentence without a
repeat has no induction or duplicate-token score."""

from __future__ import annotations

import numpy as np
import pytest

from mha_tui.roles import (
    LABEL_THRESHOLD,
    copyable_positions,
    has_repeat,
    head_roles,
    role_checks,
    roles_of,
    score_entries,
)

REPEAT = [0, 1, 2, 3, 0, 1, 2, 3]  # a b c d a b c d


def _rows(T: int, pick) -> np.ndarray:
    """A causal (T, T) weight matrix: all of each row's weight on key pick(i)."""
    w = np.zeros((T, T), dtype=np.float32)
    for i in range(T):
        w[i, pick(i)] = 1.0
    return w


def _uniform(T: int) -> np.ndarray:
    return np.tril(np.ones((T, T), dtype=np.float32)) / np.arange(1, T + 1)[:, None]


def _induction(ids: list[int]) -> np.ndarray:
    """All weight on the token after the query token's first occurrence (else on itself)."""
    def pick(i: int) -> int:
        earlier = [k for k in range(i - 1) if ids[k] == ids[i]]
        return earlier[0] + 1 if earlier else i
    return _rows(len(ids), pick)


@pytest.mark.parametrize(("name", "weights", "label"), [
    ("previous-token", _rows(8, lambda i: max(i - 1, 0)), "previous-token"),
    ("current-token", _rows(8, lambda i: i), "current-token"),
    ("first-token", _rows(8, lambda i: 0), "first-token"),
    ("induction", _induction(REPEAT), "induction"),
    ("uniform", _uniform(8), "mixed"),
])
def test_a_pure_head_scores_one_and_earns_its_label(name: str, weights: np.ndarray, label: str) -> None:
    (role,) = head_roles(weights[None], REPEAT, layer=1)
    assert role.label == label
    if label != "mixed":
        assert role.score(label).value == pytest.approx(1.0)
    assert (role.layer, role.head) == (1, 0)


def test_entries_are_the_ones_each_formula_names() -> None:
    entries = score_entries(REPEAT)
    assert entries["previous-token"] == tuple((i, (i - 1,)) for i in range(1, 8))
    # the second a (position 4) looks at the first b (1); the second b at the first c ...
    assert entries["induction"] == ((4, (1,)), (5, (2,)), (6, (3,)), (7, (4,)))
    assert entries["duplicate-token"] == ((4, (0,)), (5, (1,)), (6, (2,)), (7, (3,)))
    assert entries["first-token"][0] == (1, (0,))
    assert entries["current-token"][-1] == (7, (7,))


def test_a_score_is_the_mean_of_its_entries() -> None:
    rng = np.random.default_rng(3)
    w = rng.random((2, 8, 8)).astype(np.float32)
    roles = head_roles(w, REPEAT, layer=0)
    for role in roles:
        for score in role.scores:
            expected = np.mean([sum(float(w[role.head, i, k]) for k in keys)
                                for i, keys in score.entries])
            assert score.value == pytest.approx(expected)


def test_a_token_repeated_twice_sums_both_earlier_occurrences() -> None:
    ids = [0, 1, 0, 1, 0]
    entries = score_entries(ids)
    assert dict(entries["duplicate-token"])[4] == (0, 2)
    assert dict(entries["induction"])[4] == (1, 3)


def test_no_repeat_no_induction_score() -> None:
    ids = [0, 1, 2, 3]
    (role,) = head_roles(_uniform(4)[None], ids, layer=0)
    assert role.score("induction").value is None
    assert role.score("duplicate-token").value is None
    assert not has_repeat(ids)
    said = " ".join(check.label for check in role_checks(_uniform(4)[None], ids, 0))
    assert "repeats none" in said and "--repeat" in said


def test_below_the_threshold_is_mixed() -> None:
    w = _uniform(8)
    w = 0.5 * w + 0.5 * _rows(8, lambda i: max(i - 1, 0))  # previous-token about 0.5 + a bit
    (role,) = head_roles(w[None], REPEAT, layer=0)
    assert role.score("previous-token").value >= LABEL_THRESHOLD
    assert role.label == "previous-token"
    (weak,) = head_roles((0.2 * _rows(8, lambda i: max(i - 1, 0)) + 0.8 * _uniform(8))[None],
                         list(range(8)), layer=0)
    assert weak.label == "mixed"


def test_cross_attention_weights_get_no_roles() -> None:
    assert roles_of(np.ones((1, 2, 3, 5)), [0, 1, 2], 0) == ()
    assert role_checks(np.ones((1, 2, 3, 5)), [0, 1, 2], 0) == []


def test_copyable_positions_are_the_repeat() -> None:
    # a b c d a b c d: positions 4, 5, 6 predict b, c, d by copying
    assert copyable_positions(REPEAT) == (4, 5, 6)
    assert copyable_positions([0, 1, 2]) == ()
