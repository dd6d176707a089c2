"""The gradebook CSV: one row per student, ready for an LMS's gradebook import. Plain data
in, plain data out: never imports torch, textual or typer.

Columns: `student` (the id, see find.student_ids), `submission`, `verdict`, `exit_code`,
`points` and `max_points` (by the rubric), one column per rubric stage with its points
earned (`end_to_end` last), then the first wrong line: `stage`, `file`, `line`,
`diagnosis`, `message`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..judge.outcome import EXIT_CODES
from .find import Submission, student_ids
from .rubric import Rubric, score, shown_points

HEAD = ("student", "submission", "verdict", "exit_code", "points", "max_points")
TAIL = ("stage", "file", "line", "diagnosis", "message")


def csv_columns(rubric: Rubric) -> list[str]:
    return [*HEAD, *rubric.stages, *TAIL]


def csv_rows(reports: Sequence[dict[str, Any]],
             rubric: Rubric | None = None) -> list[dict[str, object]]:
    """One row per module, for a spreadsheet, from the verdicts' JSON objects."""
    from ..judge.report import shown_path

    rubric = rubric or Rubric()
    fallback = student_ids([Submission(shown=r.get("submission") or r["module"],
                                       module=r["module"]) for r in reports])
    rows = []
    for report, student in zip(reports, fallback, strict=True):
        d = report.get("diagnosis") or {}
        scored = score(report, rubric)
        row: dict[str, object] = {
            "student": report.get("student") or student,
            "submission": report.get("submission") or report["module"],
            "verdict": report["verdict"], "exit_code": EXIT_CODES[report["verdict"]],
            "points": shown_points(scored.earned), "max_points": shown_points(scored.total)}
        row.update({s.stage: shown_points(s.earned) for s in scored.stages})
        row.update({"stage": d.get("stage", ""), "file": shown_path(d.get("file") or ""),
                    "line": d.get("line") or "", "diagnosis": d.get("kind", ""),
                    "message": d.get("message", "")})
        rows.append(row)
    return rows
