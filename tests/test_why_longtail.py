"""`--why` on the kinds of issue 30 that softmax attention does not have: cosine attention
(a scaled cosine is q̂ · k̂ times the head's learned scale, a unit-length number is q over its
row's length), differential attention (its output: (1 − λ_init) times the per-head RMSNorm
of the head's row) and linear attention (its einsum's products), each recomputed from the
recorded tensors and equal to the module's own number. tests/test_why_sweep.py asks every
stage of the same modules for several cells; these pin what the answer says."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_tui.config import Config, Source
from mha_tui.pipeline import checked
from mha_tui.records import Trace
from mha_tui.records.request import Request
from mha_tui.why import why

LONGTAIL = Path(__file__).parent / "fixtures" / "longtail"


def traced(ref: str, causal: bool) -> Trace:
    config = Config("I love AI !", embed_dim=16, num_heads=4, causal=causal)
    run, _ = checked(Request(config, Source(module=str(LONGTAIL / ref))))
    return run(config)


@pytest.mark.parametrize("index", [(0, 0, 0, 0), (0, 1, 2, 3), (0, 3, 3, 1)])
def test_a_scaled_cosine_is_the_unit_rows_dot_times_the_learned_scale(index: tuple) -> None:
    trace = traced("open_clip_attn.py:Attention", causal=False)
    cell = why(trace, "cosine", index)
    assert cell.formula.endswith("× scale")
    assert [t.label for t in cell.terms][-2:] == [
        "q̂_i · k̂_j: the cosine of their angle, in [−1, 1]", "× the head's learned scale"]
    cosine = cell.terms[-2].value
    assert -1.0 - 1e-6 <= cosine <= 1.0 + 1e-6
    assert cell.terms[-1].parts[-1] == pytest.approx(10.0)  # exp(log(10)): open_clip's init
    assert cell.agrees, (cell.computed, cell.recorded)


def test_differential_attentions_output_through_its_per_head_norm() -> None:
    trace = traced("diff_attn.py:MultiheadDiffAttn", causal=True)
    stage = next(s for s in trace.stages if s.kind == "differential")
    cell = why(trace, stage.id, (0, 1, 2, 3))
    assert cell.formula.endswith("RMSNorm(the head's output row)[3]")
    assert cell.terms[0].label == "the head's output row: its 8 numbers' mean square"  # 2 d_h
    assert cell.terms[-1].label == "× (1 − λ_init)" and cell.terms[-1].parts[-1] == \
        pytest.approx(0.8)  # 1 − lambda_init_fn(0)
    assert cell.agrees, (cell.computed, cell.recorded)


def test_linear_attention_is_explained_by_its_einsum() -> None:
    trace = traced("linear_attn.py:AttentionLayer", causal=False)
    cell = why(trace, "linear_attn", (0, 1, 2, 3))
    assert "einsum 'nlhd,nhmd,nlh->nlhm'" in cell.formula
    assert cell.kind == "linear_attn" and cell.recomputed and cell.agrees
    assert any("no softmax" in note for note in cell.notes)
