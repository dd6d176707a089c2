"""The sizes a forward showed (B, T, C, h, d_h) and which head each op belongs to, read from
the recorded ops: a module of per-head submodules, a per-head loop, or one fused module.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..records import ModuleCall, Recording, Ref, Snapshot
from .graph import Graph
from .vocab import MATMULS, PROJECTIONS


@dataclass(frozen=True)
class Sizes:
    """B, T, C of x and the head split the ops showed (h, d_h); T_k, the keys' length, when
    the keys and values come from another sequence (cross-attention: T is then T_q)."""

    B: int
    T: int
    C: int
    h: int
    d_h: int
    # False when x has no batch axis (NumPy's (T, C)): every dims label drops its B.
    batched: bool = True
    # The context's length (cross-attention), None when the keys are x's own tokens.
    T_k: int | None = None
    # The position of the first of the T tokens: a decode step's new token comes after the
    # `start` tokens held in the KV cache (0 outside decoding).
    start: int = 0

    @property
    def T_q(self) -> int:
        """The queries' length: x's tokens (`T`)."""
        return self.T

    @property
    def cross(self) -> bool:
        return self.T_k is not None

    @property
    def keys(self) -> int:
        """How many keys each query looks at: T_k, or T in self-attention."""
        return self.T if self.T_k is None else self.T_k


def head_calls(rec: Recording) -> list[ModuleCall]:
    """Non-library submodules `<list>.<i>` of one class that each compute attention."""
    groups: dict[tuple[str, str], list[ModuleCall]] = {}
    for call in rec.calls:
        match = re.fullmatch(r"(.+)\.(\d+)", call.path)
        if match and not call.library:
            groups.setdefault((match.group(1), call.class_name), []).append(call)
    for calls in groups.values():
        has_scores = all(
            sum(1 for op in rec.ops[c.first:c.end] if op.name in MATMULS) >= 2 for c in calls)
        if has_scores and len(calls) >= 1:
            return sorted(calls, key=lambda c: int(c.path.rsplit(".", 1)[1]))
    return []


def infer_sizes(rec: Recording, x: Snapshot, hint_heads: int, head_calls: list[ModuleCall]) -> Sizes:
    """B, T, C from x, h and d_h from the ops; no batch axis when x is (T, C)."""
    return replace(_infer_sizes(rec, x, hint_heads, head_calls), batched=x.ndim >= 3)


def _infer_sizes(rec: Recording, x: Snapshot, hint_heads: int, head_calls: list[ModuleCall]) -> Sizes:
    B, T, C = x.shape[:3] if x.ndim >= 3 else (1, x.shape[0], x.shape[-1])
    if head_calls:
        h = len(head_calls)
        widths = [op.out.shape[-1] for op in rec.ops[head_calls[0].first:head_calls[0].end]
                  if op.name in PROJECTIONS]
        return Sizes(B, T, C, h, widths[0] if widths else max(1, C // h))
    for op in rec.ops:
        if op.name in {"view", "reshape", "unflatten"} and op.inputs:
            before, after = rec.snapshot(op.inputs[0]).shape, op.out.shape
            if (len(after) == len(before) + 1 and before and before[-1] in (C, 3 * C)
                    and len(after) >= 2 and after[-2] * after[-1] == C and before[-1] == C):
                return Sizes(B, T, C, after[-2], after[-1])
            if (op.name == "view" and len(after) == 3 and len(before) == 3
                    and before[-1] == C and after[0] == T and after[-1] * after[1] == C * B):
                return Sizes(B, T, C, after[1] // B, after[-1])  # (T, B*h, d_h): torch's MHA
    for op in rec.ops:
        if op.name == "scaled_dot_product_attention" and op.inputs and rec.snapshot(op.inputs[0]).ndim == 4:
            q = rec.snapshot(op.inputs[0]).shape
            return Sizes(B, T, C, q[1], q[3])
    h = hint_heads if hint_heads and C % hint_heads == 0 else 1
    return Sizes(B, T, C, h, C // h)


def assign_heads(g: Graph, head_calls: list[ModuleCall]) -> None:
    for h, call in enumerate(head_calls):
        for i in range(call.first, call.end):
            g.head[i] = h


def assign_loop_heads(g: Graph, sizes: Sizes) -> None:
    """A per-head loop (`Q[h]`, `K[h]`, `V[h]` taken from the (h, T, d_h) heads one index at
    a time): each op that follows from head i's slices belongs to head i, up to the op that
    joins the heads again (np.stack, torch.cat)."""
    if g.head or sizes.h < 2:
        return
    lead = () if not sizes.batched else (sizes.B,)
    heads_shape = (*lead, sizes.h, sizes.T, sizes.d_h)
    own = _own_head_weights(g, sizes.h)
    for op in g.ops:
        if not g.from_x[op.index]:
            continue
        if op.index in own:
            g.head[op.index] = own[op.index]
            continue
        if op.name == "getitem" and op.inputs and g.snap(op.inputs[0]).shape == heads_shape:
            index = op.args[1] if len(op.args) > 1 else None
            if isinstance(index, tuple) and len(index) == len(lead) + 1 and \
                    all(part == ("slice", None, None, None) for part in index[:-1]):
                index = index[-1]
            if isinstance(index, int) and not isinstance(index, bool) and -sizes.h <= index < sizes.h:
                g.head[op.index] = index % sizes.h
                continue
        split = {ref.output for ref in g.x_inputs(op) if _split_into_heads(g, ref, sizes)}
        if len(split) == 1:  # picoGPT: np.split(q, n_head, axis=-1), one head per part
            g.head[op.index] = split.pop()
            continue
        heads = {g.head.get(ref.op) for ref in g.x_inputs(op) if ref.kind == "op"}
        if len(heads) == 1 and None not in heads:
            g.head[op.index] = heads.pop()  # type: ignore[assignment]


def _split_into_heads(g: Graph, ref: Ref, sizes: Sizes) -> bool:
    """ref is one of the h parts, d_h channels each, of a split along the last axis
    (`np.split(q, n_head, axis=-1)`): part i is head i."""
    op = g.producer(ref)
    return op is not None and op.name in ("split", "array_split", "chunk", "tensor_split") and \
        len(op.outputs) == sizes.h and all(o.shape[-1:] == (sizes.d_h,) for o in op.outputs)


def _own_head_weights(g: Graph, h: int) -> dict[int, int]:
    """Ops that use head i's own weight (`W_q[i]`, `heads.i.W_q`: a list of h per-head
    arrays, as plain NumPy code keeps them): op index -> i."""
    found: dict[int, int] = {}
    for op in g.ops:
        for ref in g.other_inputs(op):
            match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", ref.name) if ref.kind == "param" else None
            if match and g.snap(ref).ndim == 2:
                found[op.index] = int(match.group(1))
    return found if sorted(set(found.values())) == list(range(h)) else {}

