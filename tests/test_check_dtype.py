"""`check --dtype`: a learner's module judged in bfloat16 or float16 (cast with
module.to(dtype), as `explain --dtype` runs it), every check allowing that dtype's rounding;
each mistake is still found on its line, each correct variant still equivalent, and the
verdict says the dtype, in one process and through grading's workers.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from mha_tui.config import Config
from mha_tui.pipeline import check_source
from mha_tui.records.request import Source

from .conftest import run_cli
from .test_check import CATALOGUE, MISTAKES, SENTENCE, VARIANTS, marked_line

HALF = ("bfloat16", "float16")


def judged(spec: str, dtype: str):
    config = Config(SENTENCE, embed_dim=4, num_heads=2, dtype=dtype)
    return check_source(config, Source(module=spec))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", sorted(set(CATALOGUE) - {"crash"}))
def test_each_mistake_is_found_on_its_line_in_half_precision(name: str, dtype: str) -> None:
    """The same diagnosis on the same line as in float32: the dtype's rounding (2^-6 for
    bfloat16) is far below what any of these mistakes changes."""
    path = MISTAKES / f"{name}.py"
    verdict = judged(f"{path}:MultiHeadAttention", dtype)
    assert not verdict.equivalent and verdict.dtype == dtype
    assert verdict.diagnosis is not None
    assert verdict.diagnosis.kind == CATALOGUE[name][0], verdict.diagnosis
    assert verdict.diagnosis.line == marked_line(path)
    assert os.path.samefile(verdict.diagnosis.file, path)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("spec", VARIANTS)
def test_correct_variants_are_equivalent_in_half_precision(spec: str, dtype: str) -> None:
    """Each correct variant, cast to the dtype: equivalent, within that dtype's rounding,
    and its numbers are the half-precision module's own (they differ from float32's)."""
    verdict = judged(spec, dtype)
    assert verdict.equivalent, (verdict.diagnosis, verdict.stages)
    assert verdict.dtype == dtype
    end = verdict.end_to_end
    assert end is not None and end.ok and end.max_diff is not None
    float32 = judged(spec, "").end_to_end
    assert float32 is not None and float32.max_diff is not None
    assert end.max_diff > float32.max_diff  # the half-precision rounding, allowed


def test_the_verdict_says_the_dtype_in_text_and_json() -> None:
    spec = f"{MISTAKES / 'correct.py'}:MultiHeadAttention"
    result = run_cli("check", spec, "--dtype", "bfloat16")
    assert result.returncode == 0, result.stderr
    words = " ".join(result.stdout.decode().split())  # (the heading wraps)
    assert "equivalent to multi-head attention (judged in bfloat16: every check allows its " \
           "rounding)" in words
    plain = run_cli("check", spec)
    assert plain.returncode == 0 and b"judged in" not in plain.stdout
    result = run_cli("check", spec, "--dtype", "float16", "--format", "json")
    assert json.loads(result.stdout)["dtype"] == "float16"
    assert "dtype" not in json.loads(run_cli("check", spec, "--format", "json").stdout)


def test_grading_judges_every_submission_in_the_dtype(tmp_path: Path) -> None:
    """Several submissions are graded each in its own process: --dtype reaches every worker
    through check's Request."""
    for name in ("correct", "no_scale"):
        shutil.copy(MISTAKES / f"{name}.py", tmp_path / f"{name}.py")
    result = run_cli("check", str(tmp_path), "--class", "MultiHeadAttention", "--dtype",
                     "bfloat16", "--format", "json")
    assert result.returncode == 1, result.stderr
    rows = {Path(row["submission"]).stem: row for row in json.loads(result.stdout)}
    assert {name: row["dtype"] for name, row in rows.items()} == {
        "correct": "bfloat16", "no_scale": "bfloat16"}
    assert rows["correct"]["equivalent"] and rows["no_scale"]["diagnosis"]["kind"] == "not_scaled"


def test_numpy_code_is_refused_with_dtype() -> None:
    result = run_cli("check", "--model", "blueprint", "--dtype", "bfloat16")
    assert result.returncode == 2 and result.stderr.count(b"\n") == 1, result.stderr
    assert b"--dtype bfloat16" in result.stderr
