"""The class summary: what an instructor reads before class. How many submissions are
equivalent, NOT equivalent and could not be judged; which stage fails first most often; the
most common diagnoses (with one message each, in check's words); each stage's pass rate and
the mean points by the rubric. As JSON (`--summary FILE`) and as a Rich table (grading's text
output). Never imports torch, textual or typer."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..judge.outcome import COULD_NOT_JUDGE, EQUIVALENT, NOT_EQUIVALENT
from .rubric import Rubric, score, totals

TOP = 5


def class_summary(reports: Sequence[dict[str, Any]], rubric: Rubric) -> dict[str, Any]:
    outcomes = Counter(report["verdict"] for report in reports)
    first = Counter((report.get("diagnosis") or {}).get("stage") or "" for report in reports
                    if report["verdict"] == NOT_EQUIVALENT)
    kinds: Counter[str] = Counter()
    example: dict[str, str] = {}
    for report in reports:
        diagnosis = report.get("diagnosis")
        if diagnosis and report["verdict"] != EQUIVALENT:
            kinds[diagnosis["kind"]] += 1
            example.setdefault(diagnosis["kind"], diagnosis["message"])
    scores = [score(report, rubric) for report in reports]
    judged = [s for s, r in zip(scores, reports, strict=True) if r["verdict"] != COULD_NOT_JUDGE]
    passed = {stage: sum(1 for s in judged if s.stages[i].ok) for i, stage in
              enumerate(rubric.stages)}
    mean, total = totals(scores)
    return {
        "submissions": len(reports),
        "equivalent": outcomes[EQUIVALENT],
        "not_equivalent": outcomes[NOT_EQUIVALENT],
        "could_not_judge": outcomes[COULD_NOT_JUDGE],
        "first_wrong_stage": [{"stage": stage or "(none named)", "count": count}
                              for stage, count in first.most_common(TOP)],
        "diagnoses": [{"kind": kind, "count": count, "example": example[kind]}
                      for kind, count in kinds.most_common(TOP)],
        "stage_pass_rate": {stage: round(count / len(judged), 3) if judged else None
                            for stage, count in passed.items()},
        "mean_points": round(mean, 2),
        "points": total,
    }


def summary_renderable(summary: dict[str, Any]) -> Any:
    """The summary as a Rich table: counts, the stages that fail first, the diagnoses."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"class summary: {summary['submissions']} submissions", box=None,
                  show_header=False, title_justify="left", pad_edge=False)
    table.add_column("what", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_column("detail", overflow="fold")
    n = summary["submissions"]
    for label, key in (("equivalent", "equivalent"), ("NOT equivalent", "not_equivalent"),
                       ("could not judge", "could_not_judge")):
        table.add_row(Text(label), str(summary[key]), Text(f"of {n}"))
    table.add_row(Text("mean points"), f"{summary['mean_points']:g}",
                  Text(f"of {summary['points']:g}"))
    for row in summary["first_wrong_stage"]:
        table.add_row(Text(f"first wrong at {row['stage']}"), str(row["count"]), Text(""))
    for row in summary["diagnoses"]:
        table.add_row(Text(f"diagnosis {row['kind']}"), str(row["count"]), Text(row["example"]))
    return table
