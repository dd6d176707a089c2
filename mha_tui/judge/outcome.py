"""The three verdicts `check` gives, in words and as exit codes.

- "equivalent" (exit 0): the module computes multi-head attention;
- "NOT equivalent" (exit 1): it computes something else, and the report says where;
- "could not judge" (exit 3): its forward raised, it could not be built, or (grading a
  folder) its process hung, exited, crashed or ran out of memory.

Exit code 2 stays a usage error. Several modules exit with the worst of their codes: could
not judge, then NOT equivalent, then equivalent. The judge decides `equivalent`; this module
only names the outcome, so that the table, JSON, CSV and exit code cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from ..records.verdict import Verdict

Outcome = Literal["equivalent", "NOT equivalent", "could not judge"]
EQUIVALENT: Outcome = "equivalent"
NOT_EQUIVALENT: Outcome = "NOT equivalent"
COULD_NOT_JUDGE: Outcome = "could not judge"

EXIT_CODES: dict[Outcome, int] = {EQUIVALENT: 0, NOT_EQUIVALENT: 1, COULD_NOT_JUDGE: 3}
_WORST_FIRST: tuple[Outcome, ...] = (COULD_NOT_JUDGE, NOT_EQUIVALENT, EQUIVALENT)

# Diagnoses that mean the module never produced an output to judge.
UNJUDGED_KINDS = frozenset({"crash", "load_error", "no_reference"})

EXIT_CODES_HELP = ("Exit code 0: equivalent (every module); 1: NOT equivalent (at least one); "
                   "3: could not judge (a forward that raised, a module that could not be built, "
                   "or when grading, one that hung, exited or crashed); 2: usage error.")


def outcome(verdict: Verdict) -> Outcome:
    """A judged module's outcome: the judge's `equivalent`, or why it could not be judged."""
    if verdict.equivalent:
        return EQUIVALENT
    if verdict.diagnosis is not None and verdict.diagnosis.kind in UNJUDGED_KINDS:
        return COULD_NOT_JUDGE
    return NOT_EQUIVALENT


def worst(outcomes: Iterable[Outcome]) -> Outcome:
    """The outcome several modules exit with (equivalent when there are none)."""
    given = set(outcomes)
    return next((o for o in _WORST_FIRST if o in given), EQUIVALENT)
