"""The product behind a cell of project, scores, attend or w_o, whatever op the module wrote it
with: `x @ W` / torch.matmul on a raw weight parameter (or its .T), torch.einsum with any
subscripts, torch.bmm or mm. Each kind's why explains the cell in its own words (score_why,
weighted_sum_why, a weight's row dotted with x); the numbers and their labels are read from
the op's recorded inputs by op_cell's product arithmetic (`factors`), never computed apart.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...records import TensorArg
from .builder import einsum_swapped
from .cell import Cell, Term, Why, WhyError, dot, fused_part, linear, reindex, where
from .op_cell import explain
from .op_cell.arith import Factors, factors
from .op_cell.reading import OpCell, tensor_name

PRODUCTS = ("matmul", "mm", "bmm", "einsum")
_WEIGHTS = ("param", "buffer", "const")
_TRANSPOSES = ("T", "t", "mT", "transpose", "permute")


def product_at(cell: Cell, names: tuple[str, ...] = PRODUCTS) -> tuple[OpCell, tuple[int, ...]]:
    """The product op whose result the cell's tensor shows (as it is, read in another shape
    such as torch's (B*h, T, .), or heads first for an einsum that writes tokens first), the
    cell's index in its output, and which output axis each shown axis is."""
    shown = cell.record.values
    for op in reversed(cell.ops(*names)):
        held = op.out.values
        order = list(range(held.ndim))
        swapped = einsum_swapped(op) if op.name == "einsum" else None
        if swapped is not None:
            a, b = swapped
            order[a], order[b] = order[b], order[a]
        arranged = held.transpose(order)
        if arranged.size != shown.size or not np.array_equal(arranged.reshape(shown.shape), shown,
                                                              equal_nan=True):
            continue
        at = reindex(cell.index, shown.shape, arranged.shape)
        index = [0] * held.ndim
        for axis, k in zip(order, at, strict=True):
            index[axis] = k
        return OpCell(cell, op, 0, tuple(index)), tuple(order)
    ops = cell.ops(*names)
    part = fused_part(cell, ops)  # q, k or v cut from one fused product (chunk, split)
    if part is not None:
        op, (first, _) = part
        return OpCell(cell, op, 0, (*cell.index[:-1], cell.index[-1] + first)), \
            tuple(range(len(cell.index)))
    if ops and len(ops[-1].out.shape) == len(cell.index) - 1:  # one op per head (a ModuleList)
        op, index = cell.per_head(ops)
        return OpCell(cell, op, 0, index), tuple(range(len(index)))
    raise WhyError(f"stage {cell.stage.id} holds no product (matmul, einsum, bmm) that made "
                   f"{cell.name}")


def operand_name(c: OpCell, k: int) -> str:
    """Input k of the op by where it came from; a weight read transposed as `W.T`."""
    ref = c.op.inputs[k]
    recording = c.cell.trace.recording
    if ref.kind == "op" and recording is not None and ref.op is not None:
        producer = recording.ops[ref.op]
        inner = producer.inputs[0] if len(producer.inputs) == 1 else None
        if producer.name in _TRANSPOSES and inner is not None and inner.kind in _WEIGHTS \
                and len(producer.out.shape) == 2:
            return f"{inner.name}.T"
    return tensor_name(c.cell, c.op, k)


def read(c: OpCell) -> Factors:
    """The op's two factors at the cell, its operands named as `operand_name` says."""
    refs = [a for a in c.op.args for a in (a if isinstance(a, tuple) else (a,))
            if isinstance(a, TensorArg)]
    names = tuple(operand_name(c, r.index) for r in refs[:2])
    return factors(c, names if len(names) == 2 else None)  # type: ignore[arg-type]


def called(c: OpCell) -> str:
    """The op as the code calls it: torch.einsum('bqhd,bkhd->bhqk'), np.einsum('htd,hsd->hts'),
    Tensor.matmul (`@`)."""
    if c.op.name == "einsum":
        return f"{'np' if c.numpy else 'torch'}.einsum({str(c.op.args[0]).replace(' ', '')!r})"
    return c.display


def by_rows(cell: Cell, names: tuple[str, ...] = ("einsum",)) -> tuple[OpCell, Factors]:
    """The product at the cell, its factors in the order the stage reads them: first the one
    that holds the cell's row (the query's: Q of scores, the weights of attend), whichever
    order the einsum's operands were written in."""
    c, order = product_at(cell, names)
    f = read(c)
    row = _row_letter(f, order, cell.record.values.ndim)
    if f.letters is not None and row is not None and row not in f.letters[0] and row in f.letters[1]:
        f = replace(f, a=f.b, b=f.a, names=f.names[::-1], at=f.at[::-1],
                    letters=(f.letters[1], f.letters[0], f.letters[2]))
    return c, f


def _row_letter(f: Factors, order: tuple[int, ...], shown_ndim: int) -> str | None:
    """The einsum output letter of the cell's row axis (the second-last shown axis)."""
    if f.letters is None or len(f.letters[2]) < 2:
        return None
    out = f.letters[2]
    return out[order[-2]] if len(out) == shown_ndim == len(order) else out[-2]


def summed_over(f: Factors) -> str:
    """What the sum runs over, in the einsum's letters or as the one axis of a matmul."""
    return f"the sum runs over {', '.join(f.summed)}" if f.summed else "one sum over their shared axis"


def generic(c: OpCell, note: str) -> Why:
    """The op's own arithmetic (op_cell), when the product is not the kind's one dot product
    (an einsum summing over more than one letter)."""
    why = explain(c.cell, c.op, c.out, c.index)
    return replace(why, kind=c.cell.stage.kind, notes=(note, *why.notes))


def weight_row_why(cell: Cell, role: str) -> Why:
    """A channel of a projection written as a product with a raw weight (x @ W, x @ W.T,
    torch.matmul, einsum("btc,oc->bto")): the token's x dotted with the weight's column or row
    that makes it, the weight read as the op read it."""
    c, _ = product_at(cell)
    f = read(c)
    weight = next((k for k in (0, 1) if _is_weight(c, k)), 1)
    if weight == 0:  # W @ x: the weight is the first factor
        f = replace(f, a=f.b, b=f.a)
    if len(f.summed) > 1:
        return generic(c, f"the sum runs over {', '.join(f.summed)}: every output channel reads "
                          "them all")
    d_h = cell.trace.config.head_dim
    labels = [(f"in {k} (head {k // d_h}, d{k % d_h}): " if role == "W_O" else f"in {k}: ")
              + label for k, label in enumerate(f.labels)]
    terms, notes, total = dot(cell, f.a, f.b, labels, "products")
    if f.extra:
        total += sum(t.value or 0.0 for t in f.extra)
        terms = (*terms[:-1], *f.extra, Term("sum", (), total))
    x_name, w_name = f.names if weight == 1 else f.names[::-1]
    at = f.at[weight]
    what = (f"row {at[0]}" if at[-1] == ":" else f"column {at[-1]}") if len(at) == 2 else "this part"
    heads = (f"every output channel mixes all heads: in-channels of head h are h·{d_h} to "
             f"h·{d_h}+{d_h - 1}",) if role == "W_O" else ()
    width, made = cell.record.values.shape[-1], c.op.out.shape[-1]
    if made != width:  # one fused product, cut into q, k and v
        first = c.index[-1] - cell.index[-1]
        heads = (f"{cell.record.name} is channels {first}-{first + width - 1} of one fused "
                 f"product's output ({made} channels, cut by split or chunk): its channel "
                 f"{cell.index[-1]} is the product's channel {c.index[-1]}",)
    return Why(cell.stage.id, cell.stage.kind, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {f.formula}", terms,
               (*heads, f"{x_name} and {w_name} are {called(c)}'s recorded inputs: {what} of "
                        f"{w_name}, dotted with the token's x, makes this channel", *notes),
               total, cell.recorded)


def _is_weight(c: OpCell, k: int) -> bool:
    ref = c.op.inputs[k]
    if ref.kind in _WEIGHTS:
        return True
    return operand_name(c, k).endswith(".T") and ref.kind == "op"


def projection_why(cell: Cell, role: str) -> Why:
    """A channel of a projection (Q, K, V or W_O): the input row dotted with one row of the
    weight (nn.Linear, F.linear, NumPy's x @ W), or with the column or row of a raw weight
    parameter the product reads (x @ W, torch.matmul, x @ W.T, einsum), plus the bias the
    module adds apart from the product (`+ self.b_Q`), where it does."""
    biased = _bias_added(cell)
    if biased is not None:
        return biased
    if not cell.ops("linear") and cell.ops(*PRODUCTS):
        try:
            return linear(cell, role)  # NumPy's 2-d x @ W
        except WhyError:
            return weight_row_why(cell, role)
    return linear(cell, role)


def _bias_added(cell: Cell) -> Why | None:
    """The cell of a projection whose bias is added apart from its product
    (`x @ self.W_q + self.b_q`, `einsum(...) + self.b_Q` with b_Q of shape (h, d_h)): the
    product's cell explained as any product's, then the bias term, read from the add's own
    recorded inputs."""
    shown = cell.record.values
    recording = cell.trace.recording
    if recording is None:
        return None
    for op in cell.ops("add", "add_"):
        refs = list(op.inputs)
        product = [k for k, r in enumerate(refs) if r.kind == "op"]
        bias = [k for k, r in enumerate(refs) if r.kind in _WEIGHTS]
        held = op.out.values
        if len(refs) != 2 or len(product) != 1 or len(bias) != 1 or held.size != shown.size \
                or not np.array_equal(held.reshape(shown.shape), shown, equal_nan=True):
            continue
        before = cell.operand(op, product[0])
        if before.size != shown.size:
            continue
        inner = replace(cell, record=replace(cell.record, values=before.reshape(shown.shape)))
        why = projection_why(inner, _role_of(cell))
        b = cell.operand(op, bias[0])
        at = reindex(cell.index, shown.shape, held.shape)
        b_at = at[len(at) - b.ndim:]
        value = float(b[b_at])
        name = refs[bias[0]].name or "bias"
        label = f"+ {name}[{', '.join(map(str, b_at))}]"
        total = why.computed + value
        terms = (*why.terms[:-1], Term(label, (), value), Term("sum", (), total)) \
            if why.terms and why.terms[-1].label == "sum" else \
            (*why.terms, Term(label, (), value), Term("sum", (), total))
        note = (f"then {name} {tuple(b.shape)} is added apart from the product (line "
                f"{op.source.line}): {label[2:]} = {value:.4f}, the same for every token")
        return replace(why, terms=terms, formula=f"{why.formula} + {label[2:]}",
                       notes=(*why.notes, note), computed=total, recorded=cell.recorded)
    return None


def _role_of(cell: Cell) -> str:
    return "W_O" if cell.stage.kind == "w_o" else "W"
