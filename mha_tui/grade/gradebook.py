"""What a grading writes for an instructor: the gradebook CSV (more: rubric.py, lms.py,
feedback.py, summary.py). Plain data in, plain data out: never imports torch, textual or typer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..judge.outcome import EXIT_CODES

CSV_COLUMNS = ("submission", "verdict", "exit_code", "stage", "file", "line", "diagnosis",
               "message")


def csv_rows(reports: Sequence[dict[str, Any]]) -> list[dict[str, object]]:
    """One row per module, for a spreadsheet, from the verdicts' JSON objects."""
    from ..judge.report import shown_path

    rows = []
    for report in reports:
        d = report.get("diagnosis") or {}
        rows.append({"submission": report.get("submission") or report["module"],
                     "verdict": report["verdict"], "exit_code": EXIT_CODES[report["verdict"]],
                     "stage": d.get("stage", ""), "file": shown_path(d.get("file") or ""),
                     "line": d.get("line") or "", "diagnosis": d.get("kind", ""),
                     "message": d.get("message", "")})
    return rows
