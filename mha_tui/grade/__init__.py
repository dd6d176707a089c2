"""Grading a class: `mha-tui check FOLDER --class C`.

- `find.py`: the submissions (files, folders, globs) and each one's student id;
- `pool.py`: the grading: a fork server (`server.py`, torch imported once), a fresh process per
  submission (`worker.py`), in a bubblewrap sandbox of its own (`sandbox.py`), several at once;
- `results.py`: the limits and what a graded submission holds;
- `gradebook.py`: the CSV.

Never imports textual or typer (an import-linter contract); only the fork server and its
workers import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .find import GradeError, Submission, find_submissions, is_batch, student_ids
from .results import Graded, Limits


def sandbox_or_why(mode: str) -> tuple[bool, str | None]:
    """--sandbox auto|required|off: whether to sandbox, and why not when it cannot be."""
    if mode == "off":
        return False, None
    from .sandbox import unavailable

    why = unavailable()
    return why is None, why


def watched_folders(submissions: Sequence[Submission]) -> list[str]:
    """The folders of the class: a submission that opens a file there other than its own is
    said to have tried (the sandbox already hides them)."""
    return sorted({str(Path(sub.file).resolve().parent) for sub in submissions if sub.file})

__all__ = ["GradeError", "Graded", "Limits", "Submission", "find_submissions", "is_batch",
           "sandbox_or_why", "student_ids", "watched_folders"]
