"""A module is judged as its author builds it (issue 27): a constructor's own `dropout=0.1`
is kept, not replaced by 0.0, so dropout left active in eval mode (handed to
F.scaled_dot_product_attention unconditionally) is found by `check` without `--init`;
a `dropout` with no default still gets 0.0."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.config import Config
from mha_tui.load.learner import constructor_arguments

FIXTURE = Path(__file__).parent / "fixtures" / "dropout_defaults.py"
runner = CliRunner()


def _check(name: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["check", f"{FIXTURE}:{name}", "--format", "json"])
    return result.exit_code, json.loads(result.stdout)


def test_a_class_default_dropout_is_kept_and_a_required_one_filled() -> None:
    class Defaulted:
        def __init__(self, d_model: int, n_heads: int, dropout: float = 0.1) -> None: ...

    class Required:
        def __init__(self, d_in: int, num_heads: int, dropout: float) -> None: ...

    config = Config("I love AI !")
    assert "dropout" not in constructor_arguments(Defaulted, config, {})
    assert constructor_arguments(Defaulted, config, {"dropout": 0.0})["dropout"] == 0.0
    assert constructor_arguments(Required, config, {})["dropout"] == 0.0


def test_dropout_active_in_eval_mode_is_found_with_the_authors_default() -> None:
    code, verdict = _check("AlwaysDropout")
    assert code == 1 and verdict["equivalent"] is False
    assert verdict["diagnosis"]["kind"] == "dropout_active", verdict["diagnosis"]
    assert "dropout_p=0.1" in verdict["diagnosis"]["message"]


def test_dropout_only_while_training_is_equivalent_with_the_same_default() -> None:
    code, verdict = _check("TrainingOnlyDropout")
    assert code == 0 and verdict["equivalent"] is True, verdict["diagnosis"]
