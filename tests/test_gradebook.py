"""What a grading gives an instructor: the rubric's points, Gradescope's and PrairieLearn's
results.json, the gradebook CSV (one row per student), a feedback file per student, the class
summary, results written as they come and `--resume`.

The verdicts are real ones (the fixtures' mistakes, judged); the points, counts and files are
checked against what each verdict says, not typed in.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mha_tui.grade import Submission, student_ids
from mha_tui.grade.rubric import DEFAULT_POINTS, Rubric, RubricError, load_rubric, score
from mha_tui.judge.outcome import COULD_NOT_JUDGE, EQUIVALENT, NOT_EQUIVALENT

from .conftest import ROOT, run_cli, sigint_as_a_terminal_gives_it

MISTAKES = Path(ROOT, "tests", "fixtures", "mistakes")
CLASS = "MultiHeadAttention"


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    """Real verdicts, judged in this process: right, wrong (no scale), crashed."""
    from typer.testing import CliRunner

    from mha_tui.cli import app

    found = {}
    for name, file in (("right", "correct.py"), ("wrong", "no_scale.py"), ("crash", "crash.py")):
        result = CliRunner().invoke(app, ["check", f"{MISTAKES / file}:{CLASS}", "--format",
                                          "json"])
        found[name] = json.loads(result.stdout)
    return found


def test_the_default_rubric_scores_each_stage_by_the_verdict(verdicts: dict[str, dict]) -> None:
    rubric = Rubric()
    right, wrong = score(verdicts["right"], rubric), score(verdicts["wrong"], rubric)
    assert right.earned == right.total == sum(DEFAULT_POINTS.values())
    by_stage = {s.stage: s for s in wrong.stages}
    failing = {stage["kind"] for stage in verdicts["wrong"]["stages"] if stage["ok"] is False}
    assert failing == {"scale", "end_to_end"}
    assert {name for name, s in by_stage.items() if s.earned == 0} == failing
    assert wrong.earned == wrong.total - DEFAULT_POINTS["scale"] - DEFAULT_POINTS["end_to_end"]
    assert score(verdicts["crash"], rubric).earned == 0


def test_a_rubric_file_changes_points_hides_stages_and_refuses_typos(tmp_path: Path) -> None:
    good = tmp_path / "rubric.toml"
    good.write_text('hidden = ["w_o"]\n[points]\nmask = 2\nscale = 1\nend_to_end = 5\n')
    rubric = load_rubric(good)
    points = dict(rubric.points)
    assert points["mask"] == 2 and points["end_to_end"] == 5 and points["project"] == 1
    assert rubric.stages[-1] == "end_to_end" and rubric.hidden == {"w_o"}
    only = tmp_path / "only.toml"
    only.write_text("only = true\n[points]\nscale = 3\nend_to_end = 2\n")
    assert load_rubric(only).points == (("scale", 3.0), ("end_to_end", 2.0))
    for text, said in (("[points]\nsoftmx = 1\n", "'softmx' is not a stage"),
                       ("[points]\nmask = -1\n", "points are a number >= 0"),
                       ("[points\n", "not a TOML file"),
                       ("color = 1\n", "unknown key 'color'")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(RubricError, match=said):
            load_rubric(bad)


def test_student_ids_from_file_or_folder_names(tmp_path: Path) -> None:
    subs = [Submission(shown=p, module=f"{p}:M") for p in
            ("c/ada/attn.py", "c/bo/attn.py", "c/cy.py", "d/cy.py")]
    assert student_ids(subs) == ["ada", "bo", "c", "d"]
    assert student_ids([Submission(shown="x", module="c/ada.py:M"),
                        Submission(shown="y", module="c/ada.py:M")]) == ["c", "c-2"]


def _lms(fmt: str, file: str, *extra: str) -> tuple[int, dict]:
    result = run_cli("check", f"{MISTAKES / file}:{CLASS}", "--format", fmt, *extra, timeout=300)
    return result.returncode, json.loads(result.stdout)


def test_gradescope_results_json(tmp_path: Path, verdicts: dict[str, dict]) -> None:
    rubric = tmp_path / "rubric.toml"
    rubric.write_text('hidden = ["mask"]\n[points]\nmask = 2\n')
    code, results = _lms("gradescope", "no_scale.py", "--rubric", str(rubric))
    assert code == 1
    tests = {t["name"].removeprefix("stage: "): t for t in results["tests"]}
    assert results["score"] == sum(t["score"] for t in results["tests"])
    assert sum(t["max_score"] for t in results["tests"]) == load_rubric(rubric).total
    assert tests["scale"]["status"] == "failed" and tests["scale"]["score"] == 0
    assert tests["mask"] == {**tests["mask"], "visibility": "hidden", "max_score": 2,
                             "score": 2, "status": "passed"}
    assert all(t["visibility"] == "visible" for name, t in tests.items() if name != "mask")
    assert verdicts["wrong"]["diagnosis"]["message"] in results["output"]
    assert "NOT equivalent" in results["output"]


def test_prairielearn_results_json(verdicts: dict[str, dict]) -> None:
    code, results = _lms("prairielearn", "no_scale.py")
    assert code == 1 and results["gradable"] is True
    earned = sum(t["points"] for t in results["tests"])
    total = sum(t["max_points"] for t in results["tests"])
    assert 0 < results["score"] < 1 and results["score"] == pytest.approx(earned / total)
    code, crashed = _lms("prairielearn", "crash.py")
    assert code == 3 and crashed["gradable"] is False and crashed["score"] == 0
    assert verdicts["crash"]["diagnosis"]["message"] in crashed["message"]


def test_lms_formats_take_one_submission(tmp_path: Path) -> None:
    result = run_cli("check", f"{MISTAKES / 'correct.py'}:{CLASS}",
                     f"{MISTAKES / 'no_scale.py'}:{CLASS}", "--format", "gradescope")
    assert result.returncode == 2 and result.stdout == b""
    assert b"writes one submission's results.json" in result.stderr


def _class(tmp_path: Path) -> Path:
    """A class in per-student folders: ada right, bo wrong (no scale), cy wrong (no mask)."""
    folder = tmp_path / "class"
    for student, file in (("ada", "correct.py"), ("bo", "no_scale.py"),
                          ("cy", "mask_missing.py")):
        (folder / student).mkdir(parents=True)
        shutil.copy(MISTAKES / file, folder / student / "attn.py")
    return folder


def test_csv_feedback_and_summary_for_a_class(tmp_path: Path) -> None:
    folder, feedback, summary = _class(tmp_path), tmp_path / "feedback", tmp_path / "summary.json"
    result = run_cli("check", f"{folder}/*/attn.py", "--class", CLASS, "--format", "csv",
                     "--feedback", str(feedback), "--summary", str(summary), timeout=600)
    assert result.returncode == 1, result.stderr.decode()
    rows = {row["student"]: row for row in csv.DictReader(io.StringIO(result.stdout.decode()))}
    assert list(rows) == ["ada", "bo", "cy"]
    rubric = Rubric()
    for row in rows.values():  # the total is the sum of the stage columns
        assert float(row["points"]) == sum(float(row[stage]) for stage in rubric.stages)
        assert row["max_points"] == "15"
    assert rows["ada"]["verdict"] == EQUIVALENT and rows["ada"]["points"] == "15"
    assert rows["bo"]["scale"] == "0" and rows["bo"]["diagnosis"] == "not_scaled"
    assert rows["cy"]["verdict"] == NOT_EQUIVALENT and rows["cy"]["stage"] == "mask"

    files = sorted(p.name for p in feedback.iterdir())
    assert files == ["ada.md", "bo.md", "cy.md"]
    bo = (feedback / "bo.md").read_text()
    assert bo.startswith("# bo\n") and f"**{NOT_EQUIVALENT}**: {rows['bo']['points']} of 15" in bo
    assert rows["bo"]["message"] in bo and f"line {rows['bo']['line']}, stage `scale`" in bo
    assert "| scale | ✗ wrong | 0 / 1 |" in bo
    for name in files:  # nothing from another student, no instructor's folder
        text = (feedback / name).read_text()
        others = {"ada", "bo", "cy"} - {name.removesuffix(".md")}
        assert not any(f"# {other}" in text or f"/{other}/" in text for other in others)
        assert str(tmp_path) not in text

    data = json.loads(summary.read_text())
    assert (data["submissions"], data["equivalent"], data["not_equivalent"],
            data["could_not_judge"]) == (3, 1, 2, 0)
    firsts = {row["stage"]: row["count"] for row in data["first_wrong_stage"]}
    assert firsts == {rows["bo"]["stage"]: 1, rows["cy"]["stage"]: 1}
    kinds = {row["kind"] for row in data["diagnoses"]}
    assert kinds == {rows["bo"]["diagnosis"], rows["cy"]["diagnosis"]}
    assert data["mean_points"] == pytest.approx(
        round(sum(float(r["points"]) for r in rows.values()) / 3, 2))

    text = run_cli("check", f"{folder}/*/attn.py", "--class", CLASS, "--width", "120",
                   timeout=600).stdout.decode()
    assert "class summary" in text and "first wrong at mask" in text


def test_results_come_as_they_are_graded_and_resume_skips_them(tmp_path: Path) -> None:
    """A grading stopped in the middle keeps what it graded; --resume grades only the rest,
    and again after a file changed, only that file (and what timed out, given another try)."""
    folder = _class(tmp_path)
    (folder / "dee").mkdir()
    hang = (MISTAKES / "correct.py").read_text().replace(
        "        B, T, C = x.shape\n", "        B, T, C = x.shape\n        while True: pass\n", 1)
    (folder / "dee" / "attn.py").write_text(hang)  # last by name: graded last with --jobs 1
    results = tmp_path / "results.jsonl"
    argv = [sys.executable, "-m", "mha_tui", "check", f"{folder}/*/attn.py", "--class", CLASS,
            "--results", str(results), "--jobs", "1", "--format", "csv"]
    process = subprocess.Popen([*argv, "--timeout", "3600"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=sigint_as_a_terminal_gives_it)
    try:
        deadline = time.monotonic() + 600  # a hang guard, not a timing assertion
        while time.monotonic() < deadline and process.poll() is None and \
                (not results.exists() or len(results.read_text().splitlines()) < 3):
            time.sleep(0.2)
        assert len(results.read_text().splitlines()) == 3, process.stderr.read() \
            if process.poll() is not None else "three results within 600 s"
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=300)
        except subprocess.TimeoutExpired:  # once in a fresh-clone run: say what it was doing
            process.kill()
            _, err = process.communicate()
            raise AssertionError("the grader did not stop within 300 s of SIGINT; its stderr: "
                                 + err.decode("utf-8", "replace")[-3000:]) from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    kept = [json.loads(line)["student"] for line in results.read_text().splitlines()]
    assert kept == ["ada", "bo", "cy"]

    resumed = subprocess.run([*argv, "--timeout", "5", "--resume"], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 3, resumed.stderr
    lines = results.read_text().splitlines()
    assert [json.loads(line)["student"] for line in lines] == ["ada", "bo", "cy", "dee"]
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(resumed.stdout))}
    assert rows["dee"]["verdict"] == COULD_NOT_JUDGE and rows["dee"]["diagnosis"] == "timeout"
    assert rows["bo"]["diagnosis"] == "not_scaled"  # from the results file, as graded

    shutil.copy(MISTAKES / "correct.py", folder / "bo" / "attn.py")  # bo fixed it
    again = subprocess.run([*argv, "--timeout", "5", "--resume"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    added = results.read_text().splitlines()[len(lines):]
    # bo changed; dee timed out, a verdict of the grader's limits: tried again
    assert [json.loads(line)["student"] for line in added] == ["bo", "dee"]
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(again.stdout))}
    assert rows["bo"]["verdict"] == EQUIVALENT and rows["dee"]["diagnosis"] == "timeout"


@pytest.mark.parametrize("args,said", [
    (["--resume"], "--resume needs --results FILE"),
    (["--rubric", "/nonexistent/rubric.toml"], "--rubric /nonexistent/rubric.toml:"),
    (["--summary", "/nonexistent/dir/s.json"], "--summary /nonexistent/dir/s.json: no folder")])
def test_grading_options_refused_in_one_line(tmp_path: Path, args: list[str], said: str) -> None:
    shutil.copy(MISTAKES / "correct.py", tmp_path / "a.py")
    result = run_cli("check", str(tmp_path), "--class", CLASS, *args)
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode().startswith(f"mha-tui: error: {said}")
    assert len(result.stderr.splitlines()) == 1
