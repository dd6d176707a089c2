"""judge/track.py and judge/whole.py on their own: layouts, matching, where a module leaves
the reference, and what the whole forward says (no attention, the output's shape, NaN)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.judge.numpy_reference import reference_output, steps
from mha_tui.judge.track import _bias_words, _seen_later, layouts, match, regroups, same
from mha_tui.judge.whole import nan_origin, no_attention, output_shape
from mha_tui.pipeline import checked
from mha_tui.records.request import Request

UNSOUND = Path(__file__).parent / "fixtures" / "unsound"


def _weights(C: int, seed: int = 0):
    from mha_tui.records.verdict import RoleWeights

    rng = np.random.default_rng(seed)
    w = [(rng.standard_normal((C, C)), None) for _ in range(4)]
    return RoleWeights(*w)


@pytest.mark.parametrize(("src", "dst", "fits"), [
    ((1, 4, 8), (1, 4, 2, 4), True),  # view(B, T, h, d_h)
    ((1, 2, 4, 4), (2, 4, 4), True),  # (B * h, T, d_h)
    ((4, 1, 8), (1, 4, 8), True),  # size-1 axes move freely
    ((1, 4, 8), (1, 8, 4), False),  # a view that cuts across tokens
    ((1, 4, 8), (1, 4, 4), False),
])
def test_regroups(src, dst, fits) -> None:
    assert regroups(src, dst)[0] is fits


def test_same_treats_blocked_and_nan_alike() -> None:
    inf = float("inf")
    assert same(np.array([-inf, 1.0]), np.array([-1e9, 1.0]))
    assert same(np.array([np.nan, 2.0]), np.array([np.nan, 2.0]))
    assert not same(np.array([np.nan, 2.0]), np.array([0.0, 2.0]))
    assert not same(np.array([1.0]), np.array([1.01]))


def test_match_finds_steps_in_any_correct_layout() -> None:
    x = np.random.default_rng(1).standard_normal((1, 4, 8))
    ref = steps(x, _weights(8), 2, True)
    by = {s.name: s.values for s in ref}
    k = by["k"]  # (B, h, T, d_h)
    assert match(k.reshape(2, 4, 4), ref).step == "k"  # (B * h, T, d_h)
    assert match(k.transpose(0, 2, 1, 3), ref).step == "k"  # (B, T, h, d_h)
    assert match(k.transpose(0, 1, 3, 2), ref).step == "k"  # k^T
    assert match(k[:, 1], ref).step == "k"  # one head's own module
    assert match(np.roll(k, 1, axis=2), ref) is None
    scores = by["raw scores"]
    assert match(scores, ref).step == "raw scores"
    assert match(scores.transpose(0, 1, 3, 2), ref) is None  # queries for keys: never a layout
    masked = by["masked scores"].copy()
    masked[np.isneginf(masked)] = -1e9
    assert match(masked, ref).step == "masked scores"


def test_the_reference_output_is_the_last_step() -> None:
    x = np.random.default_rng(2).standard_normal((5, 8))
    out = reference_output(x, _weights(8), 2, True)
    assert out.shape == (5, 8)
    assert np.array_equal(out, steps(x, _weights(8), 2, True)[-1].values[0])


def test_a_roll_says_which_token_sees_which() -> None:
    assert _seen_later(1, 4) == (0, 3)
    assert _seen_later(0, 4) is None


def test_alibi_is_told_from_another_bias() -> None:
    T, h = 5, 2
    slopes = np.array([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)])
    distance = np.arange(T)[None, :] - np.arange(T)[:, None]
    assert _bias_words(slopes[:, None, None] * distance, "the scores").startswith(
        "ALiBi bias added to the scores")
    noise = np.random.default_rng(0).standard_normal((h, T, T))
    assert _bias_words(noise, "the scores") == "a bias (not a mask) added to the scores"


def _recording(name: str):
    config = Config("I love AI !")
    run, _ = checked(Request(config, Source(module=f"{UNSOUND / name}.py:MultiHeadAttention")))
    return run(config).recording


def test_layouts_never_offer_a_query_axis_for_a_key_axis() -> None:
    x = np.random.default_rng(3).standard_normal((1, 3, 4))
    step = next(s for s in steps(x, _weights(4), 2, True) if s.name == "raw scores")
    for _, dims in layouts(step, (1, 2, 3, 3)):
        assert dims is None or dims.index("T") < dims.index("T'")


def test_whole_forward_findings() -> None:
    assert no_attention(_recording("return_x"), {"x"}, (("W_Q.weight", (4, 4)),)).kind == \
        "no_attention"
    assert no_attention(_recording("single_linear"), {"x"}, (("proj.weight", (4, 4)),)) \
        .message.startswith("no attention found: no softmax")
    assert "no parameters" in no_attention(_recording("no_weights"), {"x"}, ()).message
    assert no_attention(_recording("roll_k"), {"x"}, (("W_Q.weight", (4, 4)),)) is None
    shape = output_shape(_recording("wrong_shape"), {"x"})
    assert "(1, 2, 3)" in shape.message and "(1, 4, 4)" in shape.message
    assert output_shape(_recording("roll_k"), {"x"}) is None


def test_nan_origin_names_the_mask_that_blocked_a_whole_row() -> None:
    rec = _recording("fully_masked_row")
    finding, op = nan_origin(rec, {"x"})
    assert op.name == "softmax"
    assert finding.message.startswith("row 0 of head 0 is fully masked: softmax of all -inf "
                                      "is NaN; the same row in all 2 heads")
    lines = (UNSOUND / "fully_masked_row.py").read_text().splitlines()
    assert lines[finding.source.line - 1].endswith("# MISTAKE")
    assert nan_origin(_recording("roll_k"), {"x"}) is None
