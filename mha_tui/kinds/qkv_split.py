"""qkv_split: one fused projection cut into q, k and v *and* into heads by shape ops (timm's
`reshape(B, N, 3, h, d_h).permute(2, 0, 3, 1, 4).unbind(0)`, GPT-NeoX's `view(B, T, h, 3 d_h)`
and slices, BLOOM's `view(B, T, h, 3, d_h)[..., 0, :]`, Falcon's `view(B, T, h + 2, d_h)`).

A split that only cuts the fused output's last axis into Q | K | V of C channels each
(GPT-2's `split(C, dim=2)`, MPT's `chunk(3)`) stays part of the projection (project.py):
there the heads are cut later, by the view stage. Here the heads come out of the split
itself, and *where* each head's channels sit in the fused output (grouped by role, or
interleaved per head) is what the stage shows: computed from the values, never from names.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import PROJECTIONS, SHAPE_OPS, SPLITS
from ..records import Check, OpRecord, Snapshot, Stage, TensorRecord, Trace
from ._parts.builder import BTC
from ._parts.cell import Cell, Term, Why, WhyError, reindex, where
from ._parts.maker import StageMaker
from ._parts.quizzing import Question
from ._parts.unit import Unit

KIND = "qkv_split"
_PARTS = SPLITS | {"getitem"}  # ops that take one part (q, k or v) out of the fused tensor


def fused_width(width: int, sizes: Sizes) -> bool:
    """A projection's output width holds q, k and v at once: 3C, or C for the h query heads
    plus two narrower blocks of h_kv heads each for K and V (Falcon's multi-query layer)."""
    if width == 3 * sizes.C:
        return True
    return sizes.C < width < 3 * sizes.C and sizes.d_h > 0 and (width - sizes.C) % (2 * sizes.d_h) == 0


def _region(g: Graph, root: int) -> list[int]:
    """The shape ops from a fused projection's output up to and including the ops that take
    its parts out: their later shape ops (k.transpose for the scores ...) are not the split."""
    found, todo = [], [root]
    while todo:
        i = todo.pop(0)
        for c in g.consumers[i]:
            op = g.ops[c]
            if c in found or op.name not in SHAPE_OPS or not g.from_x[c]:
                continue
            found.append(c)
            if op.name not in _PARTS:
                todo.append(c)
    return sorted(found)


def _makes_heads(g: Graph, root: int, sizes: Sizes) -> bool:
    """Some tensor between the fused output and its parts has d_h channels on its last axis:
    the split cuts heads as well (a whole-width Q | K | V split never does)."""
    if sizes.h < 2 or sizes.d_h == sizes.C:
        return False
    return any(g.ops[i].out.shape[-1] == sizes.d_h for i in _region(g, root))


def _fused_root(g: Graph, op: OpRecord) -> int | None:
    """The fused projection op whose (reshaped) output op reads, if any."""
    ref = g.x_inputs(op)[0]
    for _ in range(8):
        source = g.producer(ref)
        if source is None or source.index not in g.fused:
            return None
        if source.name in PROJECTIONS:
            return source.index
        if not g.x_inputs(source):
            return None
        ref = g.x_inputs(source)[0]
    return None


def fused_split_into_heads(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """A shape op on a fused q|k|v projection whose split also cuts the heads."""
    if op.name not in SHAPE_OPS or not g.x_inputs(op):
        return None
    root = _fused_root(g, op)
    if root is None or not _makes_heads(g, root, sizes):
        return None
    if op.name not in _PARTS:
        g.fused.add(op.index)  # still the whole fused tensor, reshaped
    return KIND


RULES = (fused_split_into_heads,)


# ---------------------------------------------------------------------- the stage


def _as_heads(values: np.ndarray, T: int, d_h: int) -> np.ndarray | None:
    """A part laid out as (B, T, n, d_h), whatever order its axes came in: (B, h, T, d_h),
    (B, T, h, d_h), (B * h, T, d_h)."""
    if values.ndim == 4 and values.shape[-1] == d_h:
        if values.shape[2] == T:
            return np.swapaxes(values, 1, 2)
        if values.shape[1] == T:
            return values
    return None


def _head_dims(shape: tuple[int, ...], T: int, d_h: int, h_kv: int | None = None
               ) -> tuple[str, ...]:
    """A part's axes named, whatever its head count: h, or h_kv for K and V when the module
    shares K/V heads (Falcon's K has 1 head, not h)."""
    if len(shape) == 4 and shape[-1] == d_h:
        heads = "h_kv" if h_kv else "h"
        if shape[2] == T and (h_kv is None or shape[1] == h_kv):
            return ("B", heads, "T", "d_h")
        if shape[1] == T and (h_kv is None or shape[2] == h_kv):
            return ("B", "T", heads, "d_h")
    return tuple(f"d{i}" for i in range(len(shape)))


def _blocks(fused: np.ndarray, part: np.ndarray, d_h: int) -> list[int | None]:
    """For each head of the part, the d_h-channel block of the fused (B, T, W) output it is
    an exact copy of (None when no block is)."""
    n_blocks = fused.shape[-1] // d_h
    blocks = [fused[..., b * d_h:(b + 1) * d_h] for b in range(n_blocks)]
    found: list[int | None] = []
    for head in range(part.shape[2]):
        values = part[:, :, head]
        found.append(next((b for b, block in enumerate(blocks)
                           if block.shape == values.shape and np.array_equal(block, values)), None))
    return found


def layout_text(roles: list[tuple[str, list[int | None]]], n_blocks: int) -> str:
    """The fused output's channel blocks in order, each named by the head it becomes:
    `[q0 q1 | k0 k1 | v0 v1]` or `[q0 k0 v0 | q1 k1 v1]`."""
    names = ["?"] * n_blocks
    for role, blocks in roles:
        for head, block in enumerate(blocks):
            if block is not None:
                names[block] = f"{role.lower()}{head}"
    # a bar wherever the next block starts a new role (grouped) or a new head (interleaved)
    grouped = all(names[i][0] == names[i + 1][0] or names[i + 1][1:] == "0"
                  for i in range(n_blocks - 1)) if "?" not in names else False
    text, previous = [], None
    for name in names:
        key = name[0] if grouped else name[1:]
        if previous is not None and key != previous:
            text.append("|")
        text.append(name)
        previous = key
    return "[" + " ".join(text) + "]"


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    s = m.s
    ops = [m.op(i) for i in unit.ops]
    first = ops[0]
    fused_ref = m.x_in(first)
    fused = m.snap(fused_ref)
    parts: list[tuple[OpRecord, int, Snapshot]] = []
    for op in ops:
        if op.name in _PARTS:
            for n, out in enumerate(op.outputs):
                parts.append((op, n, out))
    # each part's end: the last op of this unit that reshapes it further (BLOOM's transpose
    # stays with the head move; a view back to (B, T, n, d_h) stays here)
    flat = fused.values.reshape(fused.shape[0], fused.shape[1], -1) if fused.values.ndim >= 3 \
        else fused.values
    width = flat.shape[-1]
    tensors: list[TensorRecord] = []
    roles: list[tuple[str, list[int | None]]] = []
    names = []
    all_found = True
    for index, (op, n, out) in enumerate(parts[:3]):
        role = "QKV"[index] if len(parts) == 3 else m.b.role(op)
        name = m.tensor_name(op, n, fallback="qkv"[index] if index < 3 else f"part{index}")
        names.append(name)
        heads = _as_heads(out.values, s.T, s.d_h)
        blocks = _blocks(flat, heads, s.d_h) if heads is not None and flat.ndim == 3 else []
        all_found &= bool(blocks) and None not in blocks
        roles.append((role, blocks))
        n_heads = heads.shape[2] if heads is not None else 0
        shared = m.b.h_kv if role in ("K", "V") else None
        dims = _head_dims(out.shape, s.T, s.d_h, shared)
        if dims[0] == "d0" and shared:
            dims = _head_dims(out.shape, s.T, s.d_h)
        tensors.append(m.b.record(name, out, dims,
                                  share=("the fused projection", fused),
                                  caption=f"{role}: {n_heads} head{'s' if n_heads != 1 else ''} "
                                          f"of d_h = {s.d_h}" + (
                                              f", from channel blocks {_span(blocks)} of the fused "
                                              "output" if blocks and None not in blocks else "")))
    n_blocks = width // s.d_h if s.d_h else 0
    layout = layout_text(roles, n_blocks) if all_found else ""
    projected = m.made.get("project")  # the name the projection stage gave this tensor
    fused_name = next((t.name for t in reversed(projected.tensors) if t.values.shape == fused.shape),
                      "qkv") if projected is not None else "qkv"
    tensors.insert(0, m.b.record(f"{fused_name} (fused)", fused, (m.b.fused(width) or ("B", "T", "qkv"))
                                 if fused.values.ndim == 3 else m.dims(fused.shape, BTC),
                                 caption=f"q, k and v side by side: {width} channels = {n_blocks} "
                                         f"blocks of d_h = {s.d_h}"
                                         + (f", in this order: {layout}" if layout else "")))
    checks = []
    if layout or any(blocks for _, blocks in roles):  # one claim, its words as it came out
        checks.append(Check(f"each head of {', '.join(names)} is an exact copy of one block of "
                            f"{s.d_h} channels of the fused output: {layout} (found by mha-tui "
                            f"comparing the values)" if layout else
                            "some head of q, k or v is not an exact copy of a block of the "
                            "fused output's channels (compared by mha-tui)", bool(layout)))
    shares = all(out.storage == fused.storage for _, _, out in parts)
    checks.append(Check(f"the parts share memory with the fused output: "
                        f"{'yes, nothing copied' if shares else 'no'}", None))
    grouped = layout and "|" in layout and layout.count("|") == len(roles) - 1
    heads_q = len(roles[0][1]) if roles else s.h
    heads_kv = len(roles[1][1]) if len(roles) > 1 else heads_q
    how = ("grouped by role: all the query heads' channels first, then the keys', then the "
           "values'" if grouped else
           "interleaved per head: each head's query, key and value channels next to each other")
    shared = (f" Only {heads_kv} key/value head{'s' if heads_kv != 1 else ''} for {heads_q} query "
              f"heads: the fused layer is ({width}, {s.C}), not (3C, C)."
              if heads_kv != heads_q else "")
    explanation = (
        f"One fused layer made q, k and v at once ({width} channels per token). Here the split "
        f"cuts them apart and into heads in one go: the fused channels are reshaped so that "
        f"blocks of d_h = {s.d_h} line up as heads, then each of q, k and v is taken out, already "
        f"with its own head axis (no separate view step follows). This module lays the blocks "
        f"out {how}{': ' + layout if layout else ''}. The weight's rows are in the same order, "
        f"so the layout is a property of the checkpoint, not only of this code.{shared}")
    last = parts[-1][2] if parts else ops[-1].out
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=fused.shape,
                   shape_out=last.shape, dims_in=m.dims(fused.shape, BTC),
                   dims_out=tensors[-1].dims,
                   title="Split the fused projection into q, k, v and heads" + (
                       f": {heads_kv} K/V head{'s' if heads_kv != 1 else ''} for {heads_q} "
                       f"query heads" if heads_kv != heads_q else ""),
                   explanation=explanation)


def _span(blocks: list[int | None]) -> str:
    values = [b for b in blocks if b is not None]
    if len(values) > 1 and values == list(range(values[0], values[0] + len(values))):
        return f"{values[0]}..{values[-1]}"
    return ", ".join(map(str, values))


# ---------------------------------------------------------------------- why this number


_HEAD_AXES = ("B", "T", "h", "d_h")


def _axes(record: TensorRecord) -> tuple[str, ...]:
    """The part's dims with K's and V's h_kv heads read as its heads."""
    return tuple("h" if d == "h_kv" else d for d in record.dims)


def _heads_of(record: TensorRecord) -> np.ndarray | None:
    """A part as (B, T, n, d_h), read from its named axes (None when they are not those)."""
    if sorted(_axes(record)) != sorted(_HEAD_AXES):
        return None
    return np.transpose(record.values, [_axes(record).index(a) for a in _HEAD_AXES])


def _role(stage: Stage, record: TensorRecord) -> str:
    """Q, K or V: the part's place among three, else the role its caption names."""
    parts = stage.tensors[1:]
    k = next((k for k, t in enumerate(parts) if t is record), None)
    if len(parts) == 3 and k is not None:
        return "QKV"[k]
    return record.caption.split(":")[0] or record.name


def why(cell: Cell) -> Why:
    """A cell of q, k or v after the fused split: the channel of the fused projection's
    output it was read from (its block of d_h channels found by comparing the values, never
    from names), the number read unchanged."""
    stage = cell.stage
    fused = stage.tensors[0]
    heads = _heads_of(cell.record)
    if heads is None or fused.values.ndim < 3 or len(stage.tensors) < 2:
        raise WhyError(f"cannot read {cell.name} as (B, T, heads, d_h) against the fused output")
    b, t, head, d = (cell.index[_axes(cell.record).index(a)] for a in _HEAD_AXES)
    d_h = heads.shape[-1]
    flat = fused.values.reshape(fused.values.shape[0], fused.values.shape[1], -1)
    block = _blocks(flat, heads, d_h)[head]
    role = _role(stage, cell.record)
    if block is None:
        raise WhyError(f"head {head} of {cell.record.name} is not an exact copy of any block of "
                       f"{d_h} channels of the fused output: mha-tui cannot tell where it was read")
    channel = block * d_h + d
    at = reindex((b, t, channel), flat.shape, fused.values.shape)
    computed = float(fused.values[at])
    spot = ", ".join(map(str, at))
    roles = []
    for part in stage.tensors[1:]:
        values = _heads_of(part)
        roles.append((_role(stage, part), _blocks(flat, values, d_h) if values is not None else []))
    n_blocks = flat.shape[-1] // d_h
    layout = layout_text(roles, n_blocks) if all(blocks and None not in blocks
                                                 for _, blocks in roles) else ""
    name = f"{role.lower()}{head}"
    held = (f" (held as {tuple(fused.values.shape)}: channel {channel} of token {t} is "
            f"[{spot}] there)" if fused.values.ndim != 3 else "")
    return Why(stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {fused.name}[{spot}]  (channel {channel} = block {block} × d_h "
               f"{d_h} + d{d}; block {block} is {name})",
               (Term(f"{fused.name}[{spot}]: token {cell.token(t)}, channel {channel}", (),
                     computed),),
               (f"the fused projection's {flat.shape[-1]} channels per token are {n_blocks} "
                f"blocks of d_h = {d_h}" + (f", in this order: {layout}" if layout else "")
                + held,
                f"block {block} (channels {block * d_h}..{block * d_h + d_h - 1}) is {role} head "
                f"{head}: found by mha-tui comparing head {head} of {cell.record.name} with "
                "every block, value for value",
                "read unchanged, not computed"),
               computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """Where in the fused output a head of the split's last part (v) starts: its layout,
    found from the values."""
    if len(stage.tensors) < 2 or stage.tensors[0].values.ndim < 3:
        return ()
    fused, last = stage.tensors[0], stage.tensors[-1]
    heads = _heads_of(last)
    if heads is None:
        return ()
    flat = fused.values.reshape(fused.values.shape[0], fused.values.shape[1], -1)
    d_h = heads.shape[-1]
    head = min(1, heads.shape[2] - 1)
    block = _blocks(flat, heads, d_h)[head]
    if block is None:
        return ()
    role = _role(stage, last)
    channel = block * d_h
    return (Question(stage.id, "channel", f"{fused.name} holds q, k and v side by side, "
                     f"{flat.shape[-1]} channels per token. At which of its channels (from 0) "
                     f"does {role} head {head} start?", "integer", channel, str(channel),
                     f"block {block} of d_h = {d_h} channels is {role.lower()}{head} "
                     f"(channel {block} × {d_h} = {channel}): found by comparing the recorded "
                     "values"),)
