"""Why this number? for the NumPy blueprint (no batch axis, NumPy op names), against the
module's own number and an independent NumPy computation."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.load.numpy_modules import load
from mha_tui.pipeline import numpy_runner
from mha_tui.records import Trace
from mha_tui.why import why


@cache
def blueprint() -> Trace:
    config = Config("I love AI !", embed_dim=4, num_heads=2)
    return numpy_runner(load(config, Source(model="blueprint")))(config)


def _tensor(stage: str, name: str) -> np.ndarray:
    found = next(s for s in blueprint().stages if s.id == stage)
    return found.tensor(name).values.astype(np.float64)


@pytest.mark.parametrize("index", [(1, 3, 2), (0, 0, 0), (1, 2, 1)])
def test_softmax_weight_of_the_numpy_blueprint(index: tuple[int, ...]) -> None:
    scores = _tensor("mask", "scores_h")
    h, i, j = index
    row = np.exp(scores[h, i] - scores[h, i].max())
    expected = row[j] / row.sum()
    made = why(blueprint(), "softmax", index)
    assert made.recorded == pytest.approx(float(_tensor("softmax", "attn_h")[index]), abs=0)
    assert made.computed == pytest.approx(expected, rel=1e-6)
    assert made.computed == pytest.approx(made.recorded, rel=1e-5)


@pytest.mark.parametrize(("stage", "name", "x_of", "weight"),
                         [("project", "V", ("embed", "x"), "W_V"),
                          ("w_o", "out", ("concat", "out"), "W_O")])
def test_projection_of_the_numpy_blueprint(stage: str, name: str, x_of: tuple[str, str],
                                           weight: str) -> None:
    x, w = _tensor(*x_of), _tensor(stage, weight)
    expected = x @ w  # the blueprint's x @ W: W's column, not its row
    assert not np.allclose(expected, x @ w.T)  # the test tells a column from a row
    main = next(s for s in blueprint().stages if s.id == stage).tensors[-1]
    assert main.name == name  # the stage's last tensor is the one --why explains
    for index in [(3, 3), (0, 1), (2, 0)]:
        made = why(blueprint(), stage, index)
        assert made.computed == pytest.approx(expected[index], rel=1e-5)
        assert made.recorded == float(main.values[index])
        assert made.computed == pytest.approx(made.recorded, rel=1e-5)
        assert f"{weight}[" in made.terms[0].label


def test_embed_and_concat_of_the_numpy_blueprint() -> None:
    """Lookups and copies with no batch axis: ids (T,), context (h, T, d_h)."""
    ids = _tensor("embed", "ids").astype(int)
    table, x = _tensor("embed", "table"), _tensor("embed", "x")
    context, out = _tensor("attend", "context"), _tensor("concat", "out")
    joined = context.transpose(1, 0, 2).reshape(out.shape)  # heads side by side, by NumPy
    for t, c in [(3, 3), (0, 1), (2, 2)]:
        made = why(blueprint(), "embed", (t, c))
        assert made.computed == table[ids[t], c] == made.recorded == x[t, c]
        made = why(blueprint(), "concat", (t, c))
        assert made.computed == joined[t, c] == made.recorded == out[t, c]


def test_transpose_of_the_numpy_blueprint() -> None:
    """NumPy's transpose(1, 0, 2): all three axes, (T, h, d_h) -> (h, T, d_h)."""
    before, after = _tensor("view", "V"), _tensor("transpose", "V")
    for h, t, d in [(1, 3, 1), (0, 2, 0), (1, 0, 1)]:
        made = why(blueprint(), "transpose", (h, t, d))
        assert made.computed == before[t, h, d] == made.recorded == after[h, t, d]
        assert f"[{t}, {h}, {d}]" in made.terms[0].label
