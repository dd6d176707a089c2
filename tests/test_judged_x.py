"""The check follows x, never a mask passed by name: a 4-D float `attention_mask` (Hugging
Face's additive mask, (B, 1, T, T)) is not counted as x beside the hidden states (issue 27)."""

from __future__ import annotations

import numpy as np

from mha_tui.kinds._parts.judging import judged_x
from mha_tui.records import Recording, Snapshot


def _snap(values: np.ndarray) -> Snapshot:
    return Snapshot(values=values, shape=values.shape, strides=(), contiguous=True, storage=id(values),
                    dtype=str(values.dtype))


def test_a_float_attention_mask_is_not_x() -> None:
    x = np.zeros((1, 3, 4), np.float32)
    additive = np.zeros((1, 1, 3, 3), np.float32)
    rec = Recording("M", "m.py", (("hidden_states", _snap(x)), ("attention_mask", _snap(additive))), ())
    assert judged_x(rec) == {"hidden_states"}


def test_q_k_v_given_apart_are_all_x() -> None:
    q = np.zeros((1, 2, 3, 2), np.float32)
    rec = Recording("M", "m.py", (("q", _snap(q)), ("k", _snap(q)), ("v", _snap(q))), ())
    assert judged_x(rec) == {"q", "k", "v"}
