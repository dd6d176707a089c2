"""Quiz mode: questions about one traced forward, asked stage by stage, marked, and scored.

Each stage kind's module (`kinds/<kind>.py`, its `quiz`) asks about that stage's
recorded numbers; the answers come from the records of this very trace, never from a list.
`Quiz` is the state of one learner's run through them (which question is next, the marks so
far): plain frozen data, so the app keeps it in one reactive and a test can walk it without
a screen. The worksheet (`explain --quiz --dump`) is drawn by `dump.worksheet_text` and
`dump.worksheet_json` from `questions(trace)`.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .kinds._parts.quizzing import HOW, Marked, Question, mark
from .kinds.registry import FORWARD
from .records import Stage, Trace

__all__ = ["HOW", "KINDS", "Marked", "Question", "Quiz", "questions"]

KINDS: dict[str, Callable[[Stage, Trace], tuple[Question, ...]]] = {
    row.kind: row.quiz for row in FORWARD if row.quiz is not None
}
"""Stage kind -> its module's quiz: the kinds mha-tui asks about."""


def questions(trace: Trace) -> tuple[Question, ...]:
    """Every question the trace's stages give, in stage order (a stage of a kind without
    questions, an unrecognised op or an error, gives none)."""
    asked: list[Question] = []
    for stage in trace.stages:
        ask = KINDS.get(stage.kind)
        if ask is not None:
            asked.extend(ask(stage, trace))
    return tuple(asked)


@dataclass(frozen=True)
class Quiz:
    """One run through a trace's questions: the questions, and a mark per answered one.

    An unreadable answer gives no mark: the same question stays. A stage's numbers are
    revealed once every question about it has a mark."""

    questions: tuple[Question, ...]
    tokens: tuple[str, ...] = ()
    marks: tuple[Marked, ...] = ()
    # The keys' tokens, a "key" answer is read against: the context's in cross-attention.
    keys: tuple[str, ...] = ()

    @classmethod
    def of(cls, trace: Trace) -> Quiz:
        return cls(questions(trace), tuple(trace.config.tokens),
                   keys=tuple(trace.config.key_tokens))

    @property
    def current(self) -> Question | None:
        """The question waiting for an answer; None once all are answered."""
        return self.questions[len(self.marks)] if len(self.marks) < len(self.questions) else None

    @property
    def done(self) -> bool:
        return self.current is None

    @property
    def right(self) -> int:
        return sum(m.outcome == "right" for m in self.marks)

    @property
    def score(self) -> str:
        return f"{self.right} of {len(self.questions)} right"

    def answer(self, text: str) -> tuple[Quiz, Marked]:
        """Mark the typed text against the current question: the quiz after it, and the mark."""
        question = self.current
        if question is None:
            raise ValueError("the quiz is over: every question has its mark")
        marked = mark(question, text, self.keys if question.answer == "key" else self.tokens)
        if marked.outcome == "unreadable":
            return self, marked
        return Quiz(self.questions, self.tokens, (*self.marks, marked), self.keys), marked

    def revealed(self, stage_id: str) -> bool:
        """Whether the stage's numbers may be shown: all its questions are marked."""
        return all(q.stage != stage_id for q in self.questions[len(self.marks):])

    def asked_at(self, stage_id: str) -> tuple[Question, ...]:
        return tuple(q for q in self.questions if q.stage == stage_id)

    def stage_state(self, stage_id: str) -> str | None:
        """How the stage's questions stand (the app's rail marks it): "wrong" once one of
        them is answered wrong, else "open" while one waits, else "right"; None for a stage
        with no question."""
        outcomes = [self.marks[k].outcome if k < len(self.marks) else "open"
                    for k, q in enumerate(self.questions) if q.stage == stage_id]
        if not outcomes:
            return None
        return "wrong" if "wrong" in outcomes else "open" if "open" in outcomes else "right"
