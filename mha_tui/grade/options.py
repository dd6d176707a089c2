"""What `check`'s grading options ask for, checked before anything runs, and the files they
write at the end: the CLI only declares the options and calls these. Never imports torch,
textual or typer."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .find import GradeError
from .rubric import Rubric, RubricError, load_rubric
from .session import Outputs

LMS_FORMATS = ("gradescope", "prairielearn")


@dataclass(frozen=True)
class GradingOutputs:
    session: Outputs
    grading: bool  # an option that only grading writes: grade even one module that way


def grading_outputs(*, rubric: Path | None, feedback: Path | None, summary: Path | None,
                    results: Path | None, resume: bool, fmt: str, count: int) -> GradingOutputs:
    """The grading options, checked. Raises GradeError (one line, exit code 2)."""
    try:
        chosen = load_rubric(rubric) if rubric is not None else Rubric()
    except RubricError as error:
        raise GradeError(str(error)) from None
    if resume and results is None:
        raise GradeError("--resume needs --results FILE: the file it reads back")
    if fmt in LMS_FORMATS and count != 1:
        raise GradeError(f"--format {fmt} writes one submission's results.json (its "
                         f"autograder runs one submission at a time); got {count} modules")
    if feedback is not None and feedback.exists() and not feedback.is_dir():
        raise GradeError(f"--feedback {feedback}: not a folder")
    for option, path in (("--summary", summary), ("--results", results)):
        if path is None:
            continue
        if path.is_dir():
            raise GradeError(f"{option} {path}: is a folder; give a file")
        if not path.parent.is_dir() if str(path.parent) else False:
            raise GradeError(f"{option} {path}: no folder {path.parent}")
        if not os.access(path.parent if not path.exists() else path, os.W_OK):
            raise GradeError(f"{option} {path}: not writable")
    outputs = Outputs(rubric=chosen, results=results, resume=resume, feedback=feedback)
    grading = feedback is not None or summary is not None or results is not None
    return GradingOutputs(outputs, grading)


def write_summary(path: Path, reports: list[dict[str, Any]], rubric: Rubric) -> None:
    """The class summary as JSON, written whole, then renamed into place."""
    from .summary import class_summary

    text = json.dumps(class_summary(reports, rubric), indent=1, allow_nan=False) + "\n"
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".summary-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_gradebook(out: IO[str], reports: list[dict[str, Any]], fmt: str,
                    rubric: Rubric) -> None:
    """--format csv (one row per student), gradescope or prairielearn (one results.json)."""
    if fmt in LMS_FORMATS:
        from . import lms

        document = (lms.gradescope if fmt == "gradescope" else lms.prairielearn)(reports[0],
                                                                                  rubric)
        out.write(json.dumps(document, indent=1, allow_nan=False) + "\n")
        return
    import csv

    from .gradebook import csv_columns, csv_rows

    writer = csv.DictWriter(out, fieldnames=csv_columns(rubric), lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(reports, rubric))
