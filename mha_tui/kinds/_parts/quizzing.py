"""Quiz questions about one traced forward: the data every kind's `quiz` returns, the helpers
they share, and how a typed answer is read and marked (mha_tui.quiz is the entry point).

Each stage kind's module in kinds/ may have `quiz(stage, trace) -> tuple[Question, ...]`: it
asks about that stage's own recorded numbers (a shape, the strides, a count, a cell, the token
a row weighs most), and its answer is read from the records, never from a list of answers.
Reading an answer is tolerant of its spelling ("2, 4, 3", "(2,4,3)", "torch.Size([2, 4, 3])",
"2x4x3"; a number to the precision shown, 4 decimals; a token by its text or its position);
text that cannot be read is neither right nor wrong: the learner is told what to type.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from ...records import Stage, TensorRecord, Trace
from .cell import expanded_from

Answer = Literal["shape", "integer", "number", "token", "key"]
Outcome = Literal["right", "wrong", "unreadable"]

DECIMALS = 4
"""Numbers are asked and checked to the precision the app shows by default."""
LONGEST_ANSWER = 200
"""Typed text longer than this is not read (a paste gone wrong)."""

HOW: dict[str, str] = {
    "shape": "whole numbers separated by commas, like 3, 5, 7",
    "integer": "a whole number",
    "number": f"a number, to {DECIMALS} decimals",
    "token": "a token of the sentence, or its position (from 0)",
    "key": "a token of the context, or its position (from 0)",
}
"""How to type each kind of answer: said with the question and when an answer is unreadable."""


@dataclass(frozen=True)
class Question:
    """One question about a stage of this very trace, with the answer its records give.

    stage: the stage's id; asks: what kind of question it is ("shape", "strides", "blocked",
    "row_sum", "most_attended", "value", "divisor", "lookup", "kv_head", "angle",
    "channel"); text: the
    question; answer: how the answer is typed; expected: the right answer (a tuple of ints,
    an int, a float; for a token, the positions that are right: several for a tie; a
    "key" answer is a token of the context in cross-attention, read against its tokens); shown:
    the right answer as the key prints it; source: where the answer comes from in the records."""

    stage: str
    asks: str
    text: str
    answer: Answer
    expected: tuple[int, ...] | int | float
    shown: str
    source: str

    @property
    def how(self) -> str:
        return HOW[self.answer]


@dataclass(frozen=True)
class Marked:
    """A typed answer, read and marked: right, wrong (the message gives the right answer and
    where it comes from), or unreadable (the message says what to type; no mark is given)."""

    outcome: Outcome
    message: str
    given: str


# ---------------------------------------------------------------- helpers for the kinds


def shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def number_text(value: float) -> str:
    return f"{value:.{DECIMALS}f}"


def head_of_interest(record: TensorRecord) -> int:
    """"head 1" when there is one (the second head: the first is what every figure shows)."""
    if "h" not in record.dims:
        return 0
    return min(1, record.shape[record.dims.index("h")] - 1)


def cell_index(record: TensorRecord, *, head: int, row: int | None = None,
               col: int | None = None) -> tuple[int, ...]:
    """An index into record: batch 0, the head, and a row and column of its last two axes."""
    index = [0] * len(record.shape)
    if "h" in record.dims:
        index[record.dims.index("h")] = head
    if len(index) >= 2 and row is not None:
        index[-2] = row
    if index and col is not None:
        index[-1] = col
    return tuple(index)


def token_name(trace: Trace, t: int) -> str:
    """The token at position t, with its position when the word occurs more than once."""
    tokens = trace.config.tokens
    if not 0 <= t < len(tokens):
        return str(t)
    word = tokens[t]
    return f"{word}·{t}" if tokens.count(word) > 1 else word


def key_name(trace: Trace, t: int) -> str:
    """The key at position t: a token of the context in cross-attention (the columns' tokens),
    else of the sentence; with its position when the word occurs more than once."""
    tokens = trace.config.key_tokens
    if not 0 <= t < len(tokens):
        return str(t)
    word = tokens[t]
    return f"{word}·{t}" if tokens.count(word) > 1 else word


def last_query(trace: Trace, record: TensorRecord) -> int:
    """The row asked about: the last query of batch row 0 that is a token, not padding
    (`--batch` pads the shorter rows; a padded query's row is no question about the sentence)."""
    last = record.shape[-2] - 1
    config = trace.config
    if config.batch and config.padding and len(config.padding[0]) == record.shape[-2]:
        tokens = [t for t, pad in enumerate(config.padding[0]) if not pad]
        return tokens[-1] if tokens else last
    return last


EXPANDED = ("computed by mha-tui from the q, k, v the module gave F.scaled_dot_product_attention "
            "(the module ran it as one fused op and recorded only its output)")


def recorded(stage: Stage, what: str) -> str:
    """How an answer's source names a tensor of the stage: the recorded one, or mha-tui's
    expansion's for a stage mha-tui computed from a fused op's inputs (kinds/sdpa.py)."""
    return f"mha-tui's expansion's {what}" if expanded_from(stage) else f"the recorded {what}"


def shape_question(stage: Stage, record: TensorRecord, what: str) -> Question:
    made = (f"in mha-tui's expansion at {stage.id} ({EXPANDED})" if expanded_from(stage) else
            f"as the module made it, recorded at {stage.id}")
    return Question(stage.id, "shape", f"What shape does {what} give {record.name}?", "shape",
                    record.shape, shape_text(record.shape),
                    f"the shape of {record.name} {made}: dims ({', '.join(record.dims)})")


# ---------------------------------------------------------------- reading an answer


_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-"})
_SHAPE = re.compile(r"(?:torch\.size)?\s*[\(\[]*\s*(\d+(?:\s*(?:,|x|×|\*|\s)\s*\d+)*)\s*,?\s*[\)\]]*")


def read(question: Question, text: str, tokens: tuple[str, ...] = ()
         ) -> tuple[int, ...] | int | float | None:
    """The answer typed as text, in the question's kind; None when it cannot be read. A token
    typed as a word gives the tuple of the positions it stands at."""
    typed = text.strip().translate(_MINUS)
    if not typed or len(typed) > LONGEST_ANSWER or not typed.isprintable():
        return None
    if question.answer == "shape":
        match = _SHAPE.fullmatch(typed.lower())
        if match is None:
            return None
        return tuple(int(n) for n in re.findall(r"\d+", match.group(1)))
    if question.answer == "integer":
        number = _float(typed.rstrip("."))
        if number is None or not math.isfinite(number) or number != int(number):
            return None
        return int(number)
    if question.answer == "number":
        return _float(typed)
    # A token (or a key): its text (once in the sentence, or written word·position), or a
    # position.
    if re.fullmatch(r"\d+", typed):
        position = int(typed)
        return position if position < max(len(tokens), 1) else None
    named = tuple(t for t, word in enumerate(tokens) if word == typed)
    if named:  # a word that occurs more than once stands for each of its positions
        return named
    match = re.fullmatch(r"(.+?)\s*[·.@#]\s*(\d+)", typed)
    if match and int(match.group(2)) < len(tokens) and tokens[int(match.group(2))] == match.group(1):
        return int(match.group(2))
    return None


def _float(text: str) -> float | None:
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?inf(inity)?", text.lower()):
        return None
    return float(text)


def mark(question: Question, text: str, tokens: tuple[str, ...] = ()) -> Marked:
    """Read the typed answer and mark it against the records' answer."""
    given = read(question, text, tokens)
    if given is None:
        return Marked("unreadable", f"could not read that as {question.how}; type "
                      f"{question.how}", text)
    if _equal(question, given):
        return Marked("right", f"right: {question.shown}", text)
    return Marked("wrong", f"the answer is {question.shown}: {question.source}", text)


def _equal(question: Question, given: tuple[int, ...] | int | float) -> bool:
    expected = question.expected
    if question.answer == "number":
        assert isinstance(given, float) and isinstance(expected, float)
        if math.isinf(expected) or math.isinf(given):
            return given == expected
        # To the precision shown: the key's rounded number, half a unit of its last digit.
        return abs(given - round(expected, DECIMALS)) <= 0.5 * 10 ** -DECIMALS + 1e-12
    if question.answer in ("token", "key"):  # the positions that weigh most (a tie: several)
        positions = given if isinstance(given, tuple) else (given,)
        return isinstance(expected, tuple) and bool(set(positions) & set(expected))
    return given == expected
