"""Two traces side by side: the learner's module and a reference, stage by stage.

`explain --against` runs both on the same x with the learner's weights copied into the
reference by role (`roles.copy_by_role`), then pairs their stages by what their tensors hold,
never by position or title: stages whose results are the same numbers are paired first (in
order: the longest such chain), and between two such anchors the stages are paired by kind
(the n-th `scores` of one with the n-th `scores` of the other). Where both sides take the
same steps in another order and reach the same numbers after them (Raschka masks, then
scales; nanoGPT scales, then masks), the steps are paired by kind and marked `reordered`,
not wrong: a different but equivalent order. A stage only one side has (a scale the learner
left out, an unrecognised op) stays in the list as that side's alone.

In each pair the stage's results (its last tensor and every other of the same shape: Q, K
and V at `project`) are paired by role -- the same multiset of numbers when the layout
differs, else in order -- and compared cell by cell with `check`'s tolerance. The
differences are computed by mha-tui (|yours - reference's|), never by either module, and
are labelled so where they are shown; the tensors themselves are the modules' own.

The rows run in the reference's order (a learner's stage that the reference does not
have sits after the learner's previous stage), and `parting` is the first row where the
two leave each other for good: after the last row where they agree, the first row that
does not (a differing stage, or one only one side has, or one whose layouts differ),
provided they never agree again (a reordering that rejoins is no parting).

Plain data; never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..ops.numeric import ATOL, LARGE_NEGATIVE, RTOL, f64
from ..records import Stage, TensorRecord, Trace

Status = Literal["agree", "differ", "mine", "reference", "not compared", "reordered"]
PARAMETER_DIMS = {("C_out", "C_in"), ("C_in", "C_out"), ("C",), ("vocab", "C")}
TOLERANCE = f"{ATOL:g} + {RTOL:g} x the largest |reference value| that is not a mask value"
"""A cell differs when |yours - reference's| exceeds this (check's tolerance)."""


@dataclass(frozen=True)
class Mismatch:
    """Cells where the two are not both numbers and not alike: what each side holds there
    ("-inf", "inf", "NaN" or "a number"), how many such cells, and the first one."""

    yours: str
    reference: str
    count: int
    first: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class TensorPair:
    """One result of a stage on both sides, and their difference (computed by mha-tui).

    diff: |mine - theirs| in mine's layout where both are numbers, NaN where only one side
    is (None when the shapes cannot be laid over each other); differs: the cells beyond the
    tolerance or not alike; max_diff, at: the largest difference between two numbers and
    where; mismatches: the cells where one side is -inf, inf or NaN and the other is not;
    note: why there is no comparison, when there is none."""

    mine: TensorRecord | None
    theirs: TensorRecord | None
    diff: np.ndarray | None = None
    differs: np.ndarray | None = None
    max_diff: float | None = None
    at: tuple[int, ...] | None = None
    note: str = ""
    mismatches: tuple[Mismatch, ...] = ()

    @property
    def agree(self) -> bool | None:
        return None if self.differs is None else not bool(self.differs.any())

    @property
    def count(self) -> int:
        """How many cells differ beyond the tolerance (or are not alike)."""
        return 0 if self.differs is None else int(self.differs.sum())


@dataclass(frozen=True, eq=False)
class StagePair:
    """One row of the comparison: a stage kind, the learner's stage and the reference's
    (either may be None), and their results paired."""

    kind: str
    mine: Stage | None
    theirs: Stage | None
    tensors: tuple[TensorPair, ...] = ()
    # A step both take in another order (pair_stages): the two orders, in words.
    order: str = ""

    @property
    def status(self) -> Status:
        if self.theirs is None:
            return "mine"
        if self.mine is None:
            return "reference"
        if self.order:
            return "reordered"
        judged = [t.agree for t in self.tensors if t.agree is not None]
        if not judged:
            return "not compared"
        return "agree" if all(judged) else "differ"

    @property
    def max_diff(self) -> float | None:
        found = [t.max_diff for t in self.tensors if t.max_diff is not None]
        return max(found) if found else None


@dataclass(frozen=True, eq=False)
class Comparison:
    """The learner's trace (mine) against a reference (theirs), paired stage by stage.

    parting: the index into rows of the first stage where they part, None when they never
    do. weights: how the learner's weights were copied into the reference, in words."""

    mine: Trace
    theirs: Trace
    mine_label: str
    theirs_label: str
    rows: tuple[StagePair, ...]
    parting: int | None
    weights: tuple[str, ...] = ()

    @property
    def parted(self) -> StagePair | None:
        return None if self.parting is None else self.rows[self.parting]

    def neighbours(self, k: int) -> tuple[Stage | None, Stage | None]:
        """For a row the learner has no stage in: the learner's stages just before and
        just after it, where the missing step would go."""
        before = next((r.mine for r in reversed(self.rows[:k]) if r.mine is not None), None)
        after = next((r.mine for r in self.rows[k + 1:] if r.mine is not None), None)
        return before, after


# ---------------------------------------------------------------- cells


def _kind_of(values: np.ndarray) -> np.ndarray:
    """Each cell as "a number", "-inf", "inf" or "NaN"."""
    return np.select([np.isnan(values), np.isneginf(values), np.isposinf(values)],
                     ["NaN", "-inf", "inf"], default="a number")


def compare_tensors(mine: TensorRecord, theirs: TensorRecord) -> TensorPair:
    """Cell by cell, in mine's layout: equal shapes, or equal once axes of size 1 are
    dropped ((T, B, C) against (B, T, C) for B = 1). Two numbers differ by more than the
    tolerance; -inf against -inf and NaN against NaN are alike; a cell where only one side
    is a number (-inf blocked in one, kept in the other) is a mismatch, counted by what
    each side holds, never an infinite difference."""
    a, b = f64(mine.values), f64(theirs.values)
    if a.shape != b.shape:
        if tuple(n for n in a.shape if n != 1) != tuple(n for n in b.shape if n != 1):
            return TensorPair(mine, theirs, note=f"not compared: the shapes differ, "
                                                 f"{_shape(a.shape)} and {_shape(b.shape)}")
        b = b.reshape(a.shape)
    numbers = np.isfinite(a) & np.isfinite(b)
    alike = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        diff = np.where(numbers, np.abs(np.where(numbers, a - b, 0.0)), np.nan)
    diff = np.where(alike & ~numbers, 0.0, diff)  # -inf against -inf: no difference
    tolerance = _tolerance(b)
    odd = ~numbers & ~alike
    differs = np.where(numbers, diff > tolerance, odd)
    measured = np.where(numbers, diff, -1.0)
    at = tuple(int(i) for i in np.unravel_index(int(np.argmax(measured)), diff.shape)) \
        if diff.size else None
    largest = float(measured.max()) if numbers.any() else 0.0
    mismatches: list[Mismatch] = []
    if odd.any():
        yours, reference = _kind_of(a), _kind_of(b)
        pairs = [(str(y), str(r)) for y, r in zip(yours[odd], reference[odd], strict=True)]
        cells = list(zip(*np.nonzero(odd), strict=True))
        for y, r in dict.fromkeys(pairs):
            first = cells[pairs.index((y, r))]
            mismatches.append(Mismatch(y, r, pairs.count((y, r)), tuple(int(i) for i in first)))
    return TensorPair(mine, theirs, diff, differs, largest, at, mismatches=tuple(mismatches))


def _tolerance(reference: np.ndarray) -> float:
    """ATOL + RTOL x the largest |value| of the reference's numbers, mask values (finfo.min,
    -1e9: at most LARGE_NEGATIVE) left out: with them in, the tolerance of a masked tensor
    was 3.4e34 and no cell of it could differ."""
    numbers = reference[np.isfinite(reference) & (reference > LARGE_NEGATIVE)]
    return ATOL + RTOL * (float(np.abs(numbers).max()) if numbers.size else 0.0)


def results(stage: Stage) -> list[TensorRecord]:
    """A stage's results: its last tensor and every other tensor of that shape that is not
    a parameter (Q, K and V at project; never W_Q, whatever its shape)."""
    if not stage.tensors:
        return []
    shape = stage.tensors[-1].shape
    return [t for t in stage.tensors if t.shape == shape and t.dims not in PARAMETER_DIMS]


def _multiset(values: np.ndarray) -> np.ndarray:
    return np.sort(f64(values).reshape(-1))


def _same_numbers(a: TensorRecord, b: TensorRecord) -> bool:
    x, y = _multiset(a.values), _multiset(b.values)
    if x.shape != y.shape:
        return False
    tolerance = _tolerance(y)
    with np.errstate(invalid="ignore"):
        return bool(np.all((x == y) | (np.abs(x - y) <= tolerance)))


def pair_results(mine: Stage, theirs: Stage) -> tuple[TensorPair, ...]:
    """The two stages' results paired by role: the same numbers in any layout (a wrong view
    of Q is still Q), else in order; a result only one side has is shown alone."""
    ours, refs = results(mine), results(theirs)
    partner: dict[int, int] = {}
    for i, record in enumerate(ours):
        j = next((j for j, other in enumerate(refs)
                  if j not in partner.values() and _same_numbers(record, other)), None)
        if j is not None:
            partner[i] = j
    free = iter(j for j in range(len(refs)) if j not in partner.values())
    for i in range(len(ours)):
        if i not in partner:
            j = next(free, None)
            if j is not None:
                partner[i] = j
    pairs = [compare_tensors(record, refs[partner[i]]) if i in partner
             else TensorPair(record, None, note="the reference has no result to set beside it")
             for i, record in enumerate(ours)]
    pairs += [TensorPair(None, refs[j], note="your module has no result to set beside it")
              for j in range(len(refs)) if j not in partner.values()]
    return tuple(pairs)


# ---------------------------------------------------------------- stages


UNPAIRED = {"op", "error"}  # an op no rule placed, a raised forward: never paired by kind


def _by_kind(mine: Trace, theirs: Trace, ours: list[int], refs: list[int]
             ) -> list[tuple[int | None, int | None]]:
    """Rows for stages no content pairs: in the reference's order, the n-th stage of a kind
    among `ours` with the n-th of that kind among `refs`; the learner's other stages after
    their predecessor."""
    seen: dict[str, int] = {}
    mine_of: dict[tuple[str, int], int] = {}
    for i in ours:
        kind = mine.stages[i].kind
        n = seen.get(kind, 0)
        seen[kind] = n + 1
        if kind not in UNPAIRED:
            mine_of[(kind, n)] = i
    rows: list[tuple[int | None, int | None]] = []  # (mine index, theirs index)
    seen = {}
    for j in refs:
        kind = theirs.stages[j].kind
        n = seen.get(kind, 0)
        seen[kind] = n + 1
        rows.append((mine_of.pop((kind, n), None) if kind not in UNPAIRED else None, j))
    paired = {i for i, _ in rows if i is not None}
    for i in ours:
        if i in paired:
            continue
        # after the row of the learner's nearest earlier stage already placed
        place = 0
        for k, (m, _) in enumerate(rows):
            if m is not None and m < i:
                place = k + 1
        rows.insert(place, (i, None))
        paired.add(i)
    return rows


def _anchors(mine: Trace, theirs: Trace) -> list[tuple[int, int]]:
    """The longest chain, in both orders, of stage pairs whose results are the same numbers
    (same kinds preferred among chains as long)."""
    n, m = len(mine.stages), len(theirs.stages)
    agree = [[a.kind not in UNPAIRED and b.kind not in UNPAIRED and
              StagePair(a.kind, a, b, pair_results(a, b)).status == "agree"
              for b in theirs.stages] for a in mine.stages]
    best = [[0] * (m + 1) for _ in range(n + 1)]  # best[i][j]: over mine[i:], theirs[j:]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best[i][j] = max(best[i + 1][j], best[i][j + 1])
            if agree[i][j]:
                same = mine.stages[i].kind == theirs.stages[j].kind
                best[i][j] = max(best[i][j], best[i + 1][j + 1] + 1000 + same)
    chain, i, j = [], 0, 0
    while i < n and j < m:
        if agree[i][j] and best[i][j] == best[i + 1][j + 1] + 1000 + (
                mine.stages[i].kind == theirs.stages[j].kind):
            chain.append((i, j))
            i, j = i + 1, j + 1
        elif best[i][j] == best[i + 1][j]:
            i += 1
        else:
            j += 1
    return chain


def _order_words(mine: Trace, theirs: Trace, ours: list[int], refs: list[int],
                 after: Stage | None) -> str:
    """`yours: scale, then mask; the reference: mask, then scale; the same numbers after
    both`: a different but equivalent order."""
    def steps(trace: Trace, indices: list[int]) -> str:
        return ", then ".join(trace.stages[i].kind for i in indices)

    where = f" (at {after.kind}'s input)" if after is not None else ""
    return (f"yours {steps(mine, ours)}; the reference {steps(theirs, refs)}: the same numbers "
            f"after both{where}")


def pair_stages(mine: Trace, theirs: Trace) -> list[StagePair]:
    """Rows in the reference's order: stages paired by what they hold (_anchors), those
    between by kind (_by_kind); the same steps in another order marked `reordered`."""
    def kinds_of(trace: Trace, indices: list[int]) -> list[str]:
        return sorted(trace.stages[k].kind for k in indices)

    anchors = _anchors(mine, theirs)
    rows: list[tuple[int | None, int | None, str]] = []
    last_i = last_j = -1
    for i, j in [*anchors, (len(mine.stages), len(theirs.stages))]:
        ours, refs = list(range(last_i + 1, i)), list(range(last_j + 1, j))
        last_i, last_j = i, j
        end = i == len(mine.stages)
        if not end and mine.stages[i].kind != theirs.stages[j].kind:
            # the same numbers reached by other steps: the same steps in another order?
            block_m, block_t = [*ours, i], [*refs, j]
            if kinds_of(mine, block_m) == kinds_of(theirs, block_t) and len(block_m) > 1:
                after = theirs.stages[j + 1] if j + 1 < len(theirs.stages) else None
                words = _order_words(mine, theirs, block_m, block_t, after)
                rows += [(a, b, words if a is not None and b is not None else "")
                         for a, b in _by_kind(mine, theirs, block_m, block_t)]
                continue
        rows += [(a, b, "") for a, b in _by_kind(mine, theirs, ours, refs)]
        if not end:
            rows.append((i, j, ""))
    out = []
    for i, j, order in rows:
        a = mine.stages[i] if i is not None else None
        b = theirs.stages[j] if j is not None else None
        kind = (a or b).kind  # type: ignore[union-attr]
        out.append(StagePair(kind, a, b, pair_results(a, b) if a is not None and b is not None
                             else (), order))
    return out


def parting(rows: list[StagePair]) -> int | None:
    """The first row where the two part for good (see the module docstring), or None."""
    statuses = [row.status for row in rows]
    for k, row in enumerate(rows):  # the learner's forward raised: they part there
        if row.kind == "error" and row.mine is not None:
            return k
    last_agree = -1
    for k, status in enumerate(statuses):
        if status in ("agree", "reordered"):  # another order to the same numbers: not wrong
            last_agree = k
            continue
        if status == "differ" and not {"agree", "reordered"} & set(statuses[k + 1:]):
            return last_agree + 1
    return None


def compare(mine: Trace, theirs: Trace, *, mine_label: str, theirs_label: str,
            weights: tuple[str, ...] = ()) -> Comparison:
    """Pair the two traces' stages, compare their results, find where they part."""
    rows = pair_stages(mine, theirs)
    return Comparison(mine, theirs, mine_label, theirs_label, tuple(rows), parting(rows),
                      weights)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
