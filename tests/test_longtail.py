"""Issue 30: public attention modules of 2024-26, in their authors' styles
(tests/fixtures/longtail/, the Hugging Face ones imported from the installed transformers),
each explained with every op placed (no anonymous `op` stage, the named mechanism's stage
shown) and judged by `check` as a right answer would be: equivalent or not as the case
says, in words that name the mechanism (tests/longtail_cases.py says what each expects).

LEFT lists the configurations the code does not yet get right, as strict xfails: a fix
makes its configuration pass and must take its name out of LEFT.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.pipeline import checked, run_trace
from mha_tui.records.request import Request
from mha_tui.why import main_tensor, why

from .longtail_cases import CASES, FIXTURES, measure

LEFT: set[str] = set()


def test_left_names_only_configurations_that_exist() -> None:
    assert LEFT <= set(CASES)


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason="issue 30: not yet")]
                 if name in LEFT else []) for name in CASES])
def test_a_public_module_is_staged_and_judged_naming_its_mechanism(name: str) -> None:
    case = CASES[name]
    m = measure(name)
    assert m.explained
    assert m.ops == (), f"anonymous op stages: {m.ops}"
    assert set(case.kinds) <= set(m.kinds), m.kinds
    assert m.equivalent is case.equivalent, m.reason
    for word in case.says:
        assert word.lower() in m.reason.lower(), m.reason


def test_every_softcapped_score_is_explained_as_cap_times_tanh() -> None:
    """--why on the soft-capping stage: cap · tanh(score / cap) from the score it received,
    equal to the module's number, for every cell."""
    trace = run_trace(Config("I love AI !", embed_dim=16, num_heads=4),
                      Source(module=f"{FIXTURES / 'mechanisms' / 'softcap.py'}:Gemma2Attention"))
    stage = trace.stage("softcap")
    before = stage.tensors[0].values.astype(np.float64)
    for index in itertools.product(*map(range, stage.tensors[-1].values.shape)):
        cell = why(trace, "softcap", index)
        assert cell.agrees, (index, cell.computed, cell.recorded)
        assert cell.computed == pytest.approx(0.5 * np.tanh(before[index] / 0.5), abs=1e-6)


def test_picogpt_projection_cells_are_explained_with_the_bias_added_after_the_matmul() -> None:
    """picoGPT's `x @ w + b`: --why on a channel of V (a block of the fused, biased output)
    and of the output is x's row dotted with W's column, plus b, equal to the module's
    number; the heads, split by np.split, are each their own (T, T) scores."""
    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
    source = Source(module=f"{FIXTURES / 'longtail' / 'picogpt_attn.py'}:PicoGPTAttention")
    run, _ = checked(Request(config, source))  # a NumPy module: the pipeline's own door
    trace = run(config)
    for stage_id in ("project", "w_o"):
        record = main_tensor(trace.stage(stage_id))
        for index in [(0, 0), (5, record.values.shape[-1] - 1)]:
            cell = why(trace, stage_id, index)
            assert cell.agrees, (stage_id, index, cell.computed, cell.recorded)
            assert any(term.label.startswith("+ ") and "_b[" in term.label
                       for term in cell.terms), cell.terms
    scores = trace.stage("scores").tensors[-1]
    assert scores.dims[-3:] == ("h", "T", "T") and scores.values.shape[-3] == 4
