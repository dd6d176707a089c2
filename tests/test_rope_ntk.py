"""NTK rope scaling named where a checkpoint's config.json says so (`explain --hf`): tiny
random Llama-family checkpoints built offline (tests/hf_families.py's sizes and tokenizers),
one with transformers' dynamic NTK (`rope_type` "dynamic", `factor`), one with Hunyuan's
static NTK (`rope_type` "dynamic" with a fixed `alpha`: the base raised once). The rotary
stage's base is measured from the model's own tables and set beside what the config makes
of it; transformers' own rope functions are the independent witness for the formulas.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from mha_tui.kinds.rotary.ntk import expected_base, named_ntk
from mha_tui.records import Trace

from .hf_families import SENTENCE, Family, _llama_like, model_for, tokenizer_for

THETA = 10000.0
ALPHA = 1000.0
FACTOR = 4.0
CHECKPOINTS = {
    "llama-dynamic-ntk": Family(
        "llama-dynamic-ntk", "LlamaForCausalLM", _llama_like(
            "LlamaConfig", rope_parameters={"rope_type": "dynamic", "rope_theta": THETA,
                                            "factor": FACTOR}), "sentencepiece", ()),
    "hunyuan-static-ntk": Family(
        "hunyuan-static-ntk", "HunYuanDenseV1ForCausalLM", _llama_like(
            "HunYuanDenseV1Config", head_dim=8, rope_parameters={
                "rope_type": "dynamic", "rope_theta": THETA, "alpha": ALPHA, "factor": 1.0}),
        "sentencepiece", ()),
    "llama-plain": Family("llama-plain", "LlamaForCausalLM", _llama_like("LlamaConfig"),
                          "sentencepiece", ()),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trace]:
    from mha_tui.load import hf
    from mha_tui.pipeline.hf import Session

    made = {}
    for name, family in CHECKPOINTS.items():
        directory: Path = tmp_path_factory.mktemp(name)
        tokenizer = tokenizer_for(family)
        model_for(family, len(tokenizer)).save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        made[name] = Session(hf.load(str(directory)), SENTENCE).trace(0)
    return made


def rotary_stage(trace: Trace):
    return next(stage for stage in trace.stages if stage.kind == "rotary")


def test_dynamic_ntk_is_plain_rotary_within_the_original_length(traces: dict) -> None:
    stage = rotary_stage(traces["llama-dynamic-ntk"])
    T = len(traces["llama-dynamic-ntk"].config.tokens)
    assert "dynamic NTK scaling" in stage.title
    check = stage.checks[-1]
    assert check.ok is True, check.label
    assert check.label.startswith(f"rotary, base 10000 (dynamic NTK scaling, factor 4, from "
                                  f"config.json: plain up to its original length of 64 tokens, "
                                  f"and these {T} are within it")


def test_static_ntk_names_the_raised_base(traces: dict) -> None:
    stage = rotary_stage(traces["hunyuan-static-ntk"])
    raised = THETA * ALPHA ** (8 / 6)  # d_h 8: α^(d/(d−2))
    assert f"NTK-scaled base {raised:.6g}" in stage.title
    check = stage.checks[-1]
    assert check.ok is True, check.label
    assert f"rotary, base {raised:.6g} (NTK-scaled: base 10000 × factor" in check.label
    assert "α 1000" in check.label


def test_a_plain_rotary_is_left_as_it_is(traces: dict) -> None:
    stage = rotary_stage(traces["llama-plain"])
    assert "NTK" not in stage.title and not any("NTK" in c.label for c in stage.checks)


def test_a_config_the_tables_disagree_with_is_said_so(traces: dict) -> None:
    """The same stage against a config whose base is not the tables': the check fails."""
    stage = rotary_stage(traces["hunyuan-static-ntk"])
    plain = next(s for s in named_ntk((stage,), {"rope_type": "dynamic", "rope_theta": 500000.0,
                                                 "alpha": ALPHA}, 7))
    assert plain.checks[-1].ok is False and "not " in plain.checks[-1].label


@pytest.mark.parametrize("T", [16, 64, 65, 200])
def test_dynamic_ntk_base_is_transformers_own_beyond_the_original_length(T: int) -> None:
    """The words' base for T tokens against transformers' _compute_dynamic_ntk_parameters
    (its inv_freq[1] = base^(−2/d))."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=32, num_attention_heads=4, max_position_embeddings=64,
                         rope_parameters={"rope_type": "dynamic", "rope_theta": THETA,
                                          "factor": FACTOR})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=T)
    theirs = float(inv_freq[1]) ** (-8 / 2)
    found = expected_base({"rope_type": "dynamic", "rope_theta": THETA, "factor": FACTOR,
                           "max_position_embeddings": 64.0}, 8, T)
    assert found is not None
    base, words, which = found
    assert which == "dynamic" and math.isclose(base, theirs, rel_tol=1e-5)
    assert ("beyond its original length" in words) is (T > 64)
