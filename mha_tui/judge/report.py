"""A verdict as a learner reads it (a short Rich table and the diagnosis) or as a grader
reads it (JSON).

Paths and source lines are the learner's text: they pass through `render.text.printable`
and enter Rich as `Text`, never as markup. Never import torch, textual or typer here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..records.verdict import StageVerdict, Verdict
from ..render.text import printable
from .outcome import COULD_NOT_JUDGE, EQUIVALENT, NOT_EQUIVALENT, Outcome, outcome

MARKS = {True: ("✓", "green"), False: ("✗", "bold red"), None: ("·", "dim")}
ASCII_MARKS = {True: ("ok", "green"), False: ("X", "bold red"), None: ("-", "dim")}


def shown_path(path: str) -> str:
    """A file as the user sees it: relative to the working directory when inside it."""
    if not path:
        return ""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return printable(path)
    return printable(path if rel.startswith("..") else rel)


def where(file: str, line: int) -> str:
    if not file:
        return ""
    return f"{shown_path(file)}:{line}" if line else shown_path(file)


def _diff(value: float | None, ok: bool | None = True) -> str:
    """The largest difference as a number; blank for a failing row whose numbers agree
    (a mask that blocks the wrong entries, each to -inf as it should): a `0` beside a ✗
    reads like a pass, and the row's words say what failed."""
    if value is None or (ok is False and value == 0):
        return ""
    if value != value:  # NaN
        return "nan"
    return "0" if value == 0 else f"{value:.1e}"


def _mark(ok: bool | None, ascii_only: bool) -> Text:
    symbol, style = (ASCII_MARKS if ascii_only else MARKS)[ok]
    return Text(symbol, style=style)


def stage_table(verdict: Verdict, *, ascii_only: bool = False) -> Table:
    """One row per stage: mark, stage, largest difference, line, what was checked."""
    table = Table(box=box.ASCII if ascii_only else box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, expand=False)
    table.add_column("", no_wrap=True)
    table.add_column("stage", no_wrap=True)
    table.add_column("max diff", justify="right", no_wrap=True)
    table.add_column("line", justify="right", no_wrap=True)
    table.add_column("checked")
    rows: list[StageVerdict] = [*verdict.stages]
    if verdict.end_to_end is not None:
        rows.append(verdict.end_to_end)
    for row in rows:
        name = row.kind if not row.stage_id or row.stage_id == row.kind else \
            f"{row.kind} ({row.stage_id})"
        if not row.stage_id and row.kind != "end_to_end":
            name += " (missing)"
        checked = row.checked
        if row.ok is False and not row.max_diff:
            checked = f"{checked}: not so"
        table.add_row(_mark(row.ok, ascii_only), Text(name), _diff(row.max_diff, row.ok),
                      Text(str(row.line) if row.line else ""), Text(printable(checked)))
    return table


def verdict_renderable(verdict: Verdict, *, ascii_only: bool = False) -> RenderableType:
    """The whole report for one module: heading, table, diagnosis, legitimate differences."""
    head = Text()
    head.append(printable(verdict.module), style="bold")
    said = outcome(verdict)
    if said == EQUIVALENT:
        head.append(f"  equivalent to {verdict.reference or 'multi-head attention'}",
                    style="green")
    else:
        head.append(f"  {said}", style=OUTCOME_STYLES[said])
    if verdict.dtype:
        head.append(f"  (judged in {verdict.dtype}: every check allows its rounding)",
                    style="dim")
    parts: list[RenderableType] = [head, stage_table(verdict, ascii_only=ascii_only)]
    if verdict.diagnosis is not None:
        d = verdict.diagnosis
        text = Text()
        text.append("First wrong: ", style="bold red")
        place = where(d.file, d.line)
        if place:
            text.append(place, style="bold")
            text.append("  ")
        text.append(f"[{d.kind}] ", style="red")
        text.append(printable(d.message))
        parts.append(text)
    # Under a NOT-equivalent verdict the module is not equivalent: its legitimate
    # differences are still said, as what they are.
    label = "Different but equivalent: " if said == EQUIVALENT else \
        "Also differs, which alone would be equivalent: "
    for difference in verdict.differences:
        line = Text(label, style="dim")
        # the label says "equivalent" already: not twice in one line
        line.append(printable(difference.removesuffix(": equivalent")))
        parts.append(line)
    return Group(*parts)


OUTCOME_STYLES: dict[Outcome, str] = {EQUIVALENT: "green", NOT_EQUIVALENT: "bold red",
                                      COULD_NOT_JUDGE: "bold yellow"}
_OUTCOME_MARKS = {EQUIVALENT: True, NOT_EQUIVALENT: False, COULD_NOT_JUDGE: None}


def verdict_json(verdict: Verdict) -> dict[str, object]:
    """The grader's JSON object for one module: the judge's, with the outcome in words
    (`verdict`) and the stage of the first wrong line."""
    data = verdict.as_dict()
    data["verdict"] = outcome(verdict)
    if verdict.diagnosis is not None and isinstance(data["diagnosis"], dict):
        data["diagnosis"]["stage"] = verdict.diagnosis.stage
    return data


def summary_table(reports: Sequence[dict[str, object]], *, ascii_only: bool = False) -> Table:
    """Several modules: one row each (an instructor's view of a folder of submissions), from
    their JSON objects (`verdict_json`, or a grading worker's).

    The diagnosis is its short kind here; `check FILE:Class` on one module gives the whole.
    Where there is no stage to point at (could not judge), the reason is printed under the row.
    """
    table = Table(box=box.ASCII if ascii_only else box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("submission", overflow="fold", ratio=1)
    table.add_column("verdict", no_wrap=True)
    table.add_column("first wrong", no_wrap=True)
    table.add_column("line", justify="right", no_wrap=True)
    table.add_column("diagnosis", no_wrap=True)
    for report in reports:
        said: Outcome = report["verdict"]  # type: ignore[assignment]
        d: dict[str, object] = report.get("diagnosis") or {}  # type: ignore[assignment]
        module = Text(shown_path(str(report.get("submission") or report["module"])))
        if said == COULD_NOT_JUDGE and d.get("message"):
            module.append("\n")
            module.append(printable(str(d["message"])), style="yellow")
        table.add_row(_mark(_OUTCOME_MARKS[said], ascii_only), module,
                      Text(said, style=OUTCOME_STYLES[said]), Text(str(d.get("stage") or "")),
                      Text(str(d.get("line") or "")), Text(str(d.get("kind") or "")))
    return table


def tally(reports: Sequence[dict[str, object]]) -> Text:
    """`30 modules: 24 equivalent, 5 NOT equivalent, 1 could not judge`."""
    counts = [(o, sum(1 for r in reports if r["verdict"] == o))
              for o in (EQUIVALENT, NOT_EQUIVALENT, COULD_NOT_JUDGE)]
    text = Text(f"{len(reports)} module{'s' if len(reports) != 1 else ''}: ")
    text.append_text(Text(", ").join(Text(f"{n} {o}", style=OUTCOME_STYLES[o])
                                     for o, n in counts if n))
    return text


def to_json(reports: Sequence[dict[str, object] | Verdict]) -> str:
    """One object for one module, a list for several (strict JSON, no NaN); a Verdict is
    written as `verdict_json` gives it."""
    data = [verdict_json(r) if isinstance(r, Verdict) else r for r in reports]
    payload = data[0] if len(data) == 1 else data
    return json.dumps(payload, ensure_ascii=False, indent=1, allow_nan=False) + "\n"


# ---------------------------------------------------------------------------- in the app


def rows_by_stage(verdict: Verdict, stages: Sequence[tuple[str, int]]) -> dict[str, list[StageVerdict]]:
    """Each stage's rows: its own, plus a missing step's row on the stage at its line.

    stages: (stage id, source line) in the trace's order.
    """
    found: dict[str, list[StageVerdict]] = {sid: [] for sid, _ in stages}
    ends = [verdict.end_to_end] if verdict.end_to_end is not None else []
    for row in [*verdict.stages, *ends]:
        if row.stage_id in found:
            found[row.stage_id].append(row)
            continue
        home = next((sid for sid, line in stages if line == row.line), None)
        if home is None and stages:
            home = stages[-1][0]
        if home is not None:
            found[home].append(row)
    return found


def stage_mark(rows: Sequence[StageVerdict], *, ascii_only: bool = False) -> Text:
    """✓ / ✗ for the rail: ✗ if any row of the stage is wrong, · if none was judged.

    The end-to-end comparison is shown at the last stage but does not mark it: a stage is
    marked by what it computed itself."""
    oks = [row.ok for row in rows if row.kind != "end_to_end"]
    ok: bool | None = False if False in oks else True if True in oks else None
    return _mark(ok, ascii_only)


def stage_judgement(verdict: Verdict, rows: Sequence[StageVerdict], *,
                    ascii_only: bool = False) -> RenderableType | None:
    """What `check` said about this stage, and the diagnosis if this is the first wrong one."""
    if not rows:
        return None
    parts: list[RenderableType] = []
    for row in rows:
        line = Text("check ", style="bold")
        line.append_text(_mark(row.ok, ascii_only))
        line.append(" ")
        if row.kind == "end_to_end":
            line.append("end to end: ", style="bold")
        elif not row.stage_id:
            line.append(f"{row.kind} (missing): ", style="bold")
        line.append(printable(row.checked))
        if _diff(row.max_diff, row.ok):
            line.append(f"  (largest difference {_diff(row.max_diff, row.ok)})", style="dim")
        elif row.ok is False:
            line.append(": not so")
        parts.append(line)
    d = verdict.diagnosis
    if d is not None and any(row.ok is False and row.line == d.line and row.kind == d.stage
                             for row in rows):
        text = Text("First wrong: ", style="bold red")
        place = where(d.file, d.line)
        if place:
            text.append(place + "  ", style="bold")
        text.append(f"[{d.kind}] ", style="red")
        text.append(printable(d.message))
        parts.append(text)
    return Group(*parts)
