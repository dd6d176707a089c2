"""Partial credit: points per stage of the walk-through plus the end-to-end result.

The default rubric gives 1 point to each stage of plain multi-head attention (the projection,
the head split's view and transpose, the scores, the scale, the mask, the softmax, attending to
V, the concat and W_O) and 5 to the whole module being equivalent: 15 in all. A small TOML
file changes it (`--rubric FILE`):

    # rubric.toml
    hidden = ["w_o"]       # stages whose results a student does not see (still counted)
    only = false           # true: only the stages named under [points] count
    [points]
    mask = 2
    scale = 1
    end_to_end = 5         # everything equivalent

A stage earns its points when every stage of that kind in the verdict is right (`ok`); a
stage the module has no op for (a fused `scaled_dot_product_attention` is one `sdpa` stage)
earns them when the whole module is equivalent. "could not judge" (a forward that raised,
hung or crashed, what the sandbox caught) earns nothing: the module gave no output to judge.

Plain data: never imports torch, rich, textual or typer.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..judge.outcome import COULD_NOT_JUDGE, EQUIVALENT

END_TO_END = "end_to_end"
DEFAULT_POINTS: dict[str, float] = {
    "project": 1, "view": 1, "transpose": 1, "scores": 1, "scale": 1, "mask": 1, "softmax": 1,
    "attend": 1, "concat": 1, "w_o": 1, END_TO_END: 5}


class RubricError(Exception):
    """A rubric file that cannot be used: one line."""


@dataclass(frozen=True)
class Rubric:
    """Points per stage kind (END_TO_END: the whole module equivalent), in the order the
    columns and tests are shown, and the stages a student does not see."""

    points: tuple[tuple[str, float], ...] = tuple(DEFAULT_POINTS.items())
    hidden: frozenset[str] = frozenset()

    @property
    def stages(self) -> list[str]:
        return [name for name, _ in self.points]

    @property
    def total(self) -> float:
        return sum(points for _, points in self.points)


@dataclass(frozen=True)
class StageScore:
    stage: str
    earned: float
    points: float
    ok: bool | None  # True right, False wrong, None not judged (no such stage, or unjudged)
    checked: str  # check's words for what it checked ("" when the stage is not there)
    hidden: bool


@dataclass(frozen=True)
class Score:
    stages: tuple[StageScore, ...] = field(default_factory=tuple)

    @property
    def earned(self) -> float:
        return sum(s.earned for s in self.stages)

    @property
    def total(self) -> float:
        return sum(s.points for s in self.stages)


def known_stages() -> set[str]:
    """Every stage kind a verdict can name (the registry's kinds, and the kinds a row carries
    when a kind's judge fails) and END_TO_END."""
    from ..kinds.registry import KINDS

    names = {END_TO_END, "op"}
    for kind in KINDS:
        names |= {kind.kind, kind.judged_as[0]}
    return names


def load_rubric(path: str | Path) -> Rubric:
    """A rubric from its TOML file. Raises RubricError (one line)."""
    try:
        data = tomllib.loads(Path(path).read_text("utf-8"))
    except OSError as error:
        raise RubricError(f"--rubric {path}: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise RubricError(f"--rubric {path}: not a TOML file: {error}") from None
    unknown_keys = set(data) - {"points", "hidden", "only"}
    if unknown_keys:
        raise RubricError(f"--rubric {path}: unknown key {sorted(unknown_keys)[0]!r} "
                          "(it takes [points], hidden and only)")
    points, hidden, only = data.get("points", {}), data.get("hidden", []), data.get("only", False)
    if not isinstance(points, dict) or not isinstance(hidden, list) or \
            not isinstance(only, bool):
        raise RubricError(f"--rubric {path}: [points] is a table of stage = points, hidden a "
                          "list of stage names, only true or false")
    known = known_stages()
    for name, value in points.items():
        if name not in known:
            raise RubricError(f"--rubric {path}: {name!r} is not a stage; the stages are "
                              f"{', '.join(sorted(known))}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise RubricError(f"--rubric {path}: {name} = {value!r}: points are a number >= 0")
    for name in hidden:
        if name not in known:
            raise RubricError(f"--rubric {path}: hidden {name!r} is not a stage")
    merged = dict(points) if only else {**DEFAULT_POINTS, **points}
    if END_TO_END in merged:  # the end-to-end result last, as in the verdict
        merged[END_TO_END] = merged.pop(END_TO_END)
    if not merged or not sum(merged.values()):
        raise RubricError(f"--rubric {path}: no points to earn")
    return Rubric(tuple((name, float(value)) for name, value in merged.items()),
                  frozenset(hidden))


def score(report: dict[str, Any], rubric: Rubric) -> Score:
    """A verdict's JSON object scored by the rubric."""
    equivalent = report.get("verdict") == EQUIVALENT
    judged = report.get("verdict") != COULD_NOT_JUDGE
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for stage in report.get("stages") or []:
        by_kind.setdefault(stage["kind"], []).append(stage)
    rows = []
    for name, points in rubric.points:
        found = by_kind.get(name, [])
        if name == END_TO_END:
            ok: bool | None = equivalent if judged else None
        elif not judged:
            ok = None
        elif found:
            ok = all(stage["ok"] is True for stage in found)
        else:
            ok = True if equivalent else None
        checked = "; ".join(dict.fromkeys(stage.get("checked", "") for stage in found))
        rows.append(StageScore(name, points if ok else 0.0, points, ok, checked,
                               name in rubric.hidden))
    return Score(tuple(rows))


def shown_points(value: float) -> str:
    """2.0 -> "2", 1.5 -> "1.5"."""
    return f"{value:g}"


def totals(scores: Sequence[Score]) -> tuple[float, float]:
    """Mean points earned and the points to earn, over a class."""
    if not scores:
        return 0.0, 0.0
    return sum(s.earned for s in scores) / len(scores), scores[0].total
