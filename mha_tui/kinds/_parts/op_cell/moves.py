"""Index-only ops (view, transpose, cat, getitem, split ...): the input cell an output cell
was copied from, found by running the same op on the inputs' positions (an array of
element numbers instead of the values); tril/triu (kept or zeroed by position); tensors
made from nothing (zeros, ones, full, arange). Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from ....records import TensorArg
from ..cell import Term, Why
from .reading import IDENTITY, SAME_ORDER, OpCell, Unknown, bracket

MOVES = IDENTITY | SAME_ORDER | {
    "transpose", "swapaxes", "swapdims", "permute", "t", "T", "mT", "movedim", "moveaxis",
    "expand", "expand_as", "broadcast_to", "repeat", "tile", "cat", "concat", "concatenate",
    "stack", "split", "chunk", "tensor_split", "array_split", "unbind", "getitem", "select",
    "narrow", "index_select", "roll", "flip", "take"}
MADE = {"zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange"}


def _flat(values: tuple[object, ...]) -> tuple[object, ...]:
    """permute(0, 2, 1, 3) and permute((0, 2, 1, 3)) alike."""
    return tuple(values[0]) if len(values) == 1 and isinstance(values[0], tuple) else values


def _key(c: OpCell, value: object) -> object:
    """A recorded index (`t[:T, None, ...]`) as NumPy takes it."""
    if isinstance(value, TensorArg):
        return c.array(value) if c.array(value).dtype == bool else c.array(value).astype(np.int64)
    if value == "...":
        return Ellipsis
    if isinstance(value, tuple) and value and value[0] == "slice":
        return slice(*value[1:])
    if isinstance(value, tuple):
        return tuple(_key(c, v) for v in value)
    return value


def _dim(c: OpCell, pos: int, default: int = 0) -> int:
    return int(c.arg(pos, "dim", "axis", default=default))  # type: ignore[call-overload]


def _replay(c: OpCell, ids: list[np.ndarray]) -> np.ndarray:
    """The op run on element numbers: the output's cells say which input element they hold."""
    b, args = c.base, c.op.args
    x = ids[args[0].index] if args and isinstance(args[0], TensorArg) else None
    rest = _flat(args[1:])
    if b in ("cat", "concat", "concatenate", "stack"):
        parts = [ids[a.index] for a in args[0] if isinstance(a, TensorArg) and ids[a.index].size]  # type: ignore[union-attr]
        return (np.stack if b == "stack" else np.concatenate)(parts, axis=_dim(c, 1))
    if x is None:
        raise Unknown("no tensor argument first")
    if b in IDENTITY:
        return x
    if b in SAME_ORDER:
        return x.reshape(c.shape)
    if b == "transpose" and not c.numpy:
        return np.swapaxes(x, int(c.arg(1, "dim0")), int(c.arg(2, "dim1")))  # type: ignore[call-overload]
    if b == "transpose" or b == "permute":
        axes = rest or _flat((c.op.kwarg("axes", c.op.kwarg("dims")),))
        return np.transpose(x, None if axes in ((), (None,)) else [int(a) for a in axes])  # type: ignore[union-attr]
    if b in ("swapaxes", "swapdims"):
        return np.swapaxes(x, int(args[1]), int(args[2]))  # type: ignore[call-overload]
    if b in ("t", "T"):
        return x.T
    if b == "mT":
        return np.swapaxes(x, -1, -2)
    if b in ("movedim", "moveaxis"):
        return np.moveaxis(x, args[1], args[2])  # type: ignore[arg-type]
    if b in ("expand", "expand_as", "broadcast_to"):
        return np.broadcast_to(x, c.shape)
    if b == "repeat" and c.numpy:
        return np.repeat(x, args[1], axis=c.arg(2, "axis"))  # type: ignore[call-overload]
    if b in ("repeat", "tile"):
        return np.tile(x, rest)  # type: ignore[arg-type]
    if b in ("split", "chunk", "tensor_split", "array_split", "unbind"):
        dim = _dim(c, 1 if b == "unbind" else 2) % x.ndim
        if b == "unbind":
            return np.take(x, c.out, axis=dim)
        start = sum(o.shape[dim] for o in c.op.outputs[:c.out])
        return np.take(x, range(start, start + c.shape[dim]), axis=dim)
    if b == "getitem":
        return x[_key(c, args[1])]  # type: ignore[index]
    if b == "select":
        return np.take(x, int(args[2]), axis=int(args[1]))  # type: ignore[call-overload]
    if b == "narrow":
        start = int(args[2])  # type: ignore[call-overload]
        return np.take(x, range(start, start + int(args[3])), axis=int(args[1]))  # type: ignore[call-overload]
    if b in ("index_select", "take"):
        where, dim = (args[2], args[1]) if b == "index_select" else (args[1], c.arg(2, "axis"))
        return np.take(x, _key(c, where), axis=dim)  # type: ignore[call-overload]
    if b == "roll":
        return np.roll(x, c.arg(1, "shifts", "shift"), axis=c.arg(2, "dims", "axis"))  # type: ignore[call-overload]
    if b == "flip":
        return np.flip(x, rest or c.op.kwarg("dims", c.op.kwarg("axis")))  # type: ignore[arg-type]
    raise Unknown(b)


def moved(c: OpCell) -> Why:
    """The input cell this number was copied from."""
    shapes = [np.shape(c.cell.operand(c.op, k)) for k in range(len(c.op.inputs))]
    ids, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        ids.append(np.arange(start, start + size, dtype=np.int64).reshape(shape))
        start += size
    result = np.asarray(_replay(c, ids))
    if result.shape != tuple(c.shape):
        raise Unknown(f"replaying {c.op.name} gave shape {result.shape}, not {c.shape}")
    element = int(result[c.index])
    k = max(j for j in range(len(ids)) if ids[j].size and ids[j].flat[0] <= element)
    at = tuple(int(i) for i in np.unravel_index(element - int(ids[k].flat[0]), shapes[k]))
    name = c.name(TensorArg(k))
    value = c.cell.operand(c.op, k)[at]
    return c.why(f"{c.cell.name} = {name}{bracket(at)}",
                 [Term(f"{name}{bracket(at)}", (), float(np.real(value)))],
                 [f"{c.display} moves numbers and computes none: this one is copied from "
                  f"{name}{bracket(at)} (found by mha-tui running the same {c.op.name} on the "
                  "input's element positions)", *_how(c, k, at)], float(np.real(value)))


def _how(c: OpCell, k: int, at: tuple[int, ...]) -> list[str]:
    """Which input a joined tensor's cell comes from: cat, stack."""
    if c.base not in ("cat", "concat", "concatenate", "stack"):
        return []
    dim = _dim(c, 1) % len(c.shape)
    parts = [a for a in c.op.args[0] if isinstance(a, TensorArg)]  # type: ignore[union-attr]
    if c.base == "stack":
        return [f"stacked along dim {dim}: index {c.index[dim]} is input {parts.index(TensorArg(k))}"]
    start = 0
    for part in parts:
        size = np.shape(c.cell.operand(c.op, part.index))
        width = size[dim] if len(size) > dim else 0
        if part.index == k and start <= c.index[dim] < start + width:
            return [f"joined along dim {dim}: positions {start} to {start + width - 1} are "
                    f"{c.name(part)}; position {c.index[dim]} is its {at[dim]}"]
        start += width
    return []


def triangle(c: OpCell) -> Why:
    """tril/triu: kept where the column is on the right side of the diagonal, else 0."""
    x = c.array(c.arg(0, "input", "m"))
    diagonal = int(c.arg(1, "diagonal", "k", default=0))  # type: ignore[call-overload]
    i, j = c.index[-2], c.index[-1]
    name = c.name(c.arg(0, "input", "m"))
    lower = c.base == "tril"
    keep = j - i <= diagonal if lower else j - i >= diagonal
    value = float(x[read(x, c.index)]) if keep else 0.0
    rule = f"column - row {'<=' if lower else '>='} {diagonal}"
    return c.why(f"{c.cell.name} = {name}{bracket(c.index)} if {rule}, else 0",
                 [Term(f"column - row = {j} - {i}", (j, "-", i), j - i),
                  Term(f"kept: {name}{bracket(c.index)}" if keep else "outside the triangle: 0",
                       (), value)],
                 [f"{c.display} keeps the {'lower' if lower else 'upper'} triangle "
                  f"(diagonal {diagonal}) and writes 0 elsewhere"], value)


def read(values: np.ndarray, index: tuple[int, ...]) -> tuple[int, ...]:
    return index[len(index) - values.ndim:]


def made(c: OpCell) -> Why:
    """zeros, ones, full, arange: a tensor made from nothing the forward computed."""
    if c.base == "arange":
        numbers = [a for a in c.op.args if isinstance(a, int | float)]
        start, step = (0.0, 1.0) if len(numbers) < 2 else (float(numbers[0]),
                                                             float(numbers[2]) if len(numbers) > 2 else 1.0)
        value = start + c.index[0] * step
        return c.why(f"{c.cell.name} = start + {c.index[0]} × step",
                     [Term(f"{start:g} + {c.index[0]} × {step:g}", (start, "+", c.index[0], "×", step),
                           value)], [f"{c.display} counts from {start:g} in steps of {step:g}"],
                     value)
    if c.base.startswith("full"):
        fill = c.arg(1, "fill_value")
        value = float(fill)  # type: ignore[arg-type]
    else:
        value = 0.0 if c.base.startswith("zeros") else 1.0
    return c.why(f"{c.cell.name} = {value:g}", [Term("every cell", (), value)],
                 [f"{c.display} makes a tensor of {value:g}s: no input went into it"], value)
