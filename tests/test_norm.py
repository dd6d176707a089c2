"""A LayerNorm inside the attention module (issue 17): its own stage, claimed by the op and
checked on the values."""

from __future__ import annotations

import numpy as np

from mha_tui.config import Config
from mha_tui.recognise.run import recognise
from mha_tui.records import Recording, Ref

from .test_rules import C, T, Tape, _param, _snap, _whole


def _normed(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) * weight + bias


def _prenorm_tape(output_off: float = 0.0) -> Tape:
    """layer_norm(x) first, then the textbook forward on its output; output_off shifts what
    the recorded layer_norm returned (a norm that is not what it claims)."""
    tape = Tape()
    tape.x = Ref("input", name="x", snapshot=_snap(tape.x_values))
    weight = np.linspace(0.5, 1.5, C).astype(np.float32)
    bias = np.linspace(-0.1, 0.1, C).astype(np.float32)
    normed = tape.op("layer_norm", [tape.x, _param("norm.weight", weight), _param("norm.bias", bias)],
                     _normed(tape.x_values, weight, bias).astype(np.float32) + output_off, (C,), 1e-5)
    original_x = tape.x
    tape.x = normed  # the rest of the forward reads the normalised x
    _whole(tape)
    tape.x = original_x
    return tape


def _stages(tape: Tape):  # type: ignore[no-untyped-def]
    rec = Recording("Attn", "attn.py", (("x", _snap(tape.x_values)),), tuple(tape.ops))
    return recognise(rec, Config(" ".join("abcdefgh"[:T]), embed_dim=C, num_heads=2))


def test_a_layer_norm_on_x_is_its_own_stage() -> None:
    tape = _prenorm_tape()
    assert tape.kinds()[0] == "norm"
    stage = next(s for s in _stages(tape) if s.kind == "norm")
    assert stage.title.startswith("LayerNorm inside the module")
    assert stage.checks[0].ok is True


def test_a_norm_whose_output_is_not_the_normalised_input_fails_its_check() -> None:
    stage = next(s for s in _stages(_prenorm_tape(output_off=0.5)) if s.kind == "norm")
    assert stage.checks[0].ok is False


def test_a_layer_norm_after_attention_is_not_this_stage() -> None:
    """BERT's LayerNorm(dense(context) + x) comes after attend: not a norm on the input."""
    tape = Tape()
    steps = _whole(tape)
    out = tape.values(steps["out"])
    tape.op("layer_norm", [steps["out"]], _normed(out, np.ones(C), np.zeros(C)), (C,), 1e-5)
    assert tape.kinds()[-1] != "norm"
