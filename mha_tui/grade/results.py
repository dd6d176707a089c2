"""What grading runs with and what it gives back: the limits, a graded submission, and the
JSON object of one that could not be judged. Plain data: never imports torch, rich, textual or
typer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..judge.outcome import COULD_NOT_JUDGE, EXIT_CODES, Outcome
from ..records.verdict import Diagnosis, Verdict
from .find import Submission

DEFAULT_TIMEOUT = 20.0  # seconds per submission
DEFAULT_MEMORY = 2048 << 20  # bytes a submission may map beyond what mha-tui itself uses
MAX_WRITE = 64 << 20  # bytes any one file of a worker (its log: the learner's prints) may hold
MAX_PROCESSES = 32  # processes (threads count too) a sandboxed submission may have at once


@dataclass(frozen=True)
class Limits:
    """What every submission is run with: the check's sizes and the grading limits."""

    sentence: str
    embed_dim: int
    heads: int
    seed: int
    causal: bool
    max_seq_len: int
    init: tuple[str, ...] = ()  # --init texts, parsed again by the worker
    weights: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    memory: int = DEFAULT_MEMORY
    rotary: bool = False  # --expect rotary
    window: int | None = None  # --window N
    alibi: bool = False  # --expect alibi
    rotary_base: float = 10000.0  # --rotary-base
    steps: int = 0  # --decode N: judge decoding with a KV cache
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
