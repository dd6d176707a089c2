"""Judgements of the whole forward, before and after the stages are judged one by one.

- `no_attention`: a forward with no softmax over token scores (no attention at all: `return
  x`, one nn.Linear), or a module with no parameters (nothing to find by role), is "no
  attention found", never equivalent.
- `output_shape`: multi-head attention returns x's shape (B, T, C); anything else is named
  with both shapes at the line that made it.
- `nan_origin`: where NaN first appears in the forward and why (a fully masked row: softmax
  of all -inf is NaN), so the stages that only carry it are not blamed.

Reads only records; never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kinds._parts.maker import api_name
from ..ops.graph import value_inputs
from ..ops.vocab import LARGE_NEGATIVE
from ..records import OpRecord, Recording, Ref, Statement

SOFTMAXES = {"softmax", "_softmax", "softmax_", "log_softmax"}
FUSED_ATTENTION = {"scaled_dot_product_attention", "multi_head_attention_forward"}


@dataclass(frozen=True)
class Finding:
    """A judgement of the whole: a diagnosis kind, the line it belongs to, the words."""

    kind: str
    source: Statement | None
    message: str


def _shape(shape: tuple[int, ...]) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"


def x_dependent(rec: Recording, x_names: set[str]) -> list[bool]:
    """For each op: does it consume x, directly or through earlier ops?"""
    from_x = [False] * len(rec.ops)
    for op in rec.ops:
        for ref in value_inputs(op):
            if (ref.kind == "input" and ref.name in x_names) or (
                    ref.kind == "op" and ref.op is not None and from_x[ref.op]):
                from_x[op.index] = True
    return from_x


def _exp_normalised(rec: Recording, op: OpRecord, from_x: list[bool]) -> bool:
    """A softmax written by hand: a division whose numerator is exp(...)."""
    if op.name not in ("div", "true_divide") or not op.inputs:
        return False
    first = op.inputs[0]
    return first.kind == "op" and first.op is not None and rec.ops[first.op].name == "exp" \
        and from_x[first.op]


def no_attention(rec: Recording, x_names: set[str], parameters: tuple[tuple[str, tuple[int, ...]], ...]
                 ) -> Finding | None:
    """"no attention found", and why, or None when the forward attends."""
    if rec.error is not None:
        return None
    from_x = x_dependent(rec, x_names)
    attends = any(from_x[op.index] and (op.name in SOFTMAXES or op.name in FUSED_ATTENTION
                                        or _exp_normalised(rec, op, from_x)) for op in rec.ops)
    last = rec.ops[rec.output.op] if rec.output is not None and rec.output.kind == "op" \
        and rec.output.op is not None else None
    where = last.source if last is not None else None
    if rec.output is not None and rec.output.kind == "input":
        return Finding("no_attention", where, "no attention found: the forward returns its input "
                                              "x unchanged")
    if not attends:
        linear = _keys_times_values(rec, x_names, from_x)
        if linear is not None:
            return Finding("linear_attention", linear.source,
                           "linear attention, not softmax attention: no softmax and no (T, T) "
                           "score matrix; the keys and values are summed over the tokens first "
                           f"(φ(K)^T V, line {linear.source.line if linear.source else '?'}) and "
                           "each query reads that sum, out = φ(Q) (φ(K)^T V) / (φ(Q) Σ φ(K))")
        used = sorted({api_name(op) for op in rec.ops if from_x[op.index]})
        did = f" (it computes only: {', '.join(used)})" if used else ""
        return Finding("no_attention", where,
                       "no attention found: no softmax turns token-to-token scores into weights"
                       f"{did}")
    if not parameters:
        return Finding("no_attention", where,
                       "no attention found: the module has no parameters, so there is no W_Q, "
                       "W_K, W_V to find: it attends with x itself, not multi-head attention")
    return None


def _keys_times_values(rec: Recording, x_names: set[str], from_x: list[bool]) -> OpRecord | None:
    """A product of two tensors made from x that sums over the token axis (einsum
    "nshd,nshm->nhmd", or K^T @ V): linear attention's φ(K)^T V, which no softmax follows."""
    x = next((snap for name, snap in rec.inputs if name in x_names), None)
    if x is None or len(x.shape) < 2:
        return None
    T = x.shape[-2]
    for op in rec.ops:
        operands = [r for r in value_inputs(op) if r.kind == "op" and r.op is not None
                    and from_x[r.op]]
        if not from_x[op.index] or len(operands) < 2 or T < 2:
            continue
        if op.name == "einsum":
            equation = next((a for a in op.args if isinstance(a, str)), "").replace(" ", "")
            if "->" not in equation or "." in equation:
                continue
            ins, out = equation.split("->")
            terms = ins.split(",")
            if len(terms) != 2:
                continue
            a, b = (rec.snapshot(r).shape for r in operands[:2])
            summed = [c for c in terms[0] if c in terms[1] and c not in out]
            if len(terms[0]) == len(a) and len(terms[1]) == len(b) and any(
                    a[terms[0].index(c)] == T and b[terms[1].index(c)] == T for c in summed):
                return op
        elif op.name in ("matmul", "bmm"):
            a, b = (rec.snapshot(r).shape for r in operands[:2])
            if len(a) >= 2 and len(b) >= 2 and a[-1] == T and b[-2] == T and \
                    tuple(op.outputs[0].shape[-2:]) != (T, T):
                return op
    return None


def output_shape(rec: Recording, x_names: set[str]) -> Finding | None:
    """The output's shape against x's: (B, T, C) in, (B, T, C) out."""
    if rec.output is None:
        return None
    x = next((snap for name, snap in rec.inputs if name in x_names), None)
    out = rec.snapshot(rec.output)
    if x is None or tuple(out.shape) == tuple(x.shape):
        return None
    last = rec.ops[rec.output.op] if rec.output.kind == "op" and rec.output.op is not None else None
    dims = "(B, T, C)" if len(x.shape) == 3 else "(T, C)"
    return Finding("output_shape", last.source if last is not None else None,
                   f"the output has shape {_shape(tuple(out.shape))}; multi-head attention "
                   f"returns x's shape {dims} = {_shape(tuple(x.shape))}")


def _has_nan(values: np.ndarray) -> bool:
    return values.dtype.kind in "fc" and bool(np.isnan(values).any())


def _snap_values(rec: Recording, ref: Ref) -> np.ndarray:
    return np.asarray(rec.snapshot(ref).values)


def _fully_blocked_rows(values: np.ndarray, heads: int | None = None
                        ) -> list[tuple[int, int, int]]:
    """(batch row, head, row) of every row of a (..., T, T) score tensor whose entries are all
    blocked. Its leading axes are (B, h), (h,), or, given `heads`, the batch and the heads
    folded into one axis of B * h (SAM's, timm's), batch row major."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim < 2:
        return []
    with np.errstate(invalid="ignore"):
        blocked = np.isneginf(v) | (v <= LARGE_NEGATIVE)
    rows = blocked.all(axis=-1)
    lead = rows.shape[:-1]
    if len(lead) >= 2:
        per_head = int(lead[-1])
    elif lead and heads and lead[0] % heads == 0:
        per_head = heads
    else:
        per_head = int(lead[0]) if lead else 1
    flat = rows.reshape(-1, rows.shape[-1])
    return [(i // per_head, i % per_head, int(r)) for i in range(flat.shape[0])
            for r in np.flatnonzero(flat[i])]


def _blocking_op(rec: Recording, ref: Ref) -> OpRecord | None:
    """Walking back from a softmax's input: the op that blocked (masked) its entries."""
    for _ in range(32):
        if ref.kind != "op" or ref.op is None:
            return None
        op = rec.ops[ref.op]
        if op.name.rstrip("_") in ("masked_fill", "where", "add", "sub", "baddbmm"):
            values = np.asarray(op.outputs[ref.output].values, dtype=np.float64)
            inputs = [np.asarray(rec.snapshot(r).values, dtype=np.float64) for r in op.inputs
                      if r.kind == "op"]
            with np.errstate(invalid="ignore"):
                now = int((values <= LARGE_NEGATIVE).sum())
                before = max((int((i <= LARGE_NEGATIVE).sum()) for i in inputs
                              if i.shape == values.shape), default=0)
            if now > before:
                return op
        if not op.inputs:
            return None
        ref = next((r for r in op.inputs if r.kind == "op"), op.inputs[0])
    return None


def nan_origin(rec: Recording, x_names: set[str], heads: int | None = None
               ) -> tuple[Finding, OpRecord] | None:
    """Where NaN first appears in the forward (an op whose output has NaN and whose inputs
    had none) and why, in words; (finding, the op that made the NaN) or None. `heads` tells
    a (B * h, T, T) tensor of heads folded into the batch from one of h heads."""
    from_x = x_dependent(rec, x_names)
    for op in rec.ops:
        if not from_x[op.index] or not any(_has_nan(np.asarray(o.values)) for o in op.outputs):
            continue
        if any(_has_nan(_snap_values(rec, r)) for r in op.inputs):
            return None  # NaN came in from outside the forward's ops
        if op.name in SOFTMAXES or op.name == "scaled_dot_product_attention":
            source = op.inputs[0] if op.inputs else None
            rows = _fully_blocked_rows(_snap_values(rec, source), heads) \
                if source is not None and op.name in SOFTMAXES else []
            if op.name == "scaled_dot_product_attention":
                return Finding("nan", op.source, "NaN first appears in "
                               "F.scaled_dot_product_attention's output: a row its mask blocks "
                               "entirely has no key to attend to (softmax of all -inf is NaN)"), op
            if rows:
                batch, head, row = rows[0]
                batches = {b for b, _, _ in rows}
                of = f" in batch row {batch}" if batches != {0} else ""
                alike = {h for b, h, r in rows if (b, r) == (batch, row)}
                more = f"; the same row in all {len(alike)} heads" if len(alike) > 1 else ""
                others = sorted({r for b, _, r in rows if b == batch} - {row})
                if others:
                    more += f"; rows {', '.join(map(str, others))} too"
                if len(batches) > 1:
                    more += (f"; in batch rows {', '.join(map(str, sorted(batches - {batch})))} "
                             "as well")
                blocker = _blocking_op(rec, source) if source is not None else None
                words = (f"row {row} of head {head}{of} is fully masked: softmax of all -inf "
                         f"is NaN{more}; token {row}{of} may look at no token, not even itself")
                return Finding("nan", blocker.source if blocker is not None else op.source,
                               words), op
        return Finding("nan", op.source, f"NaN first appears in the output of "
                                         f"{op.qualname or op.name} at line {op.source.line}"), op
    return None
