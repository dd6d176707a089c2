"""One grading of a class, start to end: the submissions already graded (`--resume`) kept,
the others graded (pool.py), and each result written as it comes: a line in the results file
(journal.py) and the student's feedback file (feedback.py). A submission that hangs, crashes
or attacks is one "could not judge" row: it never loses the others' results.

Never imports torch, textual or typer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .feedback import file_name, write_feedback
from .find import Submission, student_ids
from .journal import Journal, fingerprint, graded_before
from .results import Graded, Limits
from .rubric import Rubric


@dataclass(frozen=True)
class Outputs:
    """Where the results go as they come."""

    rubric: Rubric = field(default_factory=Rubric)
    results: Path | None = None  # --results FILE (JSON lines)
    resume: bool = False  # --resume: keep what the results file already holds
    feedback: Path | None = None  # --feedback DIR

    def folders(self) -> list[str]:
        """The grader's output folders: no submission may write (or read) there."""
        places = [self.feedback, self.results.parent if self.results else None]
        return [str(p.resolve()) for p in places if p is not None]


def grade_class(submissions: Sequence[Submission], limits: Limits, outputs: Outputs, *,
                jobs: int, sandbox: bool, watched: Sequence[str],
                progress: Callable[[Graded], None] | None = None) -> list[dict[str, Any]]:
    """Every submission's report (with its `student` id), in the order given."""
    from .pool import grade

    students = student_ids(submissions)
    prints = [fingerprint(sub, limits) for sub in submissions]
    before = graded_before(outputs.results) if outputs.resume and outputs.results else {}
    reports: dict[int, dict[str, Any]] = {}
    todo: list[int] = []
    for i, sub in enumerate(submissions):
        if prints[i] in before:
            reports[i] = {**before[prints[i]], "submission": sub.shown, "student": students[i]}
        else:
            todo.append(i)
    index = {id(submissions[i]): i for i in todo}
    journal = Journal(outputs.results, resume=outputs.resume) if outputs.results else None
    if outputs.feedback is not None:
        outputs.feedback.mkdir(parents=True, exist_ok=True)
        for i, report in reports.items():  # resumed: its feedback too, if it was lost
            if not (outputs.feedback / file_name(students[i])).exists():
                write_feedback(outputs.feedback, students[i], report, outputs.rubric)

    def done(graded: Graded) -> None:
        i = index[id(graded.submission)]
        report = {**graded.report, "student": students[i]}
        reports[i] = report
        if journal is not None:
            journal.add(prints[i], students[i], report)
        if outputs.feedback is not None:
            write_feedback(outputs.feedback, students[i], report, outputs.rubric)
        if progress is not None:
            progress(graded)

    try:
        if todo:
            grade([submissions[i] for i in todo], limits, jobs=jobs, done=done,
                  sandbox=sandbox, watched=[*watched, *outputs.folders()])
    finally:
        if journal is not None:
            journal.close()
    return [reports[i] for i in range(len(submissions))]
