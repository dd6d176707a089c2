"""kv_cache: a decode step's KV cache growing by the new token's key or value: the cached rows
joined with the new one (`torch.cat((past_k, k), dim=2)`: GPT-2's `layer_past`, nanoGPT
forks' `past_kv`, Raschka's `cache_k` buffer), or the new row written into a cache allocated
up front (`self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk`, Meta Llama's;
`k_out[:, :, input_pos] = k_val`, gpt-fast's `KVCache`).

Recognised from the ops and where their inputs came from, never from names: a cat or a
slice assignment whose one x-derived operand is a projection's k or v (not yet scored), and
whose other operand is a tensor the forward did not make from x (an argument, a buffer, a
constant: the steps before), never a learned parameter (learned memory keys are not a cache).
A cat onto an empty cache (the first call) stays `aux` (kinds/cache.py): it passes its input
through.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import CONCATS
from ..records import Check, OpRecord, Ref, Stage, TensorArg
from ..stages import title_of
from ._parts.builder import KEYS
from ._parts.cell import Cell, Why
from ._parts.maker import StageMaker
from ._parts.op_cell import explain, locate
from ._parts.unit import Unit
from .op import HEADS_OUT, OUTPUT, QKV, SCORES, WEIGHTS, input_dims, output_dims

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "kv_cache"
_WRITE = {"setitem", "index_copy_", "index_put_", "copy_"}
# Made after the scores: not scale (q or k may be scaled before the product, `k * d_h ** -0.25`),
# nor pos_bias (gpt-fast writes its cache after an op the recogniser calls a position bias).
_SCORED = (SCORES - {"scale", "pos_bias"}) | WEIGHTS | HEADS_OUT | OUTPUT


def _past_and_new(g: Graph, op: OpRecord) -> tuple[list[Ref], Ref] | None:
    """A cat's cached operands and its one new (x-derived) operand, or a slice assignment's
    target and the value written into it; None if the op is neither."""
    if op.name in CONCATS:
        operands = g.tensor_operands(op)
        fresh = [r for r in operands if g.is_x(r)]
        past = [r for r in operands if not g.is_x(r)]
        if len(fresh) != 1 or not past or any(g.snap(r).values.size == 0 for r in past):
            return None
        new = fresh[0]
    elif op.name in _WRITE:
        tensors = [a for a in op.args if isinstance(a, TensorArg)]
        if len(tensors) < 2:
            return None
        target, value = op.inputs[tensors[0].index], op.inputs[tensors[-1].index]
        if g.is_x(target) or not g.is_x(value):
            return None
        past, new = [target], value
    else:
        return None
    if any(_learned(g, r) for r in past):
        return None
    return past, new


def _learned(g: Graph, ref: Ref) -> bool:
    """A learned parameter, or a tensor made from one only (memory keys, a sink column)."""
    if ref.kind == "param":
        return True
    op = g.producer(ref)
    return op is not None and bool(op.inputs) and all(_learned(g, r) for r in op.inputs)


def appends_to_the_cache(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """The cat or slice assignment that puts a new token's k or v beside the cached ones."""
    found = _past_and_new(g, op)
    if found is None or not g.derives(found[1], QKV) or g.op_derives(op, _SCORED):
        return None
    return KIND


RULES = (appends_to_the_cache,)


def _axis(op: OpRecord, past: np.ndarray, new: np.ndarray) -> int | None:
    """The axis the cache grows along: a cat's dim, or the one axis where the written value
    is shorter than the cache."""
    if op.name in CONCATS:
        dim = op.args[1] if len(op.args) > 1 else op.kwarg("dim", op.kwarg("axis", 0))
        return dim % new.ndim if isinstance(dim, int) and new.ndim else None
    if past.ndim != new.ndim:
        return None
    shorter = [a for a in range(new.ndim) if new.shape[a] != past.shape[a]]
    return shorter[0] if len(shorter) == 1 else None


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    tensors, checks, lines, steps = [], [], [], []
    shapes: list[tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...], tuple[str, ...]]] = []
    for i in unit.ops:
        op = m.op(i)
        found = _past_and_new(m.g, op)
        if found is None:  # claimed by the rule: cannot happen
            continue
        past_refs, new_ref = found
        new = m.snap(new_ref)
        made = m.g.producer(new_ref)
        name = (m.tensor_name(made, new_ref.output, fallback=made.name) if made is not None
                else new_ref.name)  # `q, k, v = qkv.unbind(0)`: k is output 1, named k
        past = [m.snap(r) for r in past_refs]
        after = op.out
        axis = _axis(op, past[0].values, new.values)
        dims = input_dims(m, new_ref)
        grown = ((*dims[:axis], KEYS if op.name in CONCATS else "slot", *dims[axis + 1:])
                 if axis is not None and len(dims) == after.ndim and dims[axis] == "T" else
                 output_dims(m, op, after.shape))
        shapes.append((tuple(new.shape), dims, tuple(after.shape), grown))
        tensors.append(m.b.record(f"{name} new", new, dims,
                                  caption="the new token's, made in this step"))
        tensors.append(m.b.record(f"{name} cached", after, grown,
                                  caption="the cache after this step"))
        rows = new.values.shape[axis] if axis is not None else 0
        which = f"the new token's {name}" if rows == 1 else f"{rows} new rows of {name}"
        if op.name in CONCATS:
            operands = [m.snap(r).values for r in m.g.tensor_operands(op)]
            same = axis is not None and np.array_equal(
                np.concatenate(operands, axis=axis), after.values)
            kept = past[0].values.shape[axis] if axis is not None else 0
            checks.append(Check(f"recomputed by mha-tui: the {kept} cached rows of {name} then "
                                f"{which}, joined along axis {axis}, equal the module's cache",
                                bool(same)))
            lines.append(f"{name}: {kept} cached rows and {which}, joined along axis {axis}: "
                         f"{tuple(after.shape)}")
        else:
            slots = [] if axis is None else [
                p for p in range(after.values.shape[axis] - rows + 1)
                if np.array_equal(np.take(after.values, range(p, p + rows), axis=axis),
                                  new.values)]
            at = "" if not slots else (f"slot {slots[0]}" if rows == 1 else
                                       f"slots {slots[0]} to {slots[0] + rows - 1}")
            checks.append(Check(f"{which} {'is' if rows == 1 else 'are'} in the cache after "
                                f"this call{f' ({at} of axis {axis})' if at else ''}",
                                bool(slots)))
            lines.append(f"{which}: written into a cache allocated up front, "
                         f"{tuple(after.shape)}{f', at {at} of axis {axis}' if at else ''}")
        steps.append(rows)
    if steps and max(steps) == 1:
        opening = ("Decoding one token at a time, the keys and values of the tokens before are "
                   "not computed again: they were kept in a cache, and this step only adds the "
                   "new token's. ")
        closing = " The new query is then scored against every key in the cache."
    else:
        opening = ("The keys and values of this call go into the module's KV cache, where the "
                   "decode steps after it read them back instead of computing them again. ")
        closing = ""
    explanation = opening + "; ".join(lines) + "." + closing
    shape_in, dims_in, shape_out, dims_out = shapes[0][:2] + shapes[-1][2:]
    return m.stage(unit, stage_id, KIND, tensors[-4:], checks, shape_in=shape_in,
                   shape_out=shape_out, dims_in=dims_in, dims_out=dims_out, title=title_of(KIND),
                   explanation=explanation)


def judge(j: Judge) -> list[Row]:
    """Each cache stage: a cat recomputed from its operands; where the cache goes wrong
    (its axis, its offset, its reset) is what `check --decode` judges step by step."""
    rows = []
    for stage in (s for s in j.trace.stages if s.kind == KIND):
        failed = [c for c in stage.checks if c.ok is False]
        rows.append(j.row(stage, KIND, not failed, None,
                          failed[0].label if failed else
                          "the KV cache holds the cached keys and values and the new ones",
                          source=stage.source))
    return rows


def why(cell: Cell) -> Why:
    """The op that put the cell in the cache, from its recorded inputs."""
    return explain(cell, *locate(cell, cell.stage.ops))
