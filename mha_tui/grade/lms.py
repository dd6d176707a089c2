"""Results files an LMS takes, for one submission (the way their autograders run: one
submission per container), from its verdict and the rubric.

- Gradescope's `results.json`: `score` (the points earned), `output`, and one test per rubric
  stage with `score`, `max_score`, `status` (passed / failed), `output` and `visibility`
  (hidden stages: `hidden`; every other: `visible`).
- PrairieLearn's external grader `results.json`: `gradable` (false when the submission could
  not be judged: a timeout, a crash, what the sandbox caught), `score` in [0, 1], `message`,
  and one test per stage with `points`, `max_points`, `message`.

Both in the words `check` uses. Plain data: never imports torch, rich, textual or typer.
"""

from __future__ import annotations

from typing import Any

from ..judge.outcome import COULD_NOT_JUDGE
from .rubric import END_TO_END, Rubric, StageScore, score


def _title(stage: str) -> str:
    return "end to end: the whole module equivalent" if stage == END_TO_END else f"stage: {stage}"


def _said(row: StageScore) -> str:
    if row.ok is None:
        return "not judged" if row.checked == "" else f"not judged: {row.checked}"
    return f"{'right' if row.ok else 'WRONG'}: {row.checked}" if row.checked else \
        ("right" if row.ok else "WRONG")


def summary_line(report: dict[str, Any]) -> str:
    """The verdict and, when there is one, the first wrong line's diagnosis, in check's words."""
    said = f"verdict: {report['verdict']}"
    diagnosis = report.get("diagnosis")
    if diagnosis:
        parts = [f"line {diagnosis['line']}"] if diagnosis.get("line") else []
        parts += [f"stage {diagnosis['stage']}"] if diagnosis.get("stage") else []
        where = f" ({', '.join(parts)})" if parts else ""
        said += f"\n{diagnosis['kind']}{where}: {diagnosis['message']}"
    return said


def _visible_summary(report: dict[str, Any], rubric: Rubric) -> str:
    """The summary, without a diagnosis whose stage is hidden."""
    diagnosis = report.get("diagnosis") or {}
    if diagnosis.get("stage") in rubric.hidden:
        return f"verdict: {report['verdict']}"
    return summary_line(report)


def gradescope(report: dict[str, Any], rubric: Rubric) -> dict[str, Any]:
    scored = score(report, rubric)
    tests = [{"name": _title(row.stage), "score": row.earned, "max_score": row.points,
              "status": "passed" if row.ok else "failed", "output": _said(row),
              "visibility": "hidden" if row.hidden else "visible"} for row in scored.stages]
    return {"score": scored.earned, "output": _visible_summary(report, rubric),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def prairielearn(report: dict[str, Any], rubric: Rubric) -> dict[str, Any]:
    scored = score(report, rubric)
    gradable = report["verdict"] != COULD_NOT_JUDGE
    tests = [{"name": _title(row.stage), "points": row.earned, "max_points": row.points,
              "message": "(hidden)" if row.hidden else _said(row)} for row in scored.stages]
    return {"gradable": gradable,
            "score": round(scored.earned / scored.total, 6) if gradable and scored.total else 0.0,
            "message": _visible_summary(report, rubric), "tests": tests if gradable else []}
