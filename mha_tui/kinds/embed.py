"""embed: token ids looked up in the embedding table, x's origin (facts gathered by the tracer).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from ..records import Check, Embedded, Stage, TensorRecord, Trace
from ._parts.builder import BTC
from ._parts.cell import Cell, Term, Why, where
from ._parts.maker import StageMaker, words
from ._parts.quizzing import Question, token_name

KIND = "embed"
RULES = ()  # not an op of the module: the tracer hands its facts in (Embedded)


def build(m: StageMaker, e: Embedded) -> Stage:
    ids, table, x = e.ids, e.table, e.x
    title, explanation = words("embed")
    n = m.s.T
    tensors = [m.b.record("ids", ids, ("B", "T"), kind="int"),
               m.b.record(e.table_name, table, ("vocab", "C"),
                          caption="one learned row per vocabulary entry"),
               m.b.record("x", x, BTC, share=(e.table_name, table))]
    checks = [Check(f"x[{'0, ' if m.s.batched else ''}t] is row ids[t] of the embedding table for "
                    f"{_all(n, 'token')}", e.looked_up)]
    context = _context(m, e)
    if context is not None:  # cross-attention (--context): the keys' sequence, the same table
        tensors.append(context[0])
        checks.append(context[1])
    return Stage(
        id="embed", title=title, code=e.source.text, explanation=explanation,
        shape_in=ids.shape, shape_out=x.shape, dims_in=("B", "T"), dims_out=BTC,
        tensors=tuple(tensors), checks=tuple(checks), kind="embed", source=e.source,
    )


def _context(m: StageMaker, e: Embedded) -> tuple[TensorRecord, Check] | None:
    """The context of a cross-attention run from the CLI (--context), as the forward got it:
    its tokens' rows of the same embedding table (config.context_ids), checked row by row."""
    config = m.b.config
    if not m.g.key_names or not config.context:
        return None
    name = min(m.g.key_names)
    snap = dict(m.g.rec.inputs)[name]
    ids = list(config.context_ids)
    rows = e.table.values[ids]  # (T_k, C)
    looked_up = snap.values.shape[-2:] == rows.shape and bool(np.array_equal(snap.values[0], rows))
    record = m.b.record(name, snap, ("B", "T_k", "C"),
                        caption=f"the context: rows {', '.join(map(str, ids))} of the same table")
    return record, Check(f"{name}[0, t] is row context_ids[t] of the embedding table for "
                         f"{_all(len(ids), 'context token')}", looked_up)


def _all(n: int, noun: str) -> str:
    """"all 4 tokens", but "the one token": counts in labels read as plain English."""
    return f"the one {noun}" if n == 1 else f"all {n} {noun}s"


def why(cell: Cell) -> Why:
    """An embedding value: the token's row of the table (looked up, not computed)."""
    if not any(r.name == "ids" for r in cell.stage.tensors):
        return _layer_input(cell)
    *_, t, c = cell.index
    ids = cell.stage.tensor("ids").values
    table = next(r for r in cell.stage.tensors if r.dims == ("vocab", "C"))
    token_id = int(ids[t] if ids.ndim == 1 else ids[0, t])  # NumPy: ids (T,), no batch axis
    computed = float(table.values[token_id, c])
    return Why(cell.stage.id, "embed", cell.record.name, cell.index, where(cell),
               f"{cell.name} = {table.name}[{token_id}, {c}]  (token {cell.token(t)} has id "
               f"{token_id})", (Term(f"row {token_id} of the table, column {c}", (), computed),),
               ("looked up, not computed",), computed, cell.recorded)


def _layer_input(cell: Cell) -> Why:
    """A Hugging Face layer's input (pipeline/hf_input.py: the model's embeddings, its
    residual stream, the layer norm before attention): the recorded numbers of this token and
    channel, step by step. x read unchanged from the step before is checked; a layer norm in
    between is the model's own number (its weights are not recorded here)."""
    *_, t, c = cell.index
    ids = next((r for r in cell.stage.tensors if r.kind == "int"), None)
    steps = [r for r in cell.stage.tensors[:-1] if r.values.shape == cell.record.values.shape]
    terms = []
    if ids is not None and ids.values.size:
        token_id = int(ids.values.reshape(-1)[t])
        terms.append(Term(f"token {cell.token(t)} (position {t}) has id {token_id}"))
    terms += [Term(f"{r.name}[{', '.join(map(str, cell.index))}]", (), float(r.values[cell.index]))
              for r in steps]
    checked = next((check.label for check in cell.stage.checks if check.label.startswith("x is")), "")
    last = steps[-1] if steps else None
    if last is not None and np.array_equal(last.values, cell.record.values, equal_nan=True):
        computed = float(last.values[cell.index])
        return Why(cell.stage.id, "embed", cell.record.name, cell.index, where(cell),
                   f"{cell.name} = {last.name}[{', '.join(map(str, cell.index))}]", tuple(terms),
                   (f"{cell.record.name} is {last.name} itself: the same number, read, not "
                    "computed", *([f"the stage's check: {checked}"] if checked else [])),
                   computed, cell.recorded, basis="the layer's input, as the model made it")
    made = f"the model's layer norm of {last.name}" if last is not None else "the model's own"
    return Why(cell.stage.id, "embed", cell.record.name, cell.index, where(cell),
               f"{cell.name} = {made}, channel {c}", tuple(terms),
               (f"{cell.record.name} is what the model computed before its attention layer: "
                "this number is the model's own, read from the recording; mha-tui does not "
                "recompute the layer norm here (its weights are not part of this stage)",
                *([f"the stage's check: {checked} (the whole tensor, recomputed in torch)"]
                  if checked else [])),
               cell.recorded, cell.recorded, basis="how the model made the layer's input",
               recomputed=False, reason="the model's layer norm, computed before this layer")


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """Which row of the table a token's x is: its id, as the lookup recorded it."""
    ids = next((r for r in stage.tensors if r.kind == "int"), None)
    if ids is None or not ids.values.size:
        return ()
    t = ids.values.shape[-1] - 1
    flat = [int(i) for i in ids.values.reshape(-1)]
    row = flat[t]
    word = token_name(trace, t)
    firsts = list(dict.fromkeys(flat))
    how = ("ids number the tokens in order of first appearance"
           if firsts == list(range(len(firsts))) else "the tokenizer's id for this token")
    return (Question(stage.id, "lookup", f"Which row of the embedding table becomes x for the "
                     f"token {word} (position {t})?", "integer", row, str(row),
                     f"{ids.name}[{t}] = {row}: the token's id, recorded with the lookup "
                     f"({how})"),)
