"""How one cell of any recorded op's output was made: the arithmetic behind the why of the
`op` stages (an op no rule places) and of the `error` stage (the last tensor recorded
before the forward raised).

`explain(cell, op, out, index)` recomputes output `out` of `op` at `index` from the op's
recorded inputs (their snapshots) and arguments, in float64, and sets the module's own
number beside it. Four families: elementwise and broadcast arithmetic (the input cells the
output cell reads after broadcasting, and the operation); products (matmul, bmm, linear,
addmm, baddbmm, einsum: the products and their sum, `cell.dot`); index-only ops (view,
transpose, cat, getitem ...: the input cell the number was copied from, found by running
the same op on the inputs' positions); reductions (sum, mean, max, softmax, var, norm ...).
NumPy's spellings (tracing/numpy_ops.py) are read as torch's where they mean the same. An
op mha-tui does not know is said to be so, with its inputs' shapes: the number is the
module's own, not recomputed (`Why.recomputed` False), never a made-up computation.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from ....records import OpRecord, TensorArg
from ..cell import Cell, Term, Why, WhyError, where
from .arith import elementwise, products
from .moves import MADE, MOVES, made, moved, triangle
from .reading import ALONG, BINARY, PRODUCTS, REDUCE, UNARY, OpCell, Unknown, bracket, tensor_name
from .reduce import reduction

__all__ = ["explain", "locate", "tensor_name"]

_ELEMENTWISE = set(UNARY) | set(BINARY) | {"gelu", "where", "masked_fill", "clamp", "clip",
                                           "clamp_min", "clamp_max"}


def explain(cell: Cell, op: OpRecord, out: int, index: tuple[int, ...]) -> Why:
    """How output `out` of `op` at `index` was made, recomputed from the op's recorded
    inputs; for an op mha-tui does not know, said so, and nothing recomputed."""
    c = OpCell(cell, op, out, index)
    b = c.base
    try:
        if b in MOVES:
            why = moved(c)
        elif b in ("tril", "triu"):
            why = triangle(c)
        elif b in MADE:
            why = made(c)
        elif b in PRODUCTS:
            why = products(c)
        elif b in REDUCE or b in ALONG:
            why = reduction(c)
        elif b in _ELEMENTWISE:
            why = elementwise(c)
        else:
            raise Unknown("")
    except WhyError:
        raise
    except Exception as error:  # arguments of a shape mha-tui cannot read: said so
        return unknown(c, "" if isinstance(error, Unknown) and not str(error) else
                       f"mha-tui could not read this call ({type(error).__name__}: {error})")
    if np.iscomplexobj(cell.record.values):
        value = complex(cell.record.values[cell.index])
        return _note(why, f"a complex number ({value.real:.6g} {'+-'[value.imag < 0]} "
                          f"{abs(value.imag):.6g}i): its real part is shown")
    return why


def _note(why: Why, note: str) -> Why:
    from dataclasses import replace

    return replace(why, notes=(*why.notes, note))


def unknown(c: OpCell, reason: str) -> Why:
    """An op mha-tui does not recompute: the op, its inputs' shapes, the module's number."""
    op, cell = c.op, c.cell
    terms = [Term(f"input {k}: {tensor_name(cell, op, k)}, shape "
                  f"({', '.join(map(str, np.shape(cell.operand(op, k))))})")
             for k in range(len(op.inputs))]
    numbers = [a for a in op.args if not isinstance(a, TensorArg | tuple)]
    if numbers:
        terms.append(Term(f"its other arguments: {', '.join(map(repr, numbers))}"))
    if op.kwargs:
        terms.append(Term("keywords: " + ", ".join(f"{k}={v!r}" for k, v in op.kwargs
                                                    if not isinstance(v, TensorArg))))
    recorded = cell.record.values[cell.index]
    notes = [f"mha-tui does not recompute {c.display}: this number is the module's own, "
             "read from the recording"] + ([reason] if reason else [])
    if np.iscomplexobj(recorded):
        notes.append(f"a complex number ({complex(recorded).real:.6g} "
                     f"{'+-'[complex(recorded).imag < 0]} {abs(complex(recorded).imag):.6g}i): "
                     "its real part is shown")
    return Why(cell.stage.id, cell.stage.kind, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {c.display}(...){bracket(c.index)}", tuple(terms),
               tuple(notes), float(np.real(recorded)), float(np.real(recorded)), recomputed=False)


def locate(cell: Cell, ops: tuple[OpRecord, ...] | list[OpRecord]
           ) -> tuple[OpRecord, int, tuple[int, ...]]:
    """The op (and which of its outputs) whose numbers the cell's tensor shows, and the cell's
    index in that output: the same shape, or regrouped for display (builder.regroup:
    (T, B, C) or (B * h, T, T) shown batch first)."""
    shown = cell.record.values
    for op in reversed(list(ops)):
        for k in reversed(range(len(op.outputs))):
            held = op.outputs[k].values
            cells = _arrangement(held, shown)
            if cells is not None:
                flat = int(cells[cell.index])
                return op, k, tuple(int(i) for i in np.unravel_index(flat, held.shape))
    raise WhyError(f"cannot tell which op of stage {cell.stage.id} made {cell.name}")


def _arrangement(held: np.ndarray, shown: np.ndarray) -> np.ndarray | None:
    """For each shown cell, the element number of `held` it shows; None if not held's."""
    if held.size != shown.size or held.dtype != shown.dtype:
        return None
    ids = np.arange(held.size)
    candidates = [ids.reshape(shown.shape)]
    if shown.ndim >= 2:
        candidates.append(ids.reshape(shown.shape[1], shown.shape[0], *shown.shape[2:]).swapaxes(0, 1))
    flat = held.reshape(-1)
    for cells in candidates:
        if _same(flat[cells], shown):
            return cells
    return None


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))
