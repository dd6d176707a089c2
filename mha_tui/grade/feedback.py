"""`--feedback DIR`: one Markdown file per student, written as each submission is graded.

Each holds that student's verdict, the first wrong line with its diagnosis, and the stage by
stage table with points, in the words `check` uses; the file is named by the student id
alone and shows the student's own file by its name alone (no folder of the instructor's, no
other student). Hidden stages (the rubric's) show as hidden, and a diagnosis at a hidden stage
is not shown. Written whole to a temporary file, then renamed: a stopped grading never leaves
half a file. Plain data: never imports torch, rich, textual or typer.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .rubric import END_TO_END, Rubric, score, shown_points

_MARKS = {True: "✓ right", False: "✗ wrong", None: "· not judged"}
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped, no HTML."""
    text = " ".join(str(text).split())
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def file_name(student: str) -> str:
    """The feedback file's name for a student id: only letters, digits, `.`, `_`, `-`."""
    return (_SAFE.sub("_", student).strip("._") or "student") + ".md"


def feedback(student: str, report: dict[str, Any], rubric: Rubric) -> str:
    scored = score(report, rubric)
    own = Path(report.get("submission") or report.get("module") or "").name.partition(":")[0]
    lines = [f"# {cell(student)}", "",
             f"**{report['verdict']}**: {shown_points(scored.earned)} of "
             f"{shown_points(scored.total)} points"
             + (f" (`{cell(own)}`)" if own else ""), ""]
    diagnosis = report.get("diagnosis")
    if diagnosis and diagnosis.get("stage") not in rubric.hidden:
        where = f"line {diagnosis['line']}" if diagnosis.get("line") else "the module"
        stage = f", stage `{diagnosis['stage']}`" if diagnosis.get("stage") else ""
        heading = ("## The first wrong line" if report["verdict"] == "NOT equivalent"
                   else "## Why it could not be judged")
        lines += [heading, "", f"{where}{stage} (`{cell(diagnosis['kind'])}`): "
                  f"{cell(diagnosis['message'])}", ""]
    lines += ["## Stage by stage", "", "| stage | result | points | what check checked |",
              "| --- | --- | --- | --- |"]
    for row in scored.stages:
        name = "end to end" if row.stage == END_TO_END else row.stage
        if row.hidden:
            lines.append(f"| {name} | hidden | | |")
            continue
        lines.append(f"| {name} | {_MARKS[row.ok]} | {shown_points(row.earned)} / "
                     f"{shown_points(row.points)} | {cell(row.checked)} |")
    return "\n".join(lines) + "\n"


def write_feedback(folder: Path, student: str, report: dict[str, Any], rubric: Rubric) -> Path:
    """The student's feedback file in folder, written whole, then renamed into place."""
    target = folder / file_name(student)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".feedback-", suffix=".md")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(feedback(student, report, rubric))
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
