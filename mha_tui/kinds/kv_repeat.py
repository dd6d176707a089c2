"""kv_repeat: shared key/value heads (grouped-query and multi-query attention). K and V are
projected to h_kv < h heads, then each K/V head is repeated for the n = h / h_kv query heads
that share it (`repeat_kv`: expand and reshape; `repeat_interleave`).

Recognised from the shapes and checked on the values, never from names: a short chain of
shape ops (getitem with None, unsqueeze, expand, reshape, repeat_interleave, repeat) that
takes a tensor with h_kv heads on one axis to one with h heads on that axis, whose head j is
exactly head j // n of its input.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import numpy as np

from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..records import Check, OpRecord, Ref, Stage, Trace
from ._parts.builder import Builder, plural
from ._parts.cell import Cell, Term, Why, WhyError, where
from ._parts.maker import StageMaker, synthetic
from ._parts.quizzing import Question
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row

KIND = "kv_repeat"
_PRODUCTS = {"linear", "matmul", "addmm", "mm", "einsum"}
_REPEATS = {"getitem", "unsqueeze", "expand", "expand_as", "reshape", "view", "flatten",
            "repeat_interleave", "repeat", "contiguous"}


@dataclass(frozen=True)
class Repeat:
    """One K or V tensor whose h_kv heads were repeated to h."""

    before: Ref  # (..., h_kv, ...) on the head axis
    after: Ref  # (..., h, ...)
    axis: int  # the head axis (negative, the same in both)
    h_kv: int
    ops: frozenset[int]
    # "interleave": query head j reads K/V head j // n (repeat_kv, repeat_interleave);
    # "tile": head j reads K/V head j % h_kv (torch's .repeat: the heads cycled), a mistake
    # the stage shows and the check names.
    order: str = "interleave"


_FOUND: WeakKeyDictionary[Graph, dict[int, Repeat]] = WeakKeyDictionary()


def repeat_order(before: np.ndarray, after: np.ndarray, axis: int) -> str | None:
    """How `after`'s heads on `axis` copy `before`'s: "interleave" (head j is head j // n,
    repeat_kv), "tile" (head j is head j % h_kv, torch's .repeat), or None (neither)."""
    n = after.shape[axis] // before.shape[axis]
    if np.array_equal(np.repeat(before, n, axis=axis), after):
        return "interleave"
    if before.shape[axis] > 1 and np.array_equal(np.concatenate([before] * n, axis=axis), after):
        return "tile"
    return None


def _repeat_ending_at(g: Graph, op: OpRecord, sizes: Sizes) -> Repeat | None:
    """op's output has h heads on an axis where a tensor a few shape ops back had h_kv."""
    out = op.out
    if op.name not in _REPEATS or not g.x_inputs(op) or sizes.h < 2:
        return None
    chain: list[int] = [op.index]
    ref = g.x_inputs(op)[0]
    for _ in range(4):
        before = g.snap(ref)
        if before.ndim == out.ndim:
            for axis in range(-out.ndim, 0):
                h_kv = before.shape[axis]
                if out.shape[axis] != sizes.h or not 0 < h_kv < sizes.h or sizes.h % h_kv:
                    continue
                rest = [n for a, n in enumerate(out.shape) if a != out.ndim + axis]
                if rest != [n for a, n in enumerate(before.shape) if a != before.ndim + axis]:
                    continue
                order = repeat_order(before.values, out.values, axis)
                if order is not None:
                    return Repeat(before=ref, after=Ref("op", op=op.index), axis=axis, h_kv=h_kv,
                                  ops=frozenset(chain), order=order)
        producer = g.producer(ref)
        if producer is None or producer.name not in _REPEATS or not g.x_inputs(producer):
            return None
        chain.append(producer.index)
        ref = g.x_inputs(producer)[0]
    return None


def repeats(g: Graph, sizes: Sizes) -> dict[int, Repeat]:
    """Every repeat found so far, by the index of its last op."""
    found = _FOUND.setdefault(g, {})
    return found


def repeats_shared_heads(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """A chain of shape ops that repeats each of h_kv K/V heads for h / h_kv query heads.

    The rules see ops in order, so the chain is found at its last op; the earlier ops of
    the chain (already given `aux` by then) are claimed when the stage is grouped: the rule
    marks them here."""
    if op.name not in _REPEATS or not g.x_inputs(op) or g.op_derives(op, {"scores", "attend"}):
        return None
    if not g.op_derives(op, {"project"}):
        return None
    found = repeats(g, sizes)
    if any(op.index in rep.ops for rep in found.values()):
        return KIND
    rep = _repeat_ending_at(g, op, sizes)
    if rep is None:
        return None
    # With one K/V head, a step inside the chain already repeats (repeat_kv's 5-d expand of
    # (B, 1, 1, T, d_h) to (B, 1, n, T, d_h)): the chain that ends here holds it and is the
    # repeat of the heads themselves; the step is only part of it.
    for end in [end for end, earlier in found.items() if earlier.ops < rep.ops]:
        del found[end]
    found[op.index] = rep
    for i in rep.ops:  # the chain's earlier ops join the stage
        if g.kind.get(i) in (None, "aux"):
            g.kind[i] = KIND
    return KIND


RULES = (repeats_shared_heads,)


def kv_heads(b: Builder) -> int | None:
    """How many K/V heads the module makes when fewer than h, read from the recognised ops:
    a repeat of the K/V heads (repeat_kv), else the K or V projection's width h_kv * d_h
    (found by where its output goes), else a fused projection's (h + 2 h_kv) * d_h (Falcon's
    multi-query layer, whose one K/V head the matmuls broadcast). None when K and V have the
    h heads Q has, or the heads are computed one at a time."""
    g, s = b.g, b.sizes
    found = repeats(g, s)
    if found:
        return next(iter(found.values())).h_kv
    if b.per_head or s.h < 2 or not s.d_h:
        return None
    for op in g.ops:
        if g.kind.get(op.index) != "project" or op.name not in _PRODUCTS or not op.out.shape:
            continue
        width = op.out.shape[-1]
        if op.index in g.fused:
            n = (width - s.C) // (2 * s.d_h)
            if width != 3 * s.C and (width - s.C) == 2 * n * s.d_h and 0 < n < s.h and not s.h % n:
                return n
        elif width < s.C and not width % s.d_h and not s.h % (width // s.d_h) and \
                b.role(op) in ("K", "V"):
            return width // s.d_h
    return None


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    s = m.s
    found = [rep for rep in repeats(m.g, s).values() if rep.ops & set(unit.ops)]
    by_role = []
    for rep in found:
        role = m.b.role(m.op(rep.after.op))  # type: ignore[arg-type]
        by_role.append(("KV".index(role) if role in "KV" else 2, role, rep))
    by_role.sort(key=lambda item: item[0])
    h_kv = found[0].h_kv
    n = s.h // h_kv
    tensors = []
    checks = []
    for _, role, rep in by_role:
        before, after = m.snap(rep.before), m.snap(rep.after)
        dims_before = _head_dims(before.shape, rep.axis, "h_kv")
        dims_after = _head_dims(after.shape, rep.axis)
        kv_name = f"{role} ({plural(rep.h_kv, 'head')})"
        tensors.append(m.b.record(kv_name, before, dims_before,
                                  caption=f"the {plural(rep.h_kv, 'K/V head')} the {role} "
                                          f"projection made, on its h_kv axis"))
        tensors.append(m.b.record(f"{role} ({plural(s.h, 'head')})", after, dims_after,
                                  caption=f"head j is K/V head j // {n}: each repeated {n} times"
                                  if rep.order == "interleave" else
                                  f"head j is K/V head j % {rep.h_kv}: the {rep.h_kv} heads "
                                  f"cycled {n} times (torch's .repeat), not each repeated in "
                                  f"place",
                                  share=(kv_name, before)))
        same = np.array_equal(np.repeat(before.values, s.h // rep.h_kv, axis=rep.axis),
                              after.values)
        checks.append(Check(f"{role}: query head j reads K/V head j // {n}, an exact copy "
                            f"(computed by mha-tui: np.repeat along the head axis)", same))
        shares = "share" if after.storage == before.storage else "do not share"
        checks.append(Check(f"{role}: the copies {shares} memory with the "
                            f"{plural(rep.h_kv, 'K/V head')}", None))
    groups = np.arange(s.h) // n
    tensors.insert(0, m.b.record("K/V head of query head", synthetic(groups.astype(np.int64)),
                                 ("h",), kind="int",
                                 caption=f"query head j uses K/V head j // {n} (computed by "
                                         f"mha-tui from the shapes)" + "".join(
                                             f"; but this module's {role} gives it K/V head "
                                             f"j % {rep.h_kv} (.repeat cycles the heads)"
                                             for _, role, rep in by_role if rep.order == "tile")))
    widths = _projection_widths(m)
    if widths:
        checks.append(Check(
            "projection widths: " + ", ".join(f"{role} {w} = {plural(w // s.d_h, 'head')} x d_h {s.d_h}"
                                              for role, w in widths.items())
            + " (from the recorded outputs)", None))
    sharing = ", ".join(f"query heads {j * n}..{j * n + n - 1} -> K/V head {j}" for j in range(h_kv))
    if h_kv == 1:
        title = f"Multi-query: one K/V head shared by all {s.h} query heads"
        kind_words = "multi-query attention (MQA, h_kv = 1)"
    else:
        title = f"Shared K/V heads: {h_kv} K/V heads for {s.h} query heads"
        kind_words = f"grouped-query attention (GQA, h_kv = {h_kv})"
    explanation = (
        f"This module uses {kind_words}: the query projection makes h = {s.h} heads, but the "
        f"key and value projections make only h_kv = {h_kv} head{'s' if h_kv > 1 else ''} of "
        f"d_h = {s.d_h} channels, (h_kv * d_h, C) = ({h_kv * s.d_h}, {s.C}) weights instead of "
        f"({s.C}, {s.C}). Here each K/V head is repeated {n} times so that every query head has "
        f"a key and a value to attend with: {sharing}. Query heads that share a K/V head compare "
        f"against the same keys and mix the same values; only their queries differ. Fewer "
        f"K/V heads means fewer keys and values to store while generating.")
    first_before, first_after = m.snap(by_role[0][2].before), m.snap(by_role[0][2].after)
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=first_before.shape,
                   shape_out=first_after.shape, dims_in=tensors[1].dims, dims_out=tensors[2].dims,
                   title=title, explanation=explanation,
                   extra_ops=sorted({i for rep in found for i in rep.ops}))


def _head_dims(shape: tuple[int, ...], axis: int, heads: str = "h") -> tuple[str, ...]:
    """(B, h, T, d_h) or (B, T, h, d_h): the head axis named h, or h_kv before the repeat."""
    if len(shape) != 4:
        return tuple(f"d{i}" for i in range(len(shape)))
    return ("B", heads, "T", "d_h") if axis in (1, -3) else ("B", "T", heads, "d_h")


def _projection_widths(m: StageMaker) -> dict[str, int]:
    widths: dict[str, int] = {}
    for op in m.g.ops:
        if m.g.kind.get(op.index) == "project" and op.name in ("linear", "matmul", "addmm", "mm"):
            role = m.b.role(op)
            if role in "QKV" and role not in widths:
                widths[role] = op.out.shape[-1]
    return dict(sorted(widths.items(), key=lambda item: "QKV".index(item[0])))


# ---------------------------------------------------------------------- judging


def judge(j: Judge) -> list[Row]:
    """Each shared-K/V stage: the repeats found again from its ops (the recogniser's own
    function), judged on the values: query head j must read K/V head j // (h / h_kv), for K
    and for V alike (Llama's repeat_kv, repeat_interleave), never j % h_kv (.repeat)."""
    from ._parts.judging import judge_found

    sizes = j.sizes  # the judge's: B, T_q, C, the h asked for, d_h, and T_k

    def find(g: Graph, stage: Stage) -> list[Repeat]:
        found: list[Repeat] = []
        for op in sorted(stage.ops, key=lambda o: -o.index):
            if any(op.index in rep.ops for rep in found):
                continue
            rep = _repeat_ending_at(g, op, sizes)
            if rep is not None:
                found.append(rep)
        return found

    return judge_found(j, KIND, find, _judged, "the repeat")


def _judged(j: Judge, g: Graph, stage: Stage, by_role: list[tuple[str, Repeat]]) -> Row:
    by_role.sort(key=lambda p: "KV?Q".index(p[0]) if p[0] in "KV?Q" else 4)
    h_kv = by_role[0][1].h_kv
    n = j.h // h_kv
    names = " and ".join(role for role, _ in by_role if role in "KV") or "K/V"
    checked = (f"{names}: query head j reads K/V head j // {n}, each of the {h_kv} K/V heads "
               f"serving {n} neighbouring query heads (shared K/V heads, h_kv {h_kv})")
    for role, rep in by_role:
        source = g.ops[rep.after.op].source  # type: ignore[index]
        if rep.order == "tile":
            cycled = ", ".join(str(head % h_kv) for head in range(j.h))
            wanted = ", ".join(str(head // n) for head in range(j.h))
            return j.row(stage, KIND, False, None, checked, source=source, diagnosis=(
                "kv_repeat_order",
                f"{role if role in 'KV' else 'K/V'} heads shared the wrong way: query heads "
                f"0..{j.h - 1} read K/V heads {cycled} (torch's .repeat cycles the heads), but "
                f"grouped-query attention gives each K/V head {n} neighbouring query heads: "
                f"{wanted} (repeat_interleave on the head axis, or expand + reshape as "
                f"repeat_kv does)"))
        if role == "Q":
            return j.row(stage, KIND, False, None, checked, source=source, diagnosis=(
                "kv_repeat_q", "Q's heads are repeated: only K and V are shared between "
                               "query heads; Q must keep its h heads"))
    if len({rep.h_kv for _, rep in by_role}) > 1:
        return j.row(stage, KIND, False, None, checked, diagnosis=(
            "kv_repeat_mismatch", "K and V are shared between different numbers of heads"))
    return j.row(stage, KIND, True, 0.0, checked,
                 source=g.ops[by_role[0][1].after.op].source)  # type: ignore[index]


def why(cell: Cell) -> Why:
    """A repeated K/V value: query head j reads K/V head j // n (or j % h_kv, where the
    module's .repeat cycled the heads, as the stage found), the same number copied."""
    before = cell.record_before()  # the builder's pairs: (role, h_kv heads), (role, h heads)
    if before is None:
        raise WhyError(f"cannot tell which K/V heads {cell.name} was copied from")
    shape, kv_shape = cell.record.values.shape, before.values.shape
    axes = [a for a, (n, m) in enumerate(zip(shape, kv_shape, strict=False)) if n != m]
    if len(shape) != len(kv_shape) or len(axes) != 1 or shape[axes[0]] % kv_shape[axes[0]]:
        raise WhyError(f"cannot read {cell.name} against {before.name}")
    axis = axes[0]
    h_kv = kv_shape[axis]
    n = shape[axis] // h_kv
    head = cell.index[axis]
    if repeat_order(before.values, cell.record.values, axis) == "tile":
        source, rule = head % h_kv, f"{head} % {h_kv}"
        said = (f"the {h_kv} K/V heads are cycled {n} times (torch's .repeat), not each "
                f"repeated in place: query head {head} reads K/V head {source}")
    else:
        source, rule = head // n, f"{head} // {n}"
        said = (f"each of the {h_kv} K/V heads is repeated {n} times, one copy for each query "
                f"head that shares it: heads {source * n}..{source * n + n - 1} read K/V head "
                f"{source}")
    at = (*cell.index[:axis], source, *cell.index[axis + 1:])
    computed = float(before.values[at])
    spot = f"[{', '.join(map(str, at))}]"
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {before.name}{spot}  (query head {head} reads K/V head "
               f"{rule} = {source})",
               (Term(f"{before.name}{spot}", (), computed),),
               (said, "copied, not computed"), computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """Which K/V head the last query head reads."""
    groups = stage.tensors[0] if stage.tensors else None
    if groups is None or groups.kind != "int" or groups.values.ndim != 1:
        return ()
    head = groups.values.shape[0] - 1
    kv = int(groups.values[head])
    return (Question(stage.id, "kv_head", f"Which K/V head does query head {head} read?",
                     "integer", kv, str(kv),
                     f"{groups.name}[{head}] = {kv}: query head j reads K/V head j // n, with "
                     "n query heads per K/V head (from the recorded shapes)"),)
