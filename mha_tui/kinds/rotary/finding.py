"""Finding rotary rotations in a recorded forward: the ops from a head tensor to the
turned one, checked on the values (see the package's docstring). Shared by the rule, the
stage, the judge and the drill-down.

Never import torch, rich, textual or typer here.
"""


from __future__ import annotations

import math
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import numpy as np

from ...ops.graph import Graph, value_inputs
from ...ops.numeric import tolerance
from ...ops.sizes import Sizes
from ...records import OpRecord, Ref
from .measured import WALK, measured

KIND = "rotary"
ELEMENTWISE = {"mul", "add", "sub", "neg", "cat", "stack", "getitem", "flatten", "view",
                "reshape", "unsqueeze", "float", "to", "type_as", "contiguous", "view_as_complex",
                "view_as_real", "repeat_interleave", "mul_", "add_"}
_CASTS = {"to", "type_as", "float", "contiguous"}
CLAIMS = ELEMENTWISE | WALK  # the ops a rotation may be made of
_COMPLEX_WRAP = {"view_as_complex", "reshape", "view", "float", "to", "type_as", "contiguous"}
_COMPLEX_UNWRAP = {"view_as_real", "flatten", "reshape", "view", "type_as", "to", "float"}


@dataclass(frozen=True)
class Rotation:
    """One rotated tensor (q or k): what went in, what came out, and the module's tables."""

    before: Ref  # the head tensor before rotary (all d_h channels)
    rotated_in: Ref  # the part turned: `before`, or its first r channels
    after: Ref  # the tensor that goes on to the scores (the pass-through joined back)
    passed: Ref | None  # the channels passed through unchanged (partial rotary)
    r: int  # channels turned per head
    pairing: str  # "half": (i, i + r/2); "interleaved": (2i, 2i + 1)
    cos: np.ndarray  # (T, r/2): the module's cos per position and pair
    sin: np.ndarray
    ops: frozenset[int]  # every op from rotated_in to after
    scale: float = 1.0  # the tables' length: YaRN's attention factor multiplies cos and sin
    # the ops that made the cos and sin tables from tensors the caller passed (Hugging Face
    # hands `position_embeddings` in; transformers 5.24's GPT-J repeats each angle for its
    # pair with `repeat_interleave` inside the forward): no projection feeds them
    tables: frozenset[int] = frozenset()


# Found once per graph and number of projections known: the rules run op by op, and a
# rotation is recognised from the projections its tensors come from.
_FOUND: WeakKeyDictionary[Graph, tuple[int, list[Rotation]]] = WeakKeyDictionary()


def rotations(g: Graph, sizes: Sizes) -> list[Rotation]:
    """Every rotary rotation in the forward whose projection is already classified."""
    known = sum(1 for kind in g.kind.values() if kind == "project")
    cached = _FOUND.get(g)
    if cached is None or cached[0] != known:
        _FOUND[g] = cached = (known, _find(g, sizes))
    return cached[1]


# ---------------------------------------------------------------- finding rotations


def _vector_and_table(g: Graph, op: OpRecord) -> tuple[Ref, Ref] | None:
    """A product of a projected tensor and a table that does not come from a projection."""
    if op.name != "mul" or len(op.inputs) != 2:
        return None
    a, b = op.inputs
    projected = [g.derives(ref, {"project"}) for ref in (a, b)]
    if projected == [True, False]:
        return a, b
    if projected == [False, True]:
        return b, a
    return None


def _reaches(g: Graph, ref: Ref, target: Ref, steps: int = 8) -> bool:
    """ref is target, or is made from it through a few elementwise and shape ops."""
    todo, seen = [ref], set()
    while todo and steps:
        r = todo.pop()
        if _same(r, target):
            return True
        op = g.producer(r)
        if op is None or op.index in seen or op.name not in ELEMENTWISE:
            continue
        seen.add(op.index)
        steps -= 1
        todo.extend(i for i in op.inputs if g.derives(i, {"project"}) or _same(i, target))
    return False


def _same(a: Ref, b: Ref) -> bool:
    return (a.kind == b.kind == "op" and a.op == b.op and a.output == b.output) or (
        a.kind == b.kind == "input" and a.name == b.name)


def _t_axis(shape: tuple[int, ...], table: tuple[int, ...], T: int) -> int | None:
    """The axis of the tokens: where the table varies with length T (right-aligned)."""
    for axis in range(2, len(shape) + 1):
        size = table[-axis] if axis <= len(table) else 1
        if shape[-axis] == T and size == T:
            return -axis
    return None


def _per_position(table: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """The table broadcast to shape, reduced to (T, last): the first row of every other axis."""
    full = np.broadcast_to(table, shape)
    moved = np.moveaxis(full, axis, -2)
    return moved.reshape(-1, *moved.shape[-2:])[0]


def pairs(values: np.ndarray, pairing: str) -> tuple[np.ndarray, np.ndarray]:
    r = values.shape[-1]
    if pairing == "half":
        return values[..., : r // 2], values[..., r // 2:]
    return values[..., 0::2], values[..., 1::2]


def rotate(values: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairing: str) -> np.ndarray:
    """values turned pair by pair by the angles whose cos and sin are given (..., r/2)."""
    a, b = pairs(values.astype(np.float64), pairing)
    first, second = a * cos - b * sin, b * cos + a * sin
    if pairing == "half":
        return np.concatenate([first, second], axis=-1)
    return np.stack([first, second], axis=-1).reshape(values.shape)


def _real_rotation(g: Graph, op: OpRecord, sizes: Sizes) -> Rotation | None:
    """`x * cos + rot(x) * sin`, checked on the values."""
    if op.name not in {"add", "add_"} or len(op.inputs) != 2:
        return None
    products = [g.producer(ref) for ref in op.inputs]
    if any(p is None for p in products):
        return None
    parts = [_vector_and_table(g, p) for p in products]  # type: ignore[arg-type]
    if parts[0] is None or parts[1] is None:
        return None
    (x_a, table_a), (x_b, table_b) = parts
    if _reaches(g, x_b, x_a) and not _same(x_a, x_b):
        plain, cos_ref, sin_ref = x_a, table_a, table_b
    elif _reaches(g, x_a, x_b) and not _same(x_a, x_b):
        plain, cos_ref, sin_ref = x_b, table_b, table_a
    else:
        return None
    x = g.snap(plain).values
    y = op.out.values
    r = x.shape[-1] if x.ndim else 0
    if x.shape != y.shape or r < 2 or r % 2 or x.dtype.kind != "f":
        return None
    cos_t, sin_t = g.snap(cos_ref).values, g.snap(sin_ref).values
    axis = _t_axis(x.shape, cos_t.shape, sizes.T) if sizes.T > 1 else -2
    if axis is None or cos_t.shape[-1] not in (1, r):
        return None
    cos_full = np.broadcast_to(cos_t, x.shape).astype(np.float64)
    sin_full = np.broadcast_to(sin_t, x.shape).astype(np.float64)
    for pairing in ("half", "interleaved"):
        c, _ = pairs(cos_full, pairing)
        s, _ = pairs(sin_full, pairing)
        if np.allclose(c * c + s * s, 1.0, **tolerance(atol=1e-4, rtol=1e-5)) and \
                np.allclose(rotate(x, c, s, pairing), y, **tolerance(atol=1e-5, rtol=1e-4)) and \
                np.allclose(*pairs(cos_full, pairing), **tolerance(atol=1e-6, rtol=1e-5)):
            cos = _per_position(c, c.shape, axis)
            sin = _per_position(s, s.shape, axis)
            return _complete(g, plain, Ref("op", op=op.index), r, pairing, cos, sin,
                             _table_ops(g, (cos_ref, sin_ref)))
    return None


def _complex_rotation(g: Graph, op: OpRecord, sizes: Sizes) -> Rotation | None:
    """`view_as_real(view_as_complex(x.reshape(..., -1, 2)) * freqs_cis)`, Meta's spelling."""
    if op.name != "mul" or len(op.inputs) != 2:
        return None
    found = _vector_and_table(g, op)
    if found is None:
        return None
    vector, table = found
    if not g.snap(vector).dtype.startswith("complex") or not g.snap(table).dtype.startswith("complex"):
        return None
    ref = vector  # back to the real (..., d_h) tensor it was made from
    for _ in range(6):
        producer = g.producer(ref)
        if producer is None or producer.name not in _COMPLEX_WRAP or not producer.inputs:
            break
        ref = producer.inputs[0]
        if producer.name == "view_as_complex":
            continue
        if g.snap(ref).dtype.startswith(("float", "bfloat")) and g.snap(ref).ndim == g.snap(vector).ndim:
            break
    before = g.snap(ref)
    if not before.dtype.startswith(("float", "bfloat")) or before.shape[-1] != 2 * g.snap(vector).shape[-1]:
        return None
    after = Ref("op", op=op.index)  # forward to the real tensor of the same shape again
    for _ in range(6):
        consumers = g.consumers[after.op]  # type: ignore[index]
        if len(consumers) != 1 or g.ops[consumers[0]].name not in _COMPLEX_UNWRAP:
            break
        after = Ref("op", op=consumers[0])
        done = g.snap(after)
        if done.shape == before.shape and done.dtype == before.dtype:
            break
    if g.snap(after).shape != before.shape:
        return None
    values = g.snap(table).values
    axis = _t_axis(g.snap(vector).shape, values.shape, sizes.T) if sizes.T > 1 else -2
    if axis is None:
        return None
    full = np.broadcast_to(values, g.snap(vector).shape)
    cos, sin = full.real.astype(np.float64), full.imag.astype(np.float64)
    turned = rotate(before.values, cos, sin, "interleaved")
    if not np.allclose(cos * cos + sin * sin, 1.0, **tolerance(atol=1e-4, rtol=1e-5)) or \
            not np.allclose(turned, g.snap(after).values, **tolerance(atol=1e-5, rtol=1e-4)):
        return None
    return _complete(g, ref, after, before.shape[-1], "interleaved",
                     _per_position(cos, cos.shape, axis), _per_position(sin, sin.shape, axis),
                     _table_ops(g, (table,)))


def _slice_of(g: Graph, ref: Ref) -> tuple[Ref, tuple[int | None, int | None]] | None:
    """ref = source[..., start:stop] (a getitem on the last axis): the source and the bounds."""
    op = g.producer(ref)
    if op is None or op.name != "getitem" or not op.inputs or len(op.args) < 2:
        return None
    index = op.args[1]
    parts = index if isinstance(index, tuple) and index and isinstance(index[0], tuple | str) \
        else (index,)
    last = parts[-1] if parts else None
    if not (isinstance(last, tuple) and last and last[0] == "slice") or last[3] not in (None, 1):
        return None
    if any(p not in ("...", Ellipsis) and p != ("slice", None, None, None) for p in parts[:-1]):
        return None
    return op.inputs[0], (last[1], last[2])


def _table_ops(g: Graph, tables: tuple[Ref, ...], most: int = 16) -> frozenset[int]:
    """The ops that made the tables from an input of the forward (the tensors the caller
    passed, which the graph follows like x): up their dataflow, while no projection feeds
    them. Ops on a constant (a buffer, arange) depend on no input and are never stages."""
    found: set[int] = set()
    todo = list(tables)
    while todo and len(found) < most:
        op = g.producer(todo.pop())
        if op is None or op.index in found or not g.from_x[op.index] or \
                g.op_derives(op, {"project"}):
            continue
        found.add(op.index)
        todo.extend(value_inputs(op))
    return frozenset(found)


def _complete(g: Graph, rotated_in: Ref, site: Ref, r: int, pairing: str, cos: np.ndarray,
              sin: np.ndarray, tables: frozenset[int] = frozenset()) -> Rotation:
    """The whole rotation: a partial one's slice, pass-through and cat; every op between."""
    before, after, passed = rotated_in, site, None
    extra: set[int] = set()
    sliced = _slice_of(g, rotated_in)
    if sliced is not None and sliced[1][0] in (None, 0):
        source, _ = sliced
        site = _cast_after(g, site, extra)  # litgpt's `roped.to(dtype=x.dtype)` before the cat
        for c in g.consumers[site.op]:  # type: ignore[index]
            joined = g.ops[c]
            if joined.name != "cat" or len(joined.inputs) != 2 or not _same(joined.inputs[0], site):
                continue
            rest = _slice_of(g, joined.inputs[1])
            if rest is not None and _same(rest[0], source) and rest[1][0] == r:
                before, after, passed = source, Ref("op", op=c), joined.inputs[1]
                extra |= {rotated_in.op, joined.inputs[1].op, c}  # type: ignore[arg-type]
                break
    ops = _between(g, rotated_in, after) | {i for i in extra if i is not None}
    return Rotation(before=before, rotated_in=rotated_in, after=after, passed=passed, r=r,
                    pairing=pairing, cos=np.asarray(cos, np.float64),
                    sin=np.asarray(sin, np.float64), ops=frozenset(ops), tables=tables - ops)


def _cast_after(g: Graph, site: Ref, extra: set[int]) -> Ref:
    """site, or the dtype cast it goes through alone (`.to(dtype)`, `.type_as(x)`), whose
    op joins `extra`."""
    for _ in range(3):
        consumers = g.consumers[site.op]  # type: ignore[index]
        if len(consumers) != 1 or g.ops[consumers[0]].name not in _CASTS:
            return site
        site = Ref("op", op=consumers[0])
        extra.add(consumers[0])
    return site


def _between(g: Graph, start: Ref, end: Ref) -> set[int]:
    """The ops on some path from start (exclusive) to end (inclusive)."""
    ancestors: set[int] = set()
    todo = [end.op]
    while todo:
        i = todo.pop()
        if i is None or i in ancestors:
            continue
        op = g.ops[i]
        if any(_same(ref, start) for ref in op.inputs) or _reaches(g, Ref("op", op=i), start, 16):
            ancestors.add(i)
            todo.extend(ref.op for ref in op.inputs if ref.kind == "op" and not _same(ref, start))
    return ancestors


def _find(g: Graph, sizes: Sizes) -> list[Rotation]:
    found: list[Rotation] = []
    claimed: set[int] = set()
    for op in g.ops:
        if not g.from_x[op.index] or op.index in claimed:
            continue
        rotation = _real_rotation(g, op, sizes) or _complex_rotation(g, op, sizes)
        if rotation is not None:
            found.append(rotation)
            claimed |= rotation.ops
    for before, rotated_in, after, passed, r, pairing, cos, sin, scale, ops in measured(g, sizes):
        if ops & claimed:
            continue
        found.append(Rotation(before=before, rotated_in=rotated_in, after=after, passed=passed,
                              r=r, pairing=pairing, cos=cos, sin=sin, ops=ops, scale=scale))
        claimed |= ops
    return found



def angles_of(rotation: Rotation) -> np.ndarray:
    return np.arctan2(rotation.sin, rotation.cos)  # (T, r/2)


def frequencies(angles: np.ndarray) -> tuple[np.ndarray, float | None, bool]:
    """omega_i (radians per position) from angle(1), the base it implies, and whether every
    omega_i is base^(-2i/r)."""
    if angles.shape[0] < 2:
        return np.zeros(angles.shape[-1]), None, False
    omega = angles[1].astype(np.float64)
    n = omega.shape[0]
    if n < 2 or omega[1] <= 0:
        return omega, None, False
    base = float(omega[1] ** (-n))  # omega_1 = base^(-2/r) = base^(-1/n)
    expected = base ** (-np.arange(n) / n)
    return omega, base, bool(np.allclose(omega, expected, **tolerance(atol=1e-6, rtol=1e-4)))


def wrapped(a: np.ndarray) -> np.ndarray:
    return (a + math.pi) % (2 * math.pi) - math.pi


def turned_position(angle: float, most: int) -> int | None:
    """The position p in 0..most whose rotary turns pair 0 by `angle`: pair 0 turns by p
    radians at position p in every base (ω_0 = base^0 = 1), so p is the integer that angle
    is, modulo a full turn. None when no position in range is (scaled frequencies)."""
    found = [p for p in range(most + 1) if abs(float(wrapped(np.float64(p - angle)))) < 1e-3]
    return found[0] if found else None




@dataclass(frozen=True)
class Scaling:
    """Rotary frequencies scaled from base^(-2i/r), as Llama 3's and YaRN's rope_scaling do:
    the fast pairs as they are, the slow ones turning `factor` times slower, and (YaRN) cos
    and sin multiplied by an attention factor."""

    omega: np.ndarray  # radians per position of each pair, measured
    factor: float  # how many times slower the slowest pair turns
    attention: float  # the tables' length (1: none)

    @property
    def yarn(self) -> bool:
        """YaRN's cos and sin carry its attention factor 0.1 ln(factor) + 1; Llama 3's do not."""
        return not np.isclose(self.attention, 1.0, **tolerance(atol=1e-8, rtol=1e-4))

    def parameters(self) -> dict[str, object]:
        """For a grader's script: which scaling, its factor (as measured), YaRN's attention
        factor."""
        return {"rope_type": "yarn" if self.yarn else "llama3",
                "factor": float(f"{self.factor:.4g}"), "attention_factor": float(f"{self.attention:.6g}")}

    def words(self) -> str:
        # measured from float32 tables: 3.99 is YaRN's factor 4
        rounded = float(f"{self.factor:.2g}")
        factor = f"{rounded:g}" if abs(rounded - self.factor) <= 0.01 * self.factor else \
            f"{self.factor:.3g}"
        yarn = self.yarn
        which = "YaRN's rope_scaling (rope_type yarn)" if yarn else \
            "Llama 3's rope_scaling (rope_type llama3)"
        said = (f"scaled frequencies: the fast pairs as base^(−2i/r), the slowest {factor} "
                f"times slower (rope scaling, factor {factor}, as {which})")
        if yarn:
            said += f", cos and sin times {self.attention:.4g} (YaRN's attention factor)"
        return said


def scaling(rotation: Rotation, base: float) -> Scaling | None:
    """The rope scaling that makes the rotation's frequencies from base, or None when they
    are base^(-2i/r) already or follow no scaling: each pair's frequency the unscaled one
    divided by 1 (the fastest pair) up to F, never rising back, F > 1, the slowest pairs all
    divided by F (a smaller base divides them ever more: that is a wrong base, not this)."""
    angles = np.arctan2(rotation.sin, rotation.cos)
    T, n = angles.shape
    if T < 2 or n < 2:
        return None
    if angles[1, 0] < 0:
        angles = -angles
    omega = np.unwrap(angles, axis=0)[-1] / (T - 1)  # the last position: the most precise
    plain = base ** (-np.arange(n) / n)
    ratio = omega / plain
    if np.allclose(ratio, 1.0, rtol=1e-3) or not np.isclose(ratio[0], 1.0, rtol=1e-2):
        return None
    if (ratio > 1.0 + 1e-2).any() or (np.diff(ratio) > 5e-2 * ratio[:-1]).any():
        return None
    if n < 3 or not np.isclose(ratio[-1], ratio[-2], rtol=2e-2):
        return None  # no plateau at 1/F for the slowest pairs: another base, not a scaling
    factor = float(1.0 / ratio[-1])
    return Scaling(omega, factor, rotation.scale) if factor > 1.01 else None
