"""transpose: the head axis moved in front of the token axis, (B, T, h, d_h) -> (B, h, T, d_h).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import equal
from ..ops.sizes import Sizes
from ..records import Check, OpRecord, Ref, Snapshot, Stage, TensorRecord, Trace
from ..stages import stage_info
from ._parts.builder import BHTD, BTHD, yes
from ._parts.cell import Cell, Why, moved
from ._parts.maker import StageMaker, called, single_axes
from ._parts.quizzing import Question, shape_text
from ._parts.unit import Unit

KIND = "transpose"


def head_move(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """transpose/permute bringing the head axis in front of the token axis."""
    if op.name not in {"transpose", "permute", "swapaxes", "movedim"} or not g.x_inputs(op):
        return None
    if g.op_derives(op, {"scores", "attend"}) or not g.op_derives(op, {"view", "qkv_split"}):
        return None
    shape = op.out.shape
    if _swaps_last_two(op, len(shape)):
        return None  # k.transpose(-2, -1): part of q @ k^T, not a move of the head axis
    if len(shape) >= 3 and shape[-1] == sizes.d_h and shape[-2] == sizes.T:
        return "transpose"
    return None


def _swaps_last_two(op: OpRecord, ndim: int) -> bool:
    numbers = [a for a in op.scalars() if isinstance(a, int) and not isinstance(a, bool)]
    if op.name in {"transpose", "swapaxes", "swapdims"} and len(numbers) >= 2:
        return {n % ndim for n in numbers[:2]} == {ndim - 2, ndim - 1}
    if op.name == "permute":
        perm = next((a for a in op.scalars() if isinstance(a, tuple)), tuple(numbers))
        return len(perm) == ndim and perm[-1] % ndim != ndim - 1
    return op.name in {"t", "mT"}


RULES = (head_move,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    b, s = m.b, m.s
    ops = [m.op(i) for i in unit.ops]
    tensors, blocks, shared = [], True, True
    first_projected: Snapshot | None = None
    q_projected: Snapshot | None = None
    split_parts = False
    for op in ops:
        src_ref = m.x_in(op)
        src = m.snap(src_ref)
        name = m.tensor_name(op)
        tensors.append(b.record(name, op.out, m.role_dims(op, op.out.shape, BHTD),
                                share=(m.origin_name(src_ref), src)))
        shared &= op.out.storage == src.storage
        projected = _project_source(m, src_ref)
        moved, from_projection = m.batched(op.out.values), None
        if projected is not None:
            from_projection = m.batched(projected.values)
        if from_projection is not None and moved.ndim == 4 and from_projection.ndim == 4:
            split_parts = True  # a fused split's part, heads already cut: (B, T, h, d_h)
            for i in range(moved.shape[1]):
                blocks &= equal(moved[:, i], from_projection[:, :, i])
        elif from_projection is not None and moved.ndim == 4 and from_projection.ndim == 3:
            first_projected = first_projected or projected
            if _role_of_chain(m, op) == "Q":
                q_projected = projected
            for i in range(s.h):
                blocks &= equal(moved[:, i], from_projection[:, :, i * s.d_h:(i + 1) * s.d_h])
    out = ops[0].out
    checks = [
        Check(f"head i holds channels i*{s.d_h}..(i+1)*{s.d_h}-1 of every token", blocks)
        if not split_parts else
        Check("head i holds head i of the fused split's part, now in front of the tokens",
              blocks),
        Check(f"same storage as the view, strides now {out.strides}, "
              f"contiguous: {yes(out.contiguous)}", shared),
    ]
    aside: tuple[TensorRecord, ...] = ()
    q = q_projected or first_projected
    q_name = tensors[0].name
    if q is not None and m.batched(q.values).ndim == 3 and m.batched(out.values).ndim == 4:
        wrong = q.values.reshape(out.values.shape)
        differs = not np.array_equal(wrong, out.values if _role_of_chain(m, ops[0]) == "Q"
                                     else tensors[0].values)
        checks.append(Check(f"a single {q_name}.{_wrong_call(m)} gives different heads: "
                            f"{yes(differs)}", None))
        aside = (_wrong_view(m, q, q_name, differs),)
    src = m.snap(m.x_in(ops[0]))
    facts = {"result_contiguous": out.contiguous,
             "wrong_view_equal": bool(aside) and not aside[0].caption.startswith("WRONG")}
    explanation = stage_info("transpose").explain(facts, why=single_axes(s.T, s.h))
    # The words name the op the module ran (permute(0, 2, 1, 3), swapaxes(1, 2), einops'
    # rearrange recorded as a permute), not the catalogue's spelling.
    ran = called(ops[0])
    if explanation.startswith("transpose(1, 2) swaps") and ran != "transpose(1, 2)":
        explanation = ran + explanation[len("transpose(1, 2)"):]
    return m.stage(unit, stage_id, "transpose", tensors, checks, shape_in=src.shape,
                      shape_out=out.shape, dims_in=m.dims(src.shape, BTHD),
                      dims_out=m.dims(out.shape, BHTD), aside=aside, explanation=explanation)

def _project_source(m: StageMaker, ref: Ref) -> Snapshot | None:
    """Follow a tensor back through view/transpose to the projection's (B, T, C) output
    (none when rotary turned it or a scale multiplied it on the way: its numbers are no
    longer the projection's)."""
    for _ in range(8):
        op = m.g.producer(ref)
        if op is None or m.g.kind.get(op.index) in ("rotary", "scale"):
            return None
        if m.g.kind.get(op.index) in ("project", "qkv_split"):
            return op.outputs[ref.output]
        ref = m.x_in(op) if m.g.x_inputs(op) else ref
    return None

def _role_of_chain(m: StageMaker, op: OpRecord) -> str:
    ref = m.x_in(op)
    for _ in range(8):
        producer = m.g.producer(ref)
        if producer is None:
            return "?"
        if m.g.kind.get(producer.index) == "project":
            if producer.name in ("split", "chunk", "unbind"):
                return "QKV"[min(ref.output, 2)]
            return m.b.role(producer)
        ref = m.x_in(producer)
    return "?"

def _wrong_call(m: StageMaker) -> str:
    """The tempting single call that splits heads without moving them."""
    return "view(B, h, T, d_h)" if m.s.batched else "reshape(h, T, d_h)"

def _wrong_view(m: StageMaker, q: Snapshot, name: str, differs: bool) -> TensorRecord:
    s = m.s
    B, T, C = m.batched(q.values).shape
    # which token and head each row of one batch row's wrong view holds (every row alike)
    token_of = np.repeat(np.arange(T), C).reshape(1, s.h, T, s.d_h)[..., 0]
    head_of = np.tile(np.arange(C) // s.d_h, T).reshape(1, s.h, T, s.d_h)[..., 0]
    tokens = m.b.config.tokens
    counts = Counter(tokens)  # counted once: a count per row is O(T^2) at T 512

    def word(t: int) -> str:
        if t >= len(tokens):
            return str(t)
        # A repeated token is told apart by its position ("the·0·h1"), as on token axes.
        return f"{tokens[t]}·{t}" if counts[tokens[t]] > 1 else tokens[t]

    words = [word(t) for t in range(T)]  # once per token, not once per (head, row)
    token_rows, head_rows = token_of[0].tolist(), head_of[0].tolist()
    tags = tuple(tuple(f"{words[t]}·h{head}" for t, head in zip(tokens_i, heads_i, strict=True))
                 for tokens_i, heads_i in zip(token_rows, head_rows, strict=True))
    tag_heads = tuple(tuple(row) for row in head_rows)
    caption = (f"WRONG: one {_wrong_call(m)} reads memory in the old order; each row is "
               "labelled with the token and head block it really holds" if differs else
               f"the same numbers as the right {name} here, because {single_axes(T, s.h)}; "
               f"each row is labelled with the token and head block it holds")
    values = q.values.reshape(B, s.h, T, s.d_h)
    if not s.batched:
        values = values[0]
    unit = q.values.itemsize if q.stride_unit == "bytes" else 1
    strided = Snapshot(values=values, shape=values.shape,
                       strides=tuple(n * unit for n in _c_strides(values.shape)),
                       contiguous=True, storage=q.storage, stride_unit=q.stride_unit)
    return m.b.record(f"{name}.{_wrong_call(m)}", strided, BHTD, values=values,
                         share=(f"project's {name}", q), caption=caption,
                         row_tags=tags, row_tag_heads=tag_heads)

def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def why(cell: Cell) -> Why:
    """The same number, found at another index of the input (moved, not computed)."""
    return moved(cell)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The strides after transpose: the same memory, read in another order."""
    if not stage.tensors:
        return ()
    record = stage.tensors[-1]
    unit = "bytes" if record.stride_unit == "bytes" else "elements"
    return (Question(stage.id, "strides", f"What are the strides of {record.name} after "
                     f"transpose (in {unit}), shape {shape_text(record.shape)}?", "shape",
                     record.strides, shape_text(record.strides),
                     f"the recorded strides of {record.name} (dims ({', '.join(record.dims)})): "
                     f"transpose swaps two axes' strides and moves no number"),)
