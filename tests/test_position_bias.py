"""Position bias (issue 17): ALiBi and relative-position biases as their own stage, their
shape read from the values; scaling inside baddbmm said where it happens."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_tui.kinds.position_bias import bias_shape

from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)

H, T = 4, 6


def _alibi_slopes(h: int) -> np.ndarray:
    """The ALiBi paper's slopes for h a power of two: 2^(-8 i / h), i = 1..h."""
    return np.array([2 ** (-8 * (i + 1) / h) for i in range(h)])


def test_alibi_is_a_slope_per_head_times_the_key_position() -> None:
    slopes = _alibi_slopes(H)
    bias = slopes[:, None, None] * np.arange(T)[None, None, :] + np.zeros((H, T, 1))
    shape = bias_shape(bias)
    assert shape.kind == "alibi"
    np.testing.assert_allclose(shape.slopes, slopes)
    # the same bias written as minus the distance back from the query: also ALiBi
    rows, cols = np.indices((T, T))
    assert bias_shape(-slopes[:, None, None] * (rows - cols)[None]).kind == "alibi"


def test_a_bias_that_depends_on_distance_only_is_relative() -> None:
    rows, cols = np.indices((T, T))
    table = np.random.default_rng(0).standard_normal((H, 2 * T - 1))
    bias = table[:, (cols - rows) + T - 1]
    assert bias_shape(bias).kind == "relative"


def test_other_biases_are_only_called_a_bias() -> None:
    assert bias_shape(np.random.default_rng(1).standard_normal((H, T, T))).kind == "other"


@pytest.mark.parametrize("name", ["bloom", "mpt"])
def test_alibi_families_show_their_slopes(name: str) -> None:
    """BLOOM (bias inside baddbmm) and MPT (bias added after scaling): an ALiBi stage whose
    slopes are the paper's 2^(-8i/h), computed here, and whose scores + bias are the model's."""
    from .test_families import hf_trace

    trace = hf_trace(name, 0)
    stage = trace.stage("pos_bias")
    assert stage.title.startswith("ALiBi")
    assert all(check.ok is not False for check in stage.checks)
    slopes = bias_shape(stage.tensors[0].values[0].astype(np.float64)).slopes
    np.testing.assert_allclose(slopes, _alibi_slopes(H), rtol=1e-5)
    kinds = [s.kind for s in trace.stages]
    assert "op" not in kinds and ("residual" in kinds) is (name == "bloom")  # BLOOM: residual add


def test_bloom_says_the_scaling_happened_inside_baddbmm() -> None:
    from .test_families import hf_trace

    trace = hf_trace("bloom", 0)
    scores = trace.stage("scores")
    assert "inside baddbmm" in scores.title and f"1/sqrt({8})" in scores.note
    assert "scale" not in [s.kind for s in trace.stages]
    assert "already scaled inside baddbmm" in trace.stage("mask").note
    assert "before scaling" not in trace.stage("mask").note
    expected = 1 / math.sqrt(8)
    assert f"alpha={expected:.6g}" in scores.note


@pytest.mark.parametrize("where,ref", [
    ("module", "opt_style.py:OPTAttention"), ("module", "timm_fused.py:Attention"), ("hf", "opt")])
def test_q_scaled_before_the_scores_is_the_scale_stage(where: str, ref: str) -> None:
    """OPT and timm multiply q by d_h ** -0.5 before any score exists: that is the scale
    stage, it says Q is scaled, and no head check compares the scaled q with the projection."""
    from .test_families import hf_trace, module_trace

    trace = module_trace(ref) if where == "module" else hf_trace(ref, 0)
    scale = trace.stage("scale")
    assert "Q is scaled before the scores" in scale.note
    kinds = [s.kind for s in trace.stages]
    assert kinds.index("scale") < kinds.index("scores") and "op" not in kinds
    assert all(c.ok is not False for s in trace.stages if s.kind != "embed" for c in s.checks)
