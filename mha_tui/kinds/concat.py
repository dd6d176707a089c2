"""concat: after attend, the heads moved back side by side (transpose, view, cat, stack).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import ATOL, RTOL, close, einsum_spec, f64, tolerance
from ..ops.sizes import Sizes
from ..ops.vocab import SHAPE_OPS
from ..records import Check, OpRecord, Stage, TensorRecord, Trace
from ..stages import stage_info
from ._parts.builder import BHTD, BTC, BTHD, yes
from ._parts.cell import Cell, Term, Why, agrees, expanded_from, main_tensor, previous, where
from ._parts.maker import StageMaker, called, single_axes
from ._parts.op_cell import explain, locate
from ._parts.quizzing import Question, shape_question
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "concat"


def concat(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """After attend: moving heads back beside each other (transpose, view, cat)."""
    if not g.x_inputs(op) or not g.op_derives(op, {"attend", "sdpa"}) or g.op_derives(op, {"w_o"}):
        return None
    if op.name in {"cat", "stack", "concat", "concatenate", "hstack"} or op.name in SHAPE_OPS:
        return "concat"
    return None


RULES = (concat,)


def _joined_explanation(joined: str, batched: bool) -> str:
    """The concat stage's words when the heads' outputs are joined, not transposed back."""
    head_out, out = ("(B, T, d_h)", "(B, T, C)") if batched else ("(T, d_h)", "(T, C)")
    return (f"Each head returned its own {head_out} output, rows already in token order, so "
            f"nothing needs moving back: {joined} along the last axis lays the h outputs side "
            f"by side, {out}. Head i's d_h channels become channels i*d_h..(i+1)*d_h-1 of every "
            "token's row, the same layout a fused module gets from transpose and view.")


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    b, s = m.b, m.s
    ops = [m.op(i) for i in unit.ops]
    final = ops[-1]
    attend_values = m.out_of_kind.get("attend", (None, None))[0]
    attend_snap = m.out_of_kind.get("attend", (None, None))[1]
    tensors, checks = [], []
    moved = next((op for op in ops if op.name in ("transpose", "permute")), None)
    if moved is not None:
        src = m.snap(m.x_in(moved))
        src_name = m.tensor_name(m.g.producer(m.x_in(moved))) \
            if m.g.producer(m.x_in(moved)) else "context"
        args = ", ".join(str(a) for a in moved.scalars())
        strided_name = f"{src_name}.{moved.name}({args})"
        tensors.append(b.record(strided_name, moved.out, m.dims(moved.out.shape, BTHD),
                                share=(f"attend's {src_name}", src)))
        shares = moved.out.storage == src.storage
        checks.append(Check(f"the transposed view shares storage: {yes(shares)}, "
                            f"contiguous: {yes(moved.out.contiguous)}", shares))
        if final is not moved:
            copied = final.out.storage != moved.out.storage
            checks.append(Check(f"contiguous() copied the numbers into new storage: {yes(copied)}"
                                if any(op.name == "contiguous" for op in ops) else
                                f"reshape copied the numbers into new memory (a view cannot "
                                f"read them in this order): {yes(copied)}"
                                if final.name == "reshape" and not moved.out.contiguous else
                                f"the result has its own storage: {yes(copied)}",
                                copied or moved.out.contiguous))
    name = m.tensor_name(final, fallback="context")
    if final.name in ("cat", "concat", "stack", "hstack"):
        share = None
    else:
        share = ("the transposed view", moved.out) if moved is not None and final is not moved else None
    tensors.append(b.record(name, final.out, m.dims(final.out.shape, BTC), share=share,
                            head_split=2 if s.h > 1 else None,
                            caption="heads side by side: block i is head i's output"))
    merged = m.batched(final.out.values)
    per_head = m.batched(attend_values) if attend_values is not None else None
    if per_head is not None and merged.ndim == 3 and per_head.ndim == 4:
        blocks = all(np.array_equal(merged[:, :, i * s.d_h:(i + 1) * s.d_h],
                                    per_head[:, i], equal_nan=True) for i in range(s.h))
        checks.append(Check(f"channels i*{s.d_h}..(i+1)*{s.d_h}-1 hold head i's {name}", blocks))
    if final.name in ("cat", "concat", "concatenate", "hstack"):
        joined = _joined_name(final)
        checks.insert(0, Check(f"{joined} put the {s.h} heads' outputs side by side along the "
                               f"last axis", None))
    stacked = next((op for op in ops if op.name == "stack"), None)
    if stacked is not None:
        checks.insert(0, Check(f"np.stack put the {s.h} heads' outputs on a new head axis: "
                               f"{_shape_text(stacked.out.shape)}", None))
    src_shape = attend_snap.shape if attend_snap is not None else m.snap(m.x_in(ops[0])).shape
    explanation = None
    if moved is not None and any(op.name == "contiguous" for op in ops):
        explanation = stage_info("concat").explain(
            {"strided_contiguous": moved.out.contiguous}, why=single_axes(s.T, s.h))
    elif moved is not None and final is not moved:  # permute(...).reshape(...), einops ...
        explanation = _moved_back_explanation(m, moved, final, ops)
    elif moved is None and final.name in ("cat", "concat", "concatenate", "hstack"):
        explanation = _joined_explanation(_joined_name(final), s.batched)
    src_in = m.snap(m.x_in(ops[0])).shape if not m.b.per_head \
        else b.unbatched((s.B, s.h, s.T, s.d_h), BHTD) if attend_values is not None else src_shape
    # dims_in as the attend op holds it: (B, h, T, d_h), or torch's MHA's (B * h, T, d_h)
    return m.stage(unit, stage_id, "concat", tensors, checks, shape_in=src_in,
                      shape_out=final.out.shape, explanation=explanation,
                      dims_in=m.dims(src_in, BHTD), dims_out=m.dims(final.out.shape, BTC))


def _joined_name(op: OpRecord) -> str:
    return {"concatenate": "np.concatenate", "hstack": "np.hstack"}.get(op.name, "torch.cat")

def _called(m: StageMaker, op: OpRecord) -> str:
    """An op as the words name it: `permute(0, 2, 1, 3)`, `reshape(B, T, C)` (a shape by the
    output's own axis names)."""
    if op.name in ("view", "reshape"):
        dims = m.dims(op.out.shape, BTC)
        named = dims if not dims or not dims[0].startswith("d0") else op.out.shape
        return f"{op.name}({', '.join(map(str, named))})"
    return called(op)



def _moved_back_explanation(m: StageMaker, moved: OpRecord, final: OpRecord,
                            ops: list[OpRecord]) -> str:
    """The concat stage's words from the ops the module ran (transpose or permute, then
    view, reshape or flatten, with or without contiguous), not one fixed spelling."""
    steps = [op for op in ops if op.index >= moved.index and op.name != "contiguous"]
    later = " then ".join(_called(m, op) for op in steps[1:]) or _called(m, final)
    strided = moved.out.contiguous
    copied = final.out.storage != moved.out.storage
    first = (f"{_called(m, moved)} brings the token axis back in front: (B, T, h, d_h), "
             + ("a view that is already contiguous" if strided else "a strided view") + ". ")
    copy = ("it copies the numbers into the new order, since a view cannot read them in this "
            "order" if copied else "it copies nothing, the memory already being in this order")
    return (first + f"{later} then lays the h heads' d_h channels side by side, (B, T, C): "
            + copy + ".")


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


# ---------------------------------------------------------------------- judging


def attend_output(j: Judge) -> np.ndarray | None:
    """The heads' contexts as (B, h, T, d_h), from the attend op(s)' own outputs."""
    outs: list[tuple[int | None, np.ndarray]] = []
    for stage in j.trace.stages:
        if stage.kind != "attend":
            continue
        if j.is_sdpa(stage):
            op = next(op for op in stage.ops if op.name == "scaled_dot_product_attention")
            return j.heads_axis(f64(op.out.values))
        for op in j.main_ops(stage, {"matmul", "bmm", "einsum", "baddbmm"}):
            values = f64(op.out.values)
            if op.name == "einsum":
                spec = einsum_spec(op)
                if spec is None:
                    return None
                (la, lb), out = spec
                d = next((c for c in lb if c not in la), None)
                k = next((c for c in la if c in lb and c not in out), None)
                q = next((c for c in la if c not in lb and c in out), None)
                if d is None or q is None or k is None:
                    return None
                batch = [c for c in out if c not in (q, d)]
                values = np.einsum(f"{out}->{''.join(batch)}{q}{d}", values)
            if values.ndim > 4:  # (B, h_kv, n, T, d_h): gpt-oss's query heads grouped by K/V
                values = values.reshape(values.shape[0], -1, *values.shape[-2:])
            outs.append((j.head_index(op), values))  # h_kv-major, as the module's own merge
    if not outs:
        return None
    if len(outs) > 1:
        return np.stack([v.reshape(j.B, j.T_q, -1) for _, v in
                         sorted(outs, key=lambda o: o[0] or 0)], axis=1)
    values = outs[0][1]
    if values.ndim == 4 and values.shape[1] != j.h and values.shape[2] == j.h:
        values = values.transpose(0, 2, 1, 3)  # (B, T, h, d_h) from an einsum
    return j.heads_axis(values)


def judge(j: Judge) -> list[Row]:
    rows = []
    context = attend_output(j)
    for stage in j.trace.stages:
        if stage.kind != "concat":
            continue
        ops = [op for op in stage.ops if j.g.from_x[op.index]]
        if not ops or context is None:
            rows.append(j.row(stage, "concat", None, None, "not judged"))
            continue
        final = f64(ops[-1].out.values)
        if final.size != context.size:
            rows.append(j.row(stage, "concat", None, None, "not judged (sizes differ)"))
            continue
        got = final.reshape(j.B, j.T_q, j.h * context.shape[-1])
        expected = context.transpose(0, 2, 1, 3).reshape(got.shape)
        good, d = close(got, expected)
        if not good and j.B > 1 and final.ndim == 2:
            # Sequence first, (T * B, C): nn.MultiheadAttention merges the heads so inside
            # (batch_first=False, or batch_first=True once it has transposed), and the output
            # projection then reads those rows; with one batch row the two layouts coincide.
            good, d = close(final.reshape(j.T_q, j.B, -1).transpose(1, 0, 2), expected)
        diag = None
        if not good:
            if np.allclose(got.reshape(-1), context.reshape(-1), **tolerance(atol=ATOL, rtol=RTOL)):
                diag = ("merge_without_transpose",
                        "heads merged without moving the head axis back: (B, h, T, d_h) was "
                        "viewed as (B, T, C) directly, so token t's row holds pieces of other "
                        "tokens from one head; transpose(1, 2) first, then "
                        "contiguous().view(B, T, C)")
            elif np.allclose(np.sort(got.reshape(-1)), np.sort(context.reshape(-1)),
                    **tolerance(atol=ATOL, rtol=RTOL)):
                diag = ("merge_permuted", "the concatenated heads hold the right numbers in "
                                          "the wrong places (a permutation)")
            else:
                diag = ("merge_wrong", "the concatenation is not the heads' contexts")
        culprit = next((op for op in reversed(ops) if op.name in ("view", "reshape", "flatten",
                                                                  "cat", "concat", "hstack")),
                       ops[-1])
        rows.append(j.row(stage, "concat", good, d,
                             f"head i's context in channels [{j.d_h}i, {j.d_h}i+"
                             f"{j.d_h}) of its token's row",
                             source=culprit.source if not good else None, diagnosis=diag))
    return rows

# ------------------------------------------------------------ output projection


def why(cell: Cell) -> Why:
    """A concatenated channel: which head and channel of attend's output it holds."""
    attend = previous(cell, "attend")
    heads = main_tensor(attend)
    fused = expanded_from(attend)
    notes: tuple[str, ...] = ()
    if fused is not None:  # concat joins what the fused op returned, not mha-tui's expansion
        heads = next((t for t in attend.tensors if t.values.shape == fused.out.values.shape
                      and np.array_equal(t.values, fused.out.values, equal_nan=True)), heads)
        notes = ("read from what F.scaled_dot_product_attention returned (the module's own "
                 "output), not from mha-tui's expansion of it",)
    d_h = heads.values.shape[-1]
    replayed = _replayed(cell, heads.values)
    *_, t, c = cell.index
    head, channel = divmod(c, d_h)
    at = (head, t, channel) if heads.values.ndim == 3 else (0, head, t, channel)  # NumPy: no B
    name = heads.name.split(" (fused")[0]  # sdpa's "y (fused, from the module)": y
    if replayed is not None and (replayed != at or cell.record.values.ndim != len(at) - 1):
        return _moved(cell, name, heads, replayed, notes)
    computed = float(heads.values[at]) if all(i < n for i, n in zip(at, heads.values.shape,
                                                                    strict=False)) else np.nan
    if not agrees(computed, cell.recorded):
        # heads of another width than C / h (differential attention's 2 d_h), or laid out as
        # (T, B, C) after (B * h, T, d_h) (open_clip): the stage's own last op, replayed from
        # its recorded input
        op, out, index = locate(cell, cell.stage.ops)
        made = explain(cell, op, out, index)
        return replace(made, kind="concat", notes=(*made.notes, *notes))
    return Why(cell.stage.id, "concat", cell.record.name, cell.index, where(cell),
               f"{cell.name} = {name}[{', '.join(map(str, at))}]  (column {c} = head "
               f"{head} × d_h {d_h} + channel {channel})",
               (Term(f"head {head}, channel {channel}, token {cell.token(t)} (attend)", (),
                     computed),),
               (f"concat lays the heads side by side: columns {head * d_h}-{head * d_h + d_h - 1} "
                f"hold head {head}", "the value is copied, not computed", *notes),
               computed, cell.recorded)


_REPLAYED = {"transpose", "permute", "view", "reshape", "contiguous"}


def _replayed(cell: Cell, heads: np.ndarray) -> tuple[int, ...] | None:
    """Where in attend's result the cell's number was copied from, found by running the
    stage's own ops (transpose, permute, view, reshape) on element numbers; None when the
    stage starts from something else (the heads' own outputs, cat, stack) or holds another op."""
    ops = cell.stage.ops
    if not ops or any(op.name not in _REPLAYED for op in ops) or not np.array_equal(
            cell.operand(ops[0], 0), heads, equal_nan=True):
        return None
    ids = np.arange(heads.size).reshape(heads.shape)
    for op in ops:
        axes = tuple(a for a in op.args[1:] if isinstance(a, int))
        if len(op.args) == 2 and isinstance(op.args[1], tuple):
            axes = tuple(op.args[1])  # permute((0, 2, 1, 3)), view((B, T, C))
        if op.name == "transpose" and len(axes) == 2:
            ids = np.swapaxes(ids, *axes)
        elif op.name in ("permute", "transpose") and sorted(axes) == list(range(ids.ndim)):
            ids = ids.transpose(axes)  # NumPy's transpose(1, 0, 2) is a permutation
        elif op.name in ("view", "reshape"):
            ids = ids.reshape(op.out.shape)
        elif op.name != "contiguous":
            return None
        if ids.shape != tuple(op.out.shape):
            return None
        if ids.shape == cell.record.values.shape and np.array_equal(
                op.out.values, cell.record.values, equal_nan=True):
            return tuple(int(k) for k in np.unravel_index(int(ids[cell.index]), heads.shape))
    return None


def _moved(cell: Cell, name: str, heads: TensorRecord, at: tuple[int, ...],
           notes: tuple[str, ...]) -> Why:
    """A cell the stage's ops took from attend's result at `at`: a tensor not yet merged into
    (B, T, C), or heads merged in another order (a view without the transpose)."""
    head, t, channel = at[-3:]
    computed = float(heads.values[at])
    ops = ", ".join(dict.fromkeys(op.name for op in cell.stage.ops))
    said = [f"the stage's ops ({ops}), replayed by mha-tui on element numbers, copy "
            f"{name}[{', '.join(map(str, at))}] here"]
    *_, t_here, c = cell.index
    if cell.record.dims[-1] == "C":
        expected = divmod(c, heads.values.shape[-1])
        if (t, (head, channel)) != (t_here, expected):
            said.append(f"so column {c} of token {cell.token(t_here)} holds head {head}'s channel "
                        f"{channel} of token {cell.token(t)}, not head {expected[0]}'s channel "
                        f"{expected[1]} of token {cell.token(t_here)}: the heads were not moved "
                        "back next to each other before the merge")
    elif cell.record.dims[-2:] == ("h", "d_h"):
        said.append("the heads are not merged into C columns in this tensor: each token still "
                    "holds h rows of d_h")
    return Why(cell.stage.id, "concat", cell.record.name, cell.index, where(cell),
               f"{cell.name} = {name}[{', '.join(map(str, at))}]  (head {head}, token "
               f"{cell.token(t)}, channel {channel})",
               (Term(f"head {head}, channel {channel}, token {cell.token(t)} (attend)", (),
                     computed),),
               (*said, "the value is copied, not computed", *notes), computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The shape once the heads are side by side again."""
    return (shape_question(stage, stage.tensors[-1], "joining the heads"),) if stage.tensors else ()
