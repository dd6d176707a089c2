"""A tensor a helper of the module returns is named by the caller's line that receives it
(`q = self.split_heads(self.W_q(x))` names it q, `context = attention(q, k, v)` context), not
by the helper's own local (`out`, `out (2)`, `out (3)`); the quiz asks about it by that name
(issue 27, section 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.quiz import questions

FIXTURE = Path(__file__).parent / "fixtures" / "helper_names.py"


def _trace(cls: str):
    return run_trace(Config("I love AI", embed_dim=8, num_heads=2),
                     Source(module=f"{FIXTURE}:{cls}"))


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
