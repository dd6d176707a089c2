"""embed: token ids looked up in the embedding table, x's origin (facts gathered by the tracer).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ...records import Check, Embedded, Stage, Trace
from ..builder import BTC
from ..cell import Cell, Term, Why, where
from ..maker import StageMaker, words
from ..quizzing import Question, token_name

KIND = "embed"
RULES = ()  # not an op of the module: the tracer hands its facts in (Embedded)


def build(m: StageMaker, e: Embedded) -> Stage:
    ids, table, x = e.ids, e.table, e.x
    title, explanation = words("embed")
    n = m.s.T
    return Stage(
        id="embed", title=title, code=e.source.text, explanation=explanation,
        shape_in=ids.shape, shape_out=x.shape, dims_in=("B", "T"), dims_out=BTC,
        tensors=(
            m.b.record("ids", ids, ("B", "T"), kind="int"),
            m.b.record(e.table_name, table, ("vocab", "C"),
                          caption="one learned row per vocabulary entry"),
            m.b.record("x", x, BTC, share=(e.table_name, table)),
        ),
        checks=(Check(f"x[{'0, ' if m.s.batched else ''}t] is row ids[t] of the embedding table for "
                      f"{_all(n, 'token')}", e.looked_up),),
        kind="embed", source=e.source,
    )


def _all(n: int, noun: str) -> str:
    """"all 4 tokens", but "the one token": counts in labels read as plain English."""
    return f"the one {noun}" if n == 1 else f"all {n} {noun}s"


def why(cell: Cell) -> Why:
    """An embedding value: the token's row of the table (looked up, not computed)."""
    *_, t, c = cell.index
    ids = cell.stage.tensor("ids").values
    table = next(r for r in cell.stage.tensors if r.dims == ("vocab", "C"))
    token_id = int(ids[t] if ids.ndim == 1 else ids[0, t])  # NumPy: ids (T,), no batch axis
    computed = float(table.values[token_id, c])
    return Why(cell.stage.id, "embed", cell.record.name, cell.index, where(cell),
               f"{cell.name} = {table.name}[{token_id}, {c}]  (token {cell.token(t)} has id "
               f"{token_id})", (Term(f"row {token_id} of the table, column {c}", (), computed),),
               ("looked up, not computed",), computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """Which row of the table a token's x is: its id, as the lookup recorded it."""
    ids = next((r for r in stage.tensors if r.kind == "int"), None)
    if ids is None or not ids.values.size:
        return ()
    t = ids.values.shape[-1] - 1
    row = int(ids.values.reshape(-1)[t])
    word = token_name(trace, t)
    return (Question(stage.id, "lookup", f"Which row of the embedding table becomes x for the "
                     f"token {word} (position {t})?", "integer", row, str(row),
                     f"{ids.name}[{t}] = {row}: the token's id, recorded with the lookup (ids "
                     f"number the tokens in order of first appearance)"),)
