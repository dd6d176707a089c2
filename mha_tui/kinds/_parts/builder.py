"""How a stage's tensors are recorded: named, laid out on B, T, C, h, d_h axes (torch's own
(T, B, C) and (B * h, T, .) layouts regrouped for display only), per-head results stacked
as a fused module holds them, and each projection's role (Q, K, V) read from where its
output goes.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from ...config import Config
from ...ops.graph import Graph
from ...ops.numeric import HALF, precision
from ...ops.sizes import Sizes
from ...records import ModuleCall, OpRecord, Snapshot, TensorRecord

BTC = ("B", "T", "C")
BTHD = ("B", "T", "h", "d_h")
BHTD = ("B", "h", "T", "d_h")
BHTT = ("B", "h", "T", "T")
# The same tensor as torch's own MHA lays it out, or as one head's own module or loop holds
# its part.
_TORCH_LAYOUTS = {BHTD: (("B*h", "T", "d_h"), ("B", "T", "d_h"), ("T", "d_h")),
                  BHTT: (("B*h", "T", "T"), ("B", "T", "T"), ("T", "T")),
                  BTHD: (("T", "B*h", "d_h"), ("T", "B", "h", "d_h")),
                  BTC: (("T", "B", "C"), ("T*B", "C"))}
# torch's MHA's (T * B, C): its heads side by side, batch and tokens merged; drawn regrouped
# as (B, T, C), whatever the sizes (T == C makes it look like (T, T)).
TOKENS_BY_BATCH = ("T*B", "C")
# K and V when the module shares K/V heads (grouped-query, multi-query): h_kv heads, h_kv*d_h
# channels; a fused projection's output: q, k and v side by side.
KV_HEADS = "h_kv"
KV_WIDTH = "h_kv*d_h"
FUSED_3C = ("B", "T", "3C")
FUSED_SHARED = ("B", "T", "(h+2*h_kv)*d_h")
# The keys' axis in cross-attention (the context's tokens); T is then the queries'.
KEYS = "T_k"


def _keyed(dims: tuple[str, ...]) -> list[tuple[str, ...]]:
    """A layout with its T axes read as the keys' T_k: each one alone, the last first (a
    (T, T) is queries x keys), then all of them."""
    spots = [i for i, d in enumerate(dims) if d == "T"]
    out = [tuple(KEYS if i == spot else d for i, d in enumerate(dims)) for spot in reversed(spots)]
    if len(spots) > 1:
        out.append(tuple(KEYS if d == "T" else d for d in dims))
    return out


# Label sets tried by size alone, when the caller knows nothing of a tensor.
_BY_SIZE = (BTC, BHTD, BTHD, BHTT, ("T", "T"), ("B", "T", "d_h"), ("B", "T", "T"),
            ("T", "B", "C"), ("T", "B*h", "d_h"), ("B*h", "T", "d_h"), ("B*h", "T", "T"),
            ("T", "B", "h", "d_h"))


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


class Builder:
    """Builds each stage's tensors and checks from its ops."""

    h_kv: int | None = None  # K/V heads when fewer than h (see __init__)

    def __init__(self, g: Graph, sizes: Sizes, config: Config, head_calls: list[ModuleCall]) -> None:
        self.g, self.sizes, self.config = g, sizes, config
        # Heads computed one at a time: as separate modules, or in a loop over Q[h], K[h], V[h].
        self.per_head = bool(head_calls) or bool(g.head)
        self.head_modules = bool(head_calls)
        self.names: dict[int, str] = {}
        # Tensors mha-tui stacked from the heads' own (id of the stacked array -> each
        # head's strides), so that their record says so instead of showing one head's.
        self.stacked_strides: dict[int, list[tuple[int, ...]]] = {}
        # Dims a stage gave a recorded tensor (id of its Snapshot -> the snapshot, its dims).
        self.known: dict[int, tuple[Snapshot, tuple[str, ...]]] = {}
        # How many K/V heads when fewer than h (shared K/V heads), from the recognised ops
        # (kv_repeat.kv_heads); None when K and V have the h heads Q has.
        self.h_kv: int | None = None
        self._made_by: dict[int, int] | None = None  # id of an op's output -> the op (key_side)

    # ------------------------------------------------------------ naming

    def name(self, op: OpRecord) -> str:
        """What the module calls this tensor: the assignment target of its statement."""
        if op.index in self.names:
            return self.names[op.index]
        text = op.source.text
        match = re.match(r"\s*([A-Za-z_][A-Za-z_0-9]*)\s*(?:\[[^\]]*\])?\s*[+\-*/@]?=(?!=)", text)
        if match and match.group(1) != "return":
            return match.group(1)
        if text.lstrip().startswith("return"):
            return "out"
        return {"project": "projection", "w_o": "out"}.get(self.g.kind.get(op.index, ""), op.name)

    def role(self, op: OpRecord) -> str:
        """Q, K or V for a projection, from where its output goes (never from its name)."""
        g = self.g
        todo, seen = [op.index], set()
        while todo:
            i = todo.pop(0)
            if i in seen:
                continue
            seen.add(i)
            for c in g.consumers[i]:
                consumer = g.ops[c]
                kind = g.kind.get(c)
                if kind in ("scores", "sdpa"):
                    position = next(n for n, r in enumerate(consumer.inputs) if r.op == i)
                    if kind == "sdpa":
                        return "QKV"[min(position, 2)]
                    if consumer.name == "einsum":
                        return "Q" if position == 0 else "K"
                    # q @ k^T: k arrives through a transpose of its last two axes
                    return "K" if position == 1 else "Q"
                if kind == "attend":
                    return "V"
                if kind == "scale" and c not in seen and g.op_derives(consumer, {"scores"}):
                    continue
                todo.append(c)
        return "?"

    # ------------------------------------------------------------ records

    def dims(self, shape: tuple[int, ...], prefer: Sequence[tuple[str, ...]] = (), *,
             key_side: bool = False) -> tuple[str, ...]:
        """The axes' names of a tensor of this shape: the caller's preferred layouts first.
        In cross-attention a T axis may be the keys' T_k: the last T of a (T, T) layout is
        (queries, keys); key_side (a tensor made from the context alone) tries T_k first."""
        fits = self._fits(shape)

        def keyed(layouts: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
            return [v for d in layouts for v in self._keyed_first(d, key_side)]

        # What the caller knows the tensor is (its stage's dims) wins, in its own layout,
        # torch's MHA's (batch and heads merged, tokens first) or one head's.
        for dims in keyed([p for known in prefer for p in (known, *_TORCH_LAYOUTS.get(known, ()))]):
            if fits(dims):
                return self.unbatched(dims, dims)
        # Otherwise sizes alone: when two label sets fit and name an axis differently (T and
        # d_h when T == d_h), the sizes cannot tell which it is: neutral d0, d1, ... rather
        # than the first guess. (B, T, C) and (B, T, d_h) when one head is the whole width
        # name the same axes.
        found = [self.unbatched(dims, dims) for dims in keyed(_BY_SIZE) if fits(dims)]
        if found and all(self._same_axes(found[0], other) for other in found[1:]):
            return found[0]
        return tuple(f"d{i}" for i in range(len(shape)))

    def _table(self) -> dict[tuple[str, ...], tuple[int, ...]]:
        """Every layout the builder names, with the sizes its axes have in this forward."""
        s = self.sizes
        table = {
            BTC: (s.B, s.T, s.C), BTHD: (s.B, s.T, s.h, s.d_h), BHTD: (s.B, s.h, s.T, s.d_h),
            BHTT: (s.B, s.h, s.T, s.T), ("T", "T"): (s.T, s.T), ("B", "T"): (s.B, s.T),
            ("T", "d_h"): (s.T, s.d_h),  # one head's slice in a per-head loop
            ("B", "T", "d_h"): (s.B, s.T, s.d_h),  # one head's own module's q, k, v
            ("B", "T", "T"): (s.B, s.T, s.T),  # one head's own module's scores
            ("T", "B", "C"): (s.T, s.B, s.C),  # torch's own MHA: tokens first
            TOKENS_BY_BATCH: (s.T * s.B, s.C),  # ... its heads side by side, before out_proj
            ("T", "B*h", "d_h"): (s.T, s.B * s.h, s.d_h),  # ... and batch and heads merged
            ("B*h", "T", "d_h"): (s.B * s.h, s.T, s.d_h),  # ... then heads first
            ("B*h", "T", "T"): (s.B * s.h, s.T, s.T),
            ("T", "B", "h", "d_h"): (s.T, s.B, s.h, s.d_h),  # ... its sdpa path's permute back
            FUSED_3C: (s.B, s.T, 3 * s.C),  # a fused projection's q | k | v
        }
        if self.h_kv:  # K and V with fewer heads than Q, and the fused output that makes them
            table.update({
                ("B", "T", KV_WIDTH): (s.B, s.T, self.h_kv * s.d_h),
                ("B", "T", KV_HEADS, "d_h"): (s.B, s.T, self.h_kv, s.d_h),
                ("B", KV_HEADS, "T", "d_h"): (s.B, self.h_kv, s.T, s.d_h),
                FUSED_SHARED: (s.B, s.T, (s.h + 2 * self.h_kv) * s.d_h),
            })
        if s.T_k is not None:  # cross-attention: the same layouts with the keys' axis T_k
            for dims in list(table):
                for keyed in _keyed(dims):
                    table.setdefault(keyed, tuple(s.T_k if d == KEYS else n
                                                  for d, n in zip(keyed, table[dims], strict=True)))
        return table

    def _fits(self, shape: tuple[int, ...]) -> Callable[[tuple[str, ...]], bool]:
        table = self._table()

        def fits(dims: tuple[str, ...]) -> bool:
            return dims in table and tuple(shape) == self.unbatched(table[dims], dims)

        return fits

    def _keyed_first(self, dims: tuple[str, ...], key_side: bool) -> tuple[tuple[str, ...], ...]:
        """The layouts a T layout may be in cross-attention, in the order they are tried: a
        (T, T) is (queries, keys); a tensor made from the context has its T the keys'."""
        if self.sizes.T_k is None or "T" not in dims:
            return (dims,)
        keyed = _keyed(dims)
        if dims.count("T") > 1:
            return (keyed[0], dims, *keyed[1:])
        return (*keyed, dims) if key_side else (dims, *keyed)

    def cross_dims(self, shape: tuple[int, ...], dims: tuple[str, ...],
                   key_side: bool = False) -> tuple[str, ...]:
        """A layout given as T x T (or T where the tensor is the context's) in
        cross-attention, with the keys' axis named T_k where the sizes or where it came from
        say so; any other layout as it is."""
        if self.sizes.T_k is None or "T" not in dims or KEYS in dims:
            return dims
        fits = self._fits(shape)
        return next((d for d in self._keyed_first(dims, key_side) if fits(d)), dims)

    def kv(self, *layouts: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        """K's or V's layouts when the module shares K/V heads: h_kv heads in place of h,
        h_kv*d_h channels in place of C (none when K and V have h heads). A caller that knows
        a tensor is K or V (from where it goes: `role`) prefers these to the query's."""
        if not self.h_kv:
            return ()
        return tuple(tuple({"h": KV_HEADS, "C": KV_WIDTH}.get(d, d) for d in dims)
                     for dims in layouts)

    def fused(self, width: int) -> tuple[str, ...]:
        """A fused projection's output, q, k and v side by side: (B, T, 3C), or with shared
        K/V heads (B, T, (h+2*h_kv)*d_h) (Falcon's multi-query layer)."""
        s = self.sizes
        if width == 3 * s.C:
            return FUSED_3C
        if self.h_kv and width == (s.h + 2 * self.h_kv) * s.d_h:
            return FUSED_SHARED
        return ()

    def _same_axes(self, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
        """Two label sets naming the same axes: equal, or C and d_h with one head, B*h and
        B with one head, B*h and h with a batch of one."""
        s = self.sizes
        same = [{"C", "d_h"}] if s.h == 1 else []
        same += [{"B", "B*h"}] if s.h == 1 else []
        same += [{"h", "B*h"}] if s.B == 1 else []
        return len(a) == len(b) and all(x == y or {x, y} in same for x, y in zip(a, b, strict=True))

    def key_side(self, snap: Snapshot) -> bool:
        """Cross-attention: the tensor was made from the context alone (K, V, their heads)."""
        if not self.sizes.cross:
            return False
        if self._made_by is None:
            self._made_by = {id(out): op.index for op in self.g.ops for out in op.outputs}
            self._made_by.update({id(snap): -1 for name, snap in self.g.rec.inputs
                                  if name in self.g.key_names})
        index = self._made_by.get(id(snap))
        return index == -1 or (index is not None and self.g.key_side(index))

    def remember(self, snap: Snapshot, dims: tuple[str, ...]) -> None:
        """A stage's own dims for a recorded tensor, so that a later op stage reading it says
        the same instead of guessing from sizes."""
        if len(dims) == len(snap.shape) and not (dims and dims[0] == "d0"):
            self.known[id(snap)] = (snap, dims)

    def known_dims(self, snap: Snapshot) -> tuple[str, ...] | None:
        """The dims the stage that made this tensor gave it, if one did."""
        found = self.known.get(id(snap))
        return found[1] if found is not None and found[0] is snap else None

    def unbatched(self, values: tuple, dims: tuple[str, ...]) -> tuple:
        """Without a batch axis (NumPy's (T, C)), every label and size loses its B."""
        if self.sizes.batched or "B" not in dims:
            return values
        return tuple(v for v, d in zip(values, dims, strict=True) if d != "B")

    def record(self, name: str, snap: Snapshot, dims: tuple[str, ...] | None = None, *,
               values: np.ndarray | None = None, share: tuple[str, Snapshot] | None = None,
               **extra: object) -> TensorRecord:
        values = snap.values if values is None else values
        caption = str(extra.pop("caption", ""))
        key_side = self.key_side(snap)
        if dims is None or (dims and dims[0].startswith("d0")):  # () for a 0-d tensor
            dims = self.dims(values.shape, key_side=key_side)
        elif self.sizes.cross:  # which T axes are the context's (the keys'), T_q or T_k
            dims = self.cross_dims(values.shape, dims, key_side)
        if len(dims) == values.ndim + 1:
            dims = self.unbatched(dims, dims)
        if (dims and dims[0] == "d0") or dims == TOKENS_BY_BATCH:
            regrouped = self.regroup(values, dims)
            if regrouped is not None:
                values, dims, held = regrouped
                self.remember(snap, held)
                shown = ", ".join(d.replace("*", " * ") for d in held)
                note = f"torch holds it as ({shown}); shown as ({', '.join(dims)})"
                caption = f"{caption}; {note}" if caption else note
        if len(dims) != values.ndim:
            dims = tuple(f"d{i}" for i in range(values.ndim))
        if values is snap.values:
            self.remember(snap, dims)
        elif dims[:2] == ("B", "h") and len(snap.shape) == len(dims) - 1 and not self.per_head:
            self.remember(snap, ("B*h", *dims[2:]))  # torch's (B * h, T, .), shown regrouped
        if self.per_head and snap.strides and len(snap.strides) == values.ndim - 1 and "h" in dims:
            # The heads made h separate tensors (a loop, or one module each); mha-tui stacked
            # them along h to show them side by side. Strides are each head's own.
            each = self.stacked_strides.get(id(values))
            own = ", ".join(f"head {i} {tuple(st)}" for i, st in enumerate(each)) if each else \
                f"head 0 {tuple(snap.strides)}"
            note = (f"the {self.sizes.h} heads' own {_shape_text(snap.shape)} tensors, stacked by "
                    f"mha-tui along h; strides are each head's: {own}")
            caption = f"{caption}; {note}" if caption else note
        extra["caption"] = caption
        if (snap.dtype in HALF and values.dtype == np.float32) or (
                precision().dtype in HALF and values.dtype.kind == "f"):
            # held as float32, exactly; in a half-precision module every float tensor says
            # its dtype (its softmax in float32, say)
            extra.setdefault("dtype", snap.dtype)
        if values.dtype.kind in "biu":  # True/False and whole numbers: never "1.0000"
            extra.setdefault("kind", "int")
            if values.dtype.kind == "b" and not caption:
                extra["caption"] = "bool: 1 is True, 0 is False"
        return TensorRecord(
            name=name, dims=dims, values=values, strides=snap.strides, contiguous=snap.contiguous,
            stride_unit=snap.stride_unit,
            shares_storage=None if share is None else snap.storage == share[1].storage,
            shares_with=share[0] if share else "", **extra,  # type: ignore[arg-type]
        )

    def regroup(self, values: np.ndarray, held: tuple[str, ...] = ()
                ) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]] | None:
        """torch's own MHA keeps tokens first and batch and heads merged: (T, B, C),
        (T * B, C), (T, B * h, d_h), (B * h, T, .). Regroup those for display only: the
        values, the dims shown, the dims torch holds them in. held: the layout the caller
        knows the tensor is in (TOKENS_BY_BATCH), else it is told by its shape alone."""
        s = self.sizes
        shape = tuple(values.shape)
        if s.h * s.d_h != s.C or not s.batched:
            return None
        if held == TOKENS_BY_BATCH:
            return np.swapaxes(values.reshape(s.T, s.B, s.C), 0, 1), BTC, TOKENS_BY_BATCH
        if shape == (s.T, s.B, s.C) and s.T != s.B:
            return np.swapaxes(values, 0, 1), BTC, ("T", "B", "C")
        if shape == (s.T * s.B, s.C) and len(shape) == 2:
            return np.swapaxes(values.reshape(s.T, s.B, s.C), 0, 1), BTC, TOKENS_BY_BATCH
        if shape == (s.T, s.B * s.h, s.d_h):
            return np.swapaxes(values.reshape(s.T, s.B, s.h, s.d_h), 0, 1), BTHD, ("T", "B*h", "d_h")
        if shape == (s.B * s.h, s.T, s.d_h):
            return values.reshape(s.B, s.h, s.T, s.d_h), BHTD, ("B*h", "T", "d_h")
        if shape == (s.B * s.h, s.T, s.T):
            return values.reshape(s.B, s.h, s.T, s.T), BHTT, ("B*h", "T", "T")
        return None

    @property
    def head_axis(self) -> int:
        """Where per-head results stack: after B, or first when there is no batch axis."""
        return 1 if self.sizes.batched else 0

    def stacked(self, ops: list[OpRecord], axis: int | None = None) -> np.ndarray:
        """Per-head results side by side on a head axis, as a fused module holds them."""
        return np.stack([op.out.values for op in ops], axis=self.head_axis if axis is None else axis)

    def heads_of(self, ops: list[int]) -> list[list[OpRecord]]:
        by_head: dict[int, list[OpRecord]] = {}
        for i in ops:
            by_head.setdefault(self.g.head.get(i, -1), []).append(self.g.ops[i])
        return [by_head[h] for h in sorted(by_head)]

    def out_4d(self, ops: list[int], dims4: tuple[str, ...]) -> tuple[np.ndarray, Snapshot]:
        """The stage's tensor as (B, h, T, .): stacked per head, or torch's (B*h, T, .) regrouped."""
        g, s = self.g, self.sizes
        if self.per_head and len(ops) > 1:
            last = [group[-1] for group in self.heads_of(ops)]
            values = self.stacked(last)
            self.stacked_strides[id(values)] = [op.out.strides for op in last]
            return values, last[0].out
        snap = g.ops[ops[-1]].out
        values = snap.values
        last = g.ops[ops[-1]]
        if last.name == "einsum" and values.ndim == 4:
            values = _einsum_heads_first(last, values)
        if not s.batched:  # NumPy: (h, T, .) already, or one head's (T, .)
            return (values[None] if values.ndim == 2 else values), snap
        if values.ndim == 3 and values.shape[0] == s.B * s.h and s.h > 1:
            values = values.reshape(s.B, s.h, *values.shape[1:])
        elif values.ndim == 3 and s.h == 1:
            values = values[:, None]
        return values, snap


def _einsum_heads_first(op: OpRecord, values: np.ndarray) -> np.ndarray:
    """An einsum whose output keeps tokens before heads ("...->bqhd") shown as (B, h, T, .)."""
    axes = einsum_swapped(op)
    return np.swapaxes(values, *axes) if axes is not None else values


def einsum_swapped(op: OpRecord) -> tuple[int, int] | None:
    """The two axes of a 4-d einsum's output that are exchanged to show it heads first
    (its query and head axes, "...->bqhd"), or None when it is shown as it is."""
    equation = next((a for a in op.args if isinstance(a, str)), "")
    if "->" not in equation:
        return None
    inputs, output = equation.replace(" ", "").split("->")
    first = inputs.split(",")[0]
    if len(first) != 4 or len(output) != 4:
        return None
    second = inputs.split(",")[1] if "," in inputs else ""
    # the head: kept by both operands and the output ("h" of "bqhd,bkhd->bhqk"); the query:
    # the letter before it ("bqhd", "bkhd,bhqk->bqhd" too), else the first operand's own letter
    # the output keeps ("q")
    heads = [c for c in output[1:] if c in first and c in second]
    if len(heads) == 1 and output.index(heads[0]) == 2:  # "...->bqhd", whichever operand is first
        return 2, 1
    queries = [c for c in first if c in output and c not in second]
    if len(heads) != 1 or len(queries) != 1:
        return None
    head, query = output.index(heads[0]), output.index(queries[0])
    return (head, query) if head > query else None


def _shape_text(shape: tuple[int, ...]) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"
