"""What grading runs with and what it gives back: the limits, a graded submission, and the
JSON object of one that could not be judged. Plain data: never imports torch, rich, textual or
typer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..judge.outcome import COULD_NOT_JUDGE, EXIT_CODES, Outcome
from ..records.request import Request
from ..records.verdict import Diagnosis, Verdict
from .find import Submission

DEFAULT_TIMEOUT = 20.0  # seconds per submission
DEFAULT_MEMORY = 2048 << 20  # bytes a submission may map beyond what mha-tui itself uses
MAX_WRITE = 64 << 20  # bytes any one file of a worker (its log: the learner's prints) may hold
MAX_PROCESSES = 32  # processes (threads count too) a sandboxed submission may have at once


@dataclass(frozen=True)
class Limits:
    """What every submission is run with: the Request `check` built (its sentence, sizes,
    --init, --weights, --expect ...; each submission's module replaces its source's), and
    the grading's limits (how long and how big)."""

    request: Request
    timeout: float = DEFAULT_TIMEOUT
    memory: int = DEFAULT_MEMORY
    processes: int = MAX_PROCESSES


@dataclass(frozen=True)
class Graded:
    """A submission's result: the verdict's JSON object, as `check --format json` gives it
    for one module, with `verdict` one of the three outcomes."""

    submission: Submission
    report: dict[str, Any]

    @property
    def outcome(self) -> Outcome:
        return self.report["verdict"]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]


def unjudged(module: str, kind: str, message: str, *, file: str = "", line: int = 0,
             stage: str = "") -> dict[str, Any]:
    """The JSON object of a submission that could not be judged, shaped as a verdict's."""
    from ..judge.report import verdict_json

    report = verdict_json(Verdict(module, False, (), Diagnosis(kind, file, line, message, stage)))
    report["verdict"] = COULD_NOT_JUDGE
    return report
