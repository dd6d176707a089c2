"""A tensor a helper of the module returns is named by the caller's line that receives it
(`q = self.split_heads(self.W_q(x))` names it q, `context = attention(q, k, v)` context), not
by the helper's own local (`out`, `out (2)`, `out (3)`); the quiz asks about it by that name
(issue 27, section 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_tui.config import Config, Source
from mha_tui.load.numpy_modules import load as load_numpy
from mha_tui.pipeline import run_trace
from mha_tui.quiz import questions

FIXTURE = Path(__file__).parent / "fixtures" / "helper_names.py"
NUMPY = Path(__file__).parent / "fixtures" / "numpy_helpers.py"


def _trace(cls: str, fixture: Path = FIXTURE):
    config = Config("I love AI", embed_dim=8, num_heads=2)
    source = Source(module=f"{fixture}:{cls}")
    if fixture == NUMPY:  # NumPy code is built by its own loader, and traced without torch
        return run_trace(config, loaded=load_numpy(config, source))
    return run_trace(config, source)


@pytest.mark.parametrize(("cls", "names"), [("Helpers", ["q", "k", "v"]),
                                            ("Chained", ["queries", "keys", "values"])])
def test_a_helpers_result_is_named_by_its_callers_assignment(cls: str, names: list[str]) -> None:
    trace = _trace(cls)
    for stage_id in ("view", "transpose"):
        shown = [t.name for t in trace.stage(stage_id).tensors]
        assert shown == names, (stage_id, shown)
    assert [t.name for t in trace.stage("attend").tensors][-1] == "context"
    # a local of the helper that is not what it returns keeps its own name
    assert trace.stage("scores").tensors[-1].name == "scores"


def test_the_quiz_asks_about_the_callers_names() -> None:
    asked = {q.stage: q.text for q in questions(_trace("Helpers"))}
    assert asked["view"].endswith(" v?"), asked
    assert asked["transpose"].startswith("What are the strides of v "), asked
    assert not [text for text in asked.values() if "out (" in text], asked


def test_numpy_a_helpers_result_is_named_by_its_callers_assignment() -> None:
    """The NumPy tracer records the callers too: `q = self.split_heads(x @ self.W_q)` names
    q, not split_heads' `out`; `context = attention(q, k, v)` names the attend stage's."""
    trace = _trace("NumpyHelpers", NUMPY)
    for stage_id in ("view", "transpose"):
        assert [t.name for t in trace.stage(stage_id).tensors] == ["q", "k", "v"], stage_id
    assert trace.stage("attend").tensors[-1].name == "context"
    softmax_ops = trace.stage("softmax").ops
    assert softmax_ops[-1].source.function == "softmax"
    assert [c.function for c in softmax_ops[-1].source.callers] == ["attention", "forward"]


@pytest.mark.parametrize(("cls", "fixture"), [("NestedHelper", FIXTURE), ("NumpyHelpers", NUMPY)])
def test_a_result_the_callers_line_goes_on_with_is_not_named_by_it(cls: str, fixture: Path) -> None:
    """`out = softmax(scores) @ v`: softmax's result is not `out` (the product is)."""
    trace = _trace(cls, fixture)
    assert trace.stage("softmax").tensors[-1].name != "out"
    assert trace.stage("attend").tensors[-1].name == "context"
