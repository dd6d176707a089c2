"""`--results FILE`: each submission's verdict written as it comes (one JSON line, flushed),
and `--resume`: the submissions already in it are not graded again.

A line is kept for a submission when its file holds the same bytes (sha256) and the grading
the same settings (sizes, sentence, seed, --init, --weights, --expect ...) as when it was
graded; anything else is graded again and a new line appended (the last line for a submission
wins). A verdict the grader's own limits decided (a timeout, out of memory, mha-tui's own
failure) is graded again too: the rerun may have more time. A line cut short by a stopped
grading is skipped. Never imports torch, rich, textual or typer.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any

from ..config import Config
from ..records.request import Request
from .find import Submission
from .results import Limits

# The request's fields that every fingerprint has held since results files were first
# written; a field added later counts only when it is set (not its default), so that the
# lines of an older results file still match what it graded.
_SETTINGS = ("sentence", "embed_dim", "heads", "seed", "causal", "max_seq_len", "init",
             "weights", "rotary", "window", "alibi", "rotary_base")
_DEFAULTS = Request(Config("a")).as_json()
_RETRY = frozenset({"timeout", "out_of_memory", "internal_error"})


def fingerprint(sub: Submission, limits: Limits) -> str:
    """What a verdict depends on: the submission's bytes and the grading's settings."""
    digest = hashlib.sha256(json.dumps(settings(limits.request), sort_keys=True).encode())
    digest.update((sub.module or sub.model or sub.shown).encode())
    if sub.file:
        try:
            digest.update(Path(sub.file).read_bytes())
        except OSError:
            digest.update(b"(unreadable)")
    return digest.hexdigest()


def settings(request: Request) -> dict[str, Any]:
    """The grading's settings a verdict depends on: the request but its module (each
    submission's own, hashed by its bytes), and not how long or how big it may run."""
    data = request.as_json()
    return {key: value for key, value in data.items()
            if key in _SETTINGS or (key not in ("model", "module") and value != _DEFAULTS[key])}


def graded_before(path: Path) -> dict[str, dict[str, Any]]:
    """The reports already in the results file, by fingerprint."""
    found: dict[str, dict[str, Any]] = {}
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return found
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            report = entry["report"]
            kind = (report.get("diagnosis") or {}).get("kind")
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a line cut short
        if kind in _RETRY:
            found.pop(entry["fingerprint"], None)
        else:
            found[entry["fingerprint"]] = report
    return found


class Journal:
    """The results file, appended to as each submission is graded."""

    def __init__(self, path: Path, *, resume: bool) -> None:
        self.path = path
        self._out: IO[str] = open(path, "a" if resume else "w", encoding="utf-8")

    def add(self, fingerprint: str, student: str, report: dict[str, Any]) -> None:
        self._out.write(json.dumps({"fingerprint": fingerprint, "student": student,
                                    "report": report}, allow_nan=False) + "\n")
        self._out.flush()
        os.fsync(self._out.fileno())

    def close(self) -> None:
        self._out.close()
