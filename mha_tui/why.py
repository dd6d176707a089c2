"""Why this number? How one cell of a stage's result was made from the numbers before it.

For a cell of a stage's main tensor (its last: the stage's result), mha-tui recomputes the
value from what the forward recorded (the stage's ops' input snapshots and the stages'
tensors), step by step, with the real values, and sets it beside the module's own number.
Everything here is computed by mha-tui, never by the module, and says so; the module's
number is read, never recomputed.

One function per stage kind, keyed by kind in KINDS. (The recogniser's redesign will give
each kind its own module; this table is the one place to move from.) Plain data out: the
app and the CLI draw it with `render.why_panel`.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .records import OpRecord, Stage, TensorArg, TensorRecord, Trace

MANY_TERMS = 8
"""More products than this (a large d_h, a long sentence): the largest SHOWN_TERMS by size
are listed and the rest summed on one row, saying so."""
SHOWN_TERMS = 6


class WhyError(ValueError):
    """The cell cannot be explained: no such stage or index, or a stage kind without a why."""


@dataclass(frozen=True)
class Term:
    """One line of a computation: a label, the numbers and operators it combines, its value.

    parts: numbers (the recorded inputs) and operator strings ("×", "-", "/"), in order;
    value None for a line that only states a fact."""

    label: str
    parts: tuple[float | str, ...] = ()
    value: float | None = None


@dataclass(frozen=True)
class Why:
    """How one cell was made: what the module computed, and mha-tui's computation of it."""

    stage: str
    kind: str
    tensor: str  # the main tensor's name, as the stage shows it
    index: tuple[int, ...]
    where: str  # "head 1, query AI (row 2), key love (column 1)"
    formula: str  # "scores[0, 1, 2, 1] = Q[0, 1, 2, :] · K[0, 1, 1, :]"
    terms: tuple[Term, ...]
    notes: tuple[str, ...]
    computed: float  # by mha-tui, in float64, from the recorded inputs
    recorded: float  # the module's own number

    @property
    def difference(self) -> float:
        if math.isnan(self.computed) and math.isnan(self.recorded):
            return 0.0
        if math.isinf(self.computed) and self.computed == self.recorded:
            return 0.0
        return abs(self.computed - self.recorded)

    @property
    def agrees(self) -> bool:
        """Equal to the module's number up to float32 rounding (the module sums in float32,
        in its own order; mha-tui in float64)."""
        scale = max(1.0, abs(self.recorded)) if math.isfinite(self.recorded) else 1.0
        return self.difference <= 1e-5 * scale


def main_tensor(stage: Stage) -> TensorRecord:
    """The tensor the cursor moves on: the stage's result, its last tensor."""
    if not stage.tensors:
        raise WhyError(f"stage {stage.id} has no tensor to point into")
    return stage.tensors[-1]


def parse_cell(text: str) -> tuple[str, tuple[int, ...]]:
    """`softmax[0, 1, 2, 1]` -> ("softmax", (0, 1, 2, 1))."""
    match = re.fullmatch(r"\s*([A-Za-z_][\w.-]*)\s*\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*,?\s*\]\s*", text)
    if match is None:
        raise WhyError(f"--why takes STAGE[i, j, ...], e.g. \"softmax[0, 1, 2, 1]\"; got {text!r}")
    return match.group(1), tuple(int(n) for n in match.group(2).split(","))


def why(trace: Trace, stage_id: str, index: tuple[int, ...]) -> Why:
    """How the cell `index` of the stage's main tensor was made."""
    try:
        stage = trace.stage(stage_id)
    except KeyError:
        raise WhyError(f"no stage {stage_id!r}; this trace has: "
                       f"{', '.join(s.id for s in trace.stages)}") from None
    record = main_tensor(stage)
    shape = record.values.shape
    if len(index) != len(shape) or not all(0 <= i < n for i, n in zip(index, shape, strict=True)):
        raise WhyError(f"{stage.id}[{', '.join(map(str, index))}] is outside {record.name}, "
                       f"shape ({', '.join(map(str, shape))}): give {len(shape)} indices, each "
                       "from 0 to its size - 1")
    explain = KINDS.get(stage.kind)
    if explain is None:
        raise WhyError(f"mha-tui does not explain the cells of a {stage.kind!r} stage yet; it "
                       f"does for: {', '.join(KINDS)}")
    return explain(_Cell(trace, stage, record, index))


# ---------------------------------------------------------------- the cell and its context


@dataclass(frozen=True)
class _Cell:
    trace: Trace
    stage: Stage
    record: TensorRecord
    index: tuple[int, ...]

    @property
    def recorded(self) -> float:
        return float(self.record.values[self.index])

    @property
    def name(self) -> str:
        return f"{self.record.name}[{', '.join(map(str, self.index))}]"

    def token(self, t: int) -> str:
        tokens = self.trace.config.tokens
        return tokens[t] if 0 <= t < len(tokens) else str(t)

    @property
    def head(self) -> int | None:
        dims = self.record.dims
        return self.index[dims.index("h")] if "h" in dims else None

    def ops(self, *names: str) -> list[OpRecord]:
        return [op for op in self.stage.ops if op.name in names]

    def per_head(self, ops: list[OpRecord]) -> tuple[OpRecord, tuple[int, ...]]:
        """The op that made this cell, and the cell's index in that op's output: one op for
        every head (index as it is), or one op per head (a ModuleList: no head axis)."""
        if not ops:
            raise WhyError(f"stage {self.stage.id} holds no op to explain {self.name} by")
        out_ndim = len(ops[-1].out.shape)
        if out_ndim == len(self.index):
            return ops[-1], self.index
        head_axis = self.record.dims.index("h") if "h" in self.record.dims else None
        if head_axis is None or out_ndim != len(self.index) - 1 or len(ops) <= self.index[head_axis]:
            raise WhyError(f"cannot tell which op of stage {self.stage.id} made {self.name}")
        head = self.index[head_axis]
        return ops[head], self.index[:head_axis] + self.index[head_axis + 1:]

    def operand(self, op: OpRecord, k: int) -> np.ndarray:
        recording = self.trace.recording
        if recording is None:
            raise WhyError("this trace keeps no recording of its ops")
        return np.asarray(recording.snapshot(op.inputs[k]).values)

    def scalar(self, op: OpRecord) -> float:
        """The op's number argument (`/ math.sqrt(d_h)`), or a one-element tensor argument."""
        for arg in op.args[1:]:
            if isinstance(arg, (int, float)) and not isinstance(arg, bool):
                return float(arg)
            if isinstance(arg, TensorArg):
                values = self.operand(op, arg.index)
                if values.size == 1:
                    return float(values.reshape(()))
        raise WhyError(f"cannot find the number {op.name} uses in stage {self.stage.id}")


def _where(cell: _Cell, row_axis: str = "query", col_axis: str = "key") -> str:
    dims, index = cell.record.dims, cell.index
    parts = []
    if "h" in dims:
        parts.append(f"head {index[dims.index('h')]}")
    t_axes = [k for k, d in enumerate(dims) if d == "T"]
    if len(t_axes) == 2:
        i, j = index[t_axes[0]], index[t_axes[1]]
        parts += [f"{row_axis} {cell.token(i)} (row {i})", f"{col_axis} {cell.token(j)} (column {j})"]
    elif t_axes:
        t = index[t_axes[0]]
        parts.append(f"token {cell.token(t)} (row {t})")
        last = dims[-1]
        if last in ("C", "d_h"):
            parts.append(f"{'channel' if last == 'C' else 'd'} {index[-1]}")
    return ", ".join(parts)


def _dot(cell: _Cell, row: np.ndarray, col: np.ndarray, labels: list[str], what: str
         ) -> tuple[tuple[Term, ...], tuple[str, ...], float]:
    """Σ row[k] * col[k], in float64: a term per k, or the largest and the rest summed."""
    products = row.astype(np.float64) * col.astype(np.float64)
    total = float(products.sum())
    order = list(range(len(products)))
    notes: list[str] = []
    if len(products) > MANY_TERMS:
        order = sorted(order, key=lambda k: -abs(products[k]))[:SHOWN_TERMS]
        order.sort()
    terms = [Term(labels[k], (float(row[k]), "×", float(col[k])), float(products[k]))
             for k in order]
    rest = [k for k in range(len(products)) if k not in set(order)]
    if rest:
        terms.append(Term(f"the other {len(rest)} {what}", (), float(products[rest].sum())))
        notes.append(f"{len(products)} {what}: the {len(order)} largest in size are shown, "
                     f"the other {len(rest)} summed on one line")
    terms.append(Term("sum", (), total))
    return tuple(terms), tuple(notes), total


# ---------------------------------------------------------------- one function per kind


def _scores(cell: _Cell) -> Why:
    op, index = cell.per_head(cell.ops("matmul"))
    queries, keys_t = cell.operand(op, 0), cell.operand(op, 1)
    *lead, i, j = index
    row, col = queries[(*lead, i)], keys_t[(*lead, slice(None), j)]
    head = ", ".join(map(str, cell.index[:-2]))
    terms, notes, total = _dot(cell, row, col, [f"d{k}: Q[{i}, {k}] × K[{j}, {k}]"
                                                for k in range(len(row))], "products")
    return Why(cell.stage.id, "scores", cell.record.name, cell.index, _where(cell),
               f"{cell.name} = Q[{head}, {i}, :] · K[{head}, {j}, :]  "
               f"(a dot product over d_h = {len(row)})",
               terms, ("Q and K are the matmul's recorded inputs (K as K^T: its column "
                       f"{j})", *notes), total, cell.recorded)


def _scale(cell: _Cell) -> Why:
    op, index = cell.per_head(cell.ops("div", "mul", "true_divide", "multiply"))
    before = float(cell.operand(op, 0)[index])
    number = cell.scalar(op)
    d_h = cell.trace.config.head_dim
    divides = op.name in ("div", "true_divide")
    computed = before / number if divides else before * number
    notes = []
    if divides and math.isclose(number, math.sqrt(d_h), rel_tol=1e-6):
        notes.append(f"the divisor is √d_h: d_h = {d_h}, √{d_h} = {number:.6g}")
    elif not divides and math.isclose(number, 1 / math.sqrt(d_h), rel_tol=1e-6):
        notes.append(f"the factor is 1/√d_h: d_h = {d_h}, 1/√{d_h} = {number:.6g}")
    else:
        notes.append(f"d_h = {d_h}; this {'divisor' if divides else 'factor'} is not "
                     f"{'√d_h' if divides else '1/√d_h'} ({math.sqrt(d_h):.6g})")
    terms = (Term("before", (), before),
             Term("÷ divisor" if divides else "× factor",
                  (before, "/" if divides else "×", number), computed))
    return Why(cell.stage.id, "scale", cell.record.name, cell.index, _where(cell),
               f"{cell.name} = score {'/' if divides else '×'} {number:.6g}", terms,
               tuple(notes), computed, cell.recorded)


def _mask(cell: _Cell) -> Why:
    op, index = cell.per_head(cell.ops("masked_fill", "masked_fill_", "add", "add_",
                                       "where", "sub"))
    before = float(cell.operand(op, 0)[index])
    out_shape = op.out.shape
    *_, i, j = index
    if op.name.startswith("masked_fill"):
        mask = np.broadcast_to(cell.operand(op, 1), out_shape)
        blocked = bool(mask[index])
        fill = cell.scalar(op)
        computed = fill if blocked else before
        entry = f"the mask's entry [{i}, {j}] is {blocked}"
        terms = (Term("score before the mask", (), before),
                 Term(f"mask[{i}, {j}] = {blocked}: "
                      + ("written over with the fill value" if blocked else "kept"), (), computed))
    elif op.name.startswith(("add", "sub")):
        mask_values = np.broadcast_to(cell.operand(op, 1), out_shape)
        added = float(mask_values[index])
        computed = before + added if op.name.startswith("add") else before - added
        blocked = math.isinf(computed) or added <= -1e9
        entry = f"the mask's entry [{i}, {j}] is {added:g}"
        terms = (Term("score before the mask", (), before),
                 Term(f"{'+' if op.name.startswith('add') else '-'} mask[{i}, {j}]",
                      (before, "+" if op.name.startswith("add") else "-", added), computed))
    else:
        raise WhyError(f"stage {cell.stage.id}: a {op.name} mask is not explained yet")
    if blocked:
        reason = (f"key {cell.token(j)} (position {j}) comes after query {cell.token(i)} "
                  f"(position {i}): j > i, and a causal mask hides the future"
                  if j > i else f"blocked although j <= i ({entry}): not a causal rule")
    else:
        reason = (f"key position {j} <= query position {i}: the query may look at it"
                  if j <= i else f"kept although j > i ({entry}): this mask is not causal")
    return Why(cell.stage.id, "mask", cell.record.name, cell.index, _where(cell),
               f"{cell.name}: {'blocked' if blocked else 'kept'}", terms, (reason, entry),
               computed, cell.recorded)


def _softmax(cell: _Cell) -> Why:
    op, index = cell.per_head(cell.ops("softmax", "_softmax"))
    scores = cell.operand(op, 0)
    *lead, i, j = index
    row = scores[(*lead, i)].astype(np.float64)
    top = float(np.max(row))
    with np.errstate(invalid="ignore"):
        exps = np.exp(row - top)
    total = float(exps.sum())
    computed = float(exps[j] / total)
    terms = [Term(f"key {cell.token(k)}: exp(s[{i}, {k}] - max)", (float(row[k]), "-", top),
                  float(exps[k])) for k in range(len(row))]
    terms.append(Term("Σ over the row", (), total))
    terms.append(Term(f"exp(s[{i}, {j}] - max) / Σ", (float(exps[j]), "/", total), computed))
    notes = [f"the row's largest score, max = {top:.6g}, is subtracted first (the result is "
             "the same; exp cannot overflow)"]
    if np.isneginf(row).any():
        notes.append("a blocked (-inf) score gives exp(-inf) = 0: no weight")
    dropouts = cell.ops("dropout", "dropout_")
    if dropouts:
        p = dropouts[0].kwarg("p", dropouts[0].args[1] if len(dropouts[0].args) > 1 else None)
        training = dropouts[0].kwarg("training", None)
        notes.append(f"then dropout (p={p}, training={training}): "
                     + ("it changes nothing here" if training is False or p == 0
                        else "it can zero or rescale this weight"))
    return Why(cell.stage.id, "softmax", cell.record.name, cell.index, _where(cell),
               f"{cell.name} = exp(s[{i}, {j}] - max_k s[{i}, k]) / Σ_k exp(s[{i}, k] - max)",
               tuple(terms), tuple(notes), computed, cell.recorded)


def _attend(cell: _Cell) -> Why:
    op, index = cell.per_head(cell.ops("matmul"))
    weights, values = cell.operand(op, 0), cell.operand(op, 1)
    *lead, i, c = index
    row, col = weights[(*lead, i)], values[(*lead, slice(None), c)]
    labels = [f"key {cell.token(k)}: w[{i}, {k}] × V[{k}, {c}]" for k in range(len(row))]
    terms, notes, total = _dot(cell, row, col, labels, "weighted values")
    return Why(cell.stage.id, "attend", cell.record.name, cell.index,
               _where(cell), f"{cell.name} = Σ_k weights[{i}, k] × V[k, {c}]  (one term per "
               "key token: V's rows weighted by the softmax row)", terms,
               (f"column {c} of V, weighted by row {i} of the attention weights", *notes),
               total, cell.recorded)


def _previous(cell: _Cell, kind: str) -> Stage:
    stages = cell.trace.stages
    before = stages[:[s.id for s in stages].index(cell.stage.id)]
    for stage in reversed(before):
        if stage.kind == kind:
            return stage
    raise WhyError(f"no {kind} stage before {cell.stage.id}")


def _concat(cell: _Cell) -> Why:
    *_, t, c = cell.index
    attend = _previous(cell, "attend")
    heads = main_tensor(attend)
    d_h = heads.values.shape[-1]
    head, channel = divmod(c, d_h)
    computed = float(heads.values[0, head, t, channel])
    return Why(cell.stage.id, "concat", cell.record.name, cell.index, _where(cell),
               f"{cell.name} = {heads.name}[0, {head}, {t}, {channel}]  (column {c} = head "
               f"{head} × d_h {d_h} + channel {channel})",
               (Term(f"head {head}, channel {channel}, token {cell.token(t)} (attend)", (),
                     computed),),
               (f"concat lays the heads side by side: columns {head * d_h}-{head * d_h + d_h - 1} "
                f"hold head {head}", "the value is copied, not computed"),
               computed, cell.recorded)


def _linear(cell: _Cell, role: str) -> Why:
    ops = cell.ops("linear")
    if not ops:
        raise WhyError(f"stage {cell.stage.id} holds no linear op")
    op = next((o for o in ops if np.array_equal(o.out.values, cell.record.values)), ops[-1])
    if op.out.values.shape != cell.record.values.shape:
        raise WhyError(f"cannot tell which linear op of stage {cell.stage.id} made {cell.name}")
    x, weight = cell.operand(op, 0), cell.operand(op, 1)
    *lead, t, o = cell.index
    row = x[(*lead, t)]
    col = weight[o] if weight.shape[0] == op.out.shape[-1] else weight[:, o]
    d_h = cell.trace.config.head_dim
    name = cell.stage.tensors[0].name if role == "W_O" else "W"
    labels = [f"in {k}" + (f" (head {k // d_h}, d{k % d_h})" if role == "W_O" else "")
              + f": x[{t}, {k}] × {name}[{o}, {k}]" for k in range(len(row))]
    terms, notes, total = _dot(cell, row, col, labels, "products")
    bias = None
    if len(op.inputs) > 2:
        bias = float(cell.operand(op, 2)[o])
        total += bias
        terms = (*terms[:-1], Term(f"+ bias[{o}]", (), bias), Term("sum", (), total))
    extra = []
    dropouts = cell.ops("dropout", "dropout_")
    if dropouts:
        extra.append(f"then dropout (training={dropouts[0].kwarg('training', None)}): it "
                     "changes nothing in eval mode")
    return Why(cell.stage.id, cell.stage.kind, cell.record.name, cell.index, _where(cell),
               f"{cell.name} = x[{t}, :] · {name}[{o}, :]" + (" + bias" if bias is not None else ""),
               terms, ((f"every output channel mixes all heads: in-channels of head h are "
                        f"h·{d_h} to h·{d_h}+{d_h - 1}" if role == "W_O" else
                        "one row of the weight, dotted with the token's x"), *notes, *extra),
               total, cell.recorded)


def _embed(cell: _Cell) -> Why:
    *_, t, c = cell.index
    ids = cell.stage.tensor("ids").values
    table = next(r for r in cell.stage.tensors if r.dims == ("vocab", "C"))
    token_id = int(ids[0, t])
    computed = float(table.values[token_id, c])
    return Why(cell.stage.id, "embed", cell.record.name, cell.index, _where(cell),
               f"{cell.name} = {table.name}[{token_id}, {c}]  (token {cell.token(t)} has id "
               f"{token_id})", (Term(f"row {token_id} of the table, column {c}", (), computed),),
               ("looked up, not computed",), computed, cell.recorded)


def _moved(cell: _Cell) -> Why:
    """view / transpose: the same number, found at another index of the input."""
    ops = cell.ops("view", "reshape", "transpose", "permute", "contiguous")
    op = next((o for o in ops if o.name != "contiguous"
               and np.array_equal(o.out.values, cell.record.values)), None)
    if op is None:
        raise WhyError(f"cannot tell which op of stage {cell.stage.id} made {cell.name}")
    source = cell.operand(op, 0)
    if op.name in ("view", "reshape"):
        flat = int(np.ravel_multi_index(cell.index, op.out.shape))
        at = tuple(int(k) for k in np.unravel_index(flat, source.shape))
        how = f"the same memory read as shape {tuple(op.out.shape)}: element {flat} in order"
    else:
        axes = [a for a in op.args[1:] if isinstance(a, int)]
        order = list(range(len(cell.index)))
        if op.name == "transpose" and len(axes) == 2:
            a, b = (x % len(order) for x in axes)
            order[a], order[b] = order[b], order[a]
        elif op.name == "permute":
            order = [int(a) for a in axes]
        at = tuple(cell.index[order.index(k)] for k in range(len(order)))
        how = f"axes {axes} swapped: the index read in the other order"
    computed = float(source[at])
    return Why(cell.stage.id, cell.stage.kind, cell.record.name, cell.index, _where(cell),
               f"{cell.name} = input[{', '.join(map(str, at))}]",
               (Term(f"the input at [{', '.join(map(str, at))}]", (), computed),),
               (how, "moved, not computed"), computed, cell.recorded)


KINDS: dict[str, Callable[[_Cell], Why]] = {
    "embed": _embed,
    "project": lambda cell: _linear(cell, "W"),
    "view": _moved,
    "transpose": _moved,
    "scores": _scores,
    "scale": _scale,
    "mask": _mask,
    "softmax": _softmax,
    "attend": _attend,
    "concat": _concat,
    "w_o": lambda cell: _linear(cell, "W_O"),
}
"""How each stage kind's cells are explained (one entry per kind, in the pipeline's order)."""
