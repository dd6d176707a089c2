"""`check --format json`'s `reference`: what the module's output was compared with, for a
grader's script to read without parsing words: `plain` multi-head attention (causal or
not), or the mechanisms the reference was grown by, each with its parameters (rotary's base,
pair layout and scaling, a window's size, the shared K/V heads, a soft-cap's cap, the sinks'
logits, ...). The parameters are the module's own (read from its stages) or the options'
(`--rotary-base`, `--window`), and the words are the verdict's own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mha_tui.cli import app

FIXTURES = Path(__file__).parent / "fixtures"
PUBLIC = FIXTURES / "public"
MECHANISMS = FIXTURES / "mechanisms"
HF = FIXTURES / "longtail" / "hf_installed.py"
SIZES = ("-H", "4", "-C", "16")
runner = CliRunner()


def check(spec: str, *options: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["check", spec, "--format", "json", *options])
    assert result.exit_code in (0, 1, 3), result.output
    return result.exit_code, json.loads(result.stdout)


def mechanisms(verdict: dict) -> dict[str, dict]:
    return {m["mechanism"]: m for m in verdict["reference"]["mechanisms"]}


def test_plain_multi_head_attention_is_said_plain() -> None:
    code, verdict = check(f"{PUBLIC / 'nanogpt.py'}:SlowAttention", "-H", "2", "-C", "8")
    assert code == 0, verdict["diagnosis"]
    assert verdict["reference"] == {"words": "causal multi-head attention", "causal": True,
                                    "plain": True, "mechanisms": []}
    code, verdict = check(f"{PUBLIC / 'timm_attention.py'}:Attention", "-H", "2", "-C", "8",
                          "--no-causal")
    assert code == 0 and verdict["reference"]["causal"] is False
    assert verdict["reference"]["words"] == "unmasked (bidirectional) multi-head attention"


def test_rotary_window_and_shared_heads_with_their_parameters() -> None:
    """Mistral with --expect rotary --window 2: the base, the pair layout, the channels
    turned, the window's size and the K/V heads, as numbers."""
    code, verdict = check(f"{PUBLIC / 'hf_mistral.py'}:HFMistralAttention", *SIZES,
                          "--expect", "rotary", "--window", "2")
    assert code == 0, verdict["diagnosis"]
    found = mechanisms(verdict)
    assert found["rotary"] | {"words": ""} == {
        "mechanism": "rotary", "words": "", "base": 10000.0, "pairs": "rotate_half",
        "channels": 4, "direction": 1}
    assert found["window"]["size"] == 2
    assert found["shared_kv"]["h_kv"] == 2
    assert not verdict["reference"]["plain"]
    # the words are the verdict's: each mechanism's inside the whole's
    assert all(m["words"] in verdict["reference"]["words"] for m in found.values())


def test_rope_scaling_and_the_rotary_base_asked_for() -> None:
    code, verdict = check(f"{HF}:Llama3ScaledSelfAttention", "-H", "4", "-C", "64",
                          "--expect", "rotary", "--rotary-base", "500000")
    assert code == 0, verdict["diagnosis"]
    rotary = mechanisms(verdict)["rotary"]
    assert rotary["base"] == 500000.0
    assert rotary["scaling"] == {"rope_type": "llama3", "factor": 8.0, "attention_factor": 1.0}
    code, verdict = check(f"{HF}:YarnSelfAttention", "-H", "4", "-C", "64",
                          "--expect", "rotary", "--rotary-base", "1000000")
    assert code == 0, verdict["diagnosis"]
    scaling = mechanisms(verdict)["rotary"]["scaling"]
    assert scaling["rope_type"] == "yarn" and round(scaling["factor"]) == 4
    assert math.isclose(scaling["attention_factor"], 0.1 * math.log(4) + 1, rel_tol=1e-4)


@pytest.mark.parametrize(("spec", "options", "name", "parameters"), [
    (f"{HF}:Gemma2SelfAttention", ("--expect", "rotary", "--expect", "softcap"), "softcap",
     {"cap": 0.5}),
    (f"{MECHANISMS / 'sinks.py'}:AttentionBlock", ("--expect", "sinks"), "sinks", None),
    (f"{HF}:Olmo2SelfAttention", ("--expect", "rotary", "--rotary-base", "500000",
                                  "--expect", "qk_norm"), "qk_norm",
     # eps: Olmo2Config's rms_norm_eps
     {"q_norm": {"norm": "RMSNorm", "over": "projection", "after_rotary": False, "eps": 1e-05},
      "k_norm": {"norm": "RMSNorm", "over": "projection", "after_rotary": False, "eps": 1e-05}}),
])
def test_a_named_mechanism_with_the_modules_own_parameters(
        spec: str, options: tuple[str, ...], name: str, parameters: dict | None) -> None:
    code, verdict = check(spec, *SIZES, *options)
    assert code == 0, verdict["diagnosis"]
    found = mechanisms(verdict)[name]
    if parameters is not None:
        assert {k: found[k] for k in parameters} == parameters
    else:  # gpt-oss's sinks: one learned logit per head, the numbers the words say
        logits = found["sink_logits"]
        assert len(logits) == 4 and all(isinstance(v, float) for v in logits)
        assert ", ".join(f"{v:.4g}" for v in logits) in found["words"]


def test_no_reference_when_none_was_computed() -> None:
    """A forward that raises: could not judge, and no reference to name."""
    code, verdict = check(f"{FIXTURES / 'mistakes' / 'crash.py'}:MultiHeadAttention")
    assert code == 3, verdict["diagnosis"]
    assert verdict["reference"] is None
