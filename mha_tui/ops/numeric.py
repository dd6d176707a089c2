"""The check's numbers: differences and tolerances, what a product op computes from its
recorded inputs, which entries a mask blocks, the ratio a scaling applied.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from ..records import OpRecord, Recording, Ref
from .graph import Graph
from .vocab import LARGE_NEGATIVE

# float32 arithmetic in a different order (fused ops, einsum, scale before or after the
# mask) differs by a few ulps; anything above this is a different computation.
ATOL = 1e-5
RTOL = 1e-4
# The half-precision dtypes a module may compute in; the recording holds their numbers as
# float32 (exactly: every bfloat16 and float16 number is a float32 number).
HALF = ("bfloat16", "float16")


@dataclass(frozen=True)
class Precision:
    """How close a recomputation must come to a module's number, for the dtype it computed in.

    mha-tui recomputes from the module's own recorded operands in float32 (float64 on a
    miss), without rounding between steps; the module rounded every op's result to its
    dtype. In float32 that rounding is below ATOL and RTOL. In bfloat16 (8 significant bits)
    one rounding moves a number by up to 2^-9 of itself, and a chain of a few ops (rotary's
    mul, mul, add; a norm) by a few such steps of the numbers it combined: rtol and atol are
    4 units in the last place, 2^-6 (atol on numbers of size about 1; `close` scales it by
    the tensor's largest number). float16 (11 bits): 2^-9.
    """

    dtype: str
    atol: float
    rtol: float

    def words(self) -> str:
        """How a check or a why states it: `within bfloat16 rounding (rtol 2^-6 = 0.0156)`."""
        if self.dtype not in HALF:
            return f"within float32 rounding (atol {self.atol:g}, rtol {self.rtol:g})"
        bits = round(-math.log2(self.rtol))
        return (f"within {self.dtype} rounding (rtol = atol = 2^-{bits} = {self.rtol:.4g}: the "
                f"module rounded every step to {self.dtype})")

    def loosest(self, atol: float, rtol: float) -> dict[str, float]:
        """A check's own float32 tolerance, or, for a half-precision dtype, the dtype's
        where that is coarser (float32 and wider: the check's own, unchanged)."""
        if self.dtype not in HALF:
            return {"atol": atol, "rtol": rtol}
        return {"atol": max(atol, self.atol), "rtol": max(rtol, self.rtol)}


FLOAT32 = Precision("float32", ATOL, RTOL)
_PRECISIONS = {"bfloat16": Precision("bfloat16", 2.0 ** -6, 2.0 ** -6),
               "float16": Precision("float16", 2.0 ** -9, 2.0 ** -9)}
# The precision of the recording being recognised (set by `computed_in` around it).
_CURRENT: ContextVar[Precision] = ContextVar("precision", default=FLOAT32)


def precision_of(dtype: str) -> Precision:
    """The tolerance for a module that computed in dtype (float32's for float32 and wider)."""
    return _PRECISIONS.get(dtype, FLOAT32)


def precision() -> Precision:
    """The precision of the recording being recognised now (float32's outside one)."""
    return _CURRENT.get()


def tolerance(atol: float = ATOL, rtol: float = RTOL) -> dict[str, float]:
    """`atol=..., rtol=...` for np.allclose: a check's own float32 tolerance, loosened to the
    dtype the module computed in (`precision()`) when that is coarser."""
    return _CURRENT.get().loosest(atol, rtol)


@contextmanager
def computed_in(dtype: str) -> Iterator[Precision]:
    """Every check made inside allows the rounding of dtype (the module's own dtype)."""
    token = _CURRENT.set(precision_of(dtype))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def recorded_dtype(rec: Recording) -> str:
    """The float dtype the module computed in: its float input's (x), else its first float
    op output's, else float32 (what recognising and judging a recording allow for)."""
    floats = [snap.dtype for _, snap in rec.inputs if snap.dtype.startswith(("float", "bfloat"))]
    floats += [op.out.dtype for op in rec.ops if op.outputs
               and op.out.dtype.startswith(("float", "bfloat"))]
    return floats[0] if floats else "float32"


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """values (float32) rounded to dtype as torch rounds them (to nearest, ties to even),
    held as float32: what a bfloat16 or float16 op writes for those exact results. Any other
    dtype: the values as they are."""
    x = np.asarray(values, dtype=np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if dtype != "bfloat16":
        return x
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16  # c10's round_to_nearest_even
    return np.where(np.isnan(x), x, bits.astype(np.uint32).view(np.float32))


def f64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b|; equal infinities and NaN in the same place count as equal."""
    a, b = f64(a), f64(b)
    if a.shape != b.shape:
        try:
            a, b = np.broadcast_arrays(a, b)
        except ValueError:
            return math.inf
    if a.size == 0:
        return 0.0
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max())


def close(a: np.ndarray, b: np.ndarray, scale: float | None = None) -> tuple[bool, float]:
    """(within tolerance, largest difference): atol + rtol * the size of the numbers (ATOL
    and RTOL for float32, the recording's own dtype's rounding for half precision)."""
    d = max_diff(a, b)
    finite = f64(b)[np.isfinite(f64(b))] if np.size(b) else np.zeros(0)
    size = scale if scale is not None else (float(np.abs(finite).max()) if finite.size else 0.0)
    p = precision()  # half precision: the rounding is of the numbers' own size
    return d <= max(ATOL + RTOL * size, p.rtol * size if p.dtype in HALF else 0.0), d



def allclose(actual: np.ndarray, expected: np.ndarray, *, atol: float = ATOL,
             rtol: float = RTOL) -> bool:
    """See `_allclose`; atol and rtol are loosened to the recording's dtype (`tolerance`)."""
    return _allclose(actual, expected, **tolerance(atol, rtol))


def _allclose(actual: np.ndarray, expected: np.ndarray, *, atol: float, rtol: float) -> bool:
    """`np.allclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True)`, in two passes.

    When `expected` is all finite (the common case), NumPy's own formula reduces to
    `|actual - expected| <= atol + rtol * |expected|` (equal values and NaN are decided by it
    alone), computed here in the same dtypes; otherwise NumPy decides. Same answer, without
    the ten temporary arrays `np.isclose` makes for a (B, h, T, T) tensor.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype.kind != "f" or expected.dtype.kind != "f" \
            or not np.isfinite(expected).all():
        return bool(np.allclose(actual, expected, atol=atol, rtol=rtol, equal_nan=True))
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.less_equal(np.abs(actual - expected), atol + rtol * np.abs(expected)).all())


def equal(a: np.ndarray, b: np.ndarray) -> bool:
    """`np.array_equal(a, b, equal_nan=True)`: one comparison when every value is equal
    (the common case), NumPy's own NaN-aware comparison only when one is not."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape == b.shape and a.dtype.kind in "biuf" and b.dtype.kind in "biuf" \
            and bool(np.equal(a, b).all()):
        return True
    return bool(np.array_equal(a, b, equal_nan=True))


def finite_std(values: np.ndarray) -> float | None:
    """The sample standard deviation (ddof=1) of values' finite entries, in float64: the
    same number, bit for bit, as `values[np.isfinite(values)].astype(np.float64).std(ddof=1)`
    (None when fewer than two are finite).

    NumPy sums a contiguous float64 array pairwise, halving it (at a multiple of 8) down to
    blocks of 128. The same halving is done here down to pieces of 2**16, and each piece is
    converted to float64 and summed by NumPy: the same additions in the same order, without
    a float64 copy of the whole tensor (at C 768, T 512 the scores are 3 M values).
    """
    flat = np.asarray(values).reshape(-1)
    finite = np.isfinite(flat)
    if not finite.all():
        flat = flat[finite]
    n = int(flat.size)
    if n < 2:
        return None
    mean = _pairwise(flat, 0, n) / n
    return float(np.sqrt(_pairwise(flat, 0, n, mean) / (n - 1)))


_PIECE = 1 << 16


def _pairwise(flat: np.ndarray, start: int, n: int, mean: float | None = None) -> float:
    """Σ x (or Σ (x - mean)² when mean is given) over flat[start:start + n], in float64,
    added up as NumPy's pairwise summation of the whole float64 array adds it."""
    if n <= _PIECE:
        piece = flat[start:start + n].astype(np.float64)
        if mean is not None:
            piece -= mean
            np.multiply(piece, piece, out=piece)
        return piece.sum()
    half = n // 2
    half -= half % 8
    return _pairwise(flat, start, half, mean) + _pairwise(flat, start + half, n - half, mean)


def recomputed_agrees(compute: Callable[..., np.ndarray], operands: Sequence[np.ndarray],
                      recorded: np.ndarray, *, atol: float = ATOL, rtol: float = RTOL) -> bool:
    """Whether `compute(*operands)` equals the recorded result (`allclose`).

    Computed first at the operands' own precision (float32 at least): the tolerance is
    float32's, so agreement there proves the claim, at half the cost of float64 copies
    (more than the forward itself at C 768, T 512). Only a miss is recomputed in float64,
    so a ✗ is what the float64 recomputation says, as before.
    """
    precision = np.result_type(*operands, np.float32)
    first = compute(*(np.asarray(o).astype(precision, copy=False) for o in operands))
    if allclose(first, recorded, atol=atol, rtol=rtol):
        return True
    if precision == np.float64:
        return False
    return allclose(compute(*(f64(o) for o in operands)), recorded, atol=atol, rtol=rtol)


def blocked(values: np.ndarray) -> np.ndarray:
    """Entries softmax will give weight 0: -inf or a very large negative number."""
    values = f64(values)
    return np.isneginf(values) | (values <= LARGE_NEGATIVE)


def causal_set(T: int) -> np.ndarray:
    """(T, T) True where query i may not look at key j (j > i)."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def blocked_set(T: int, causal: bool, window: int | None = None) -> np.ndarray:
    """(T, T) True where query i may not look at key j: the future when causal, and with a
    sliding window of w, every key more than w - 1 tokens back."""
    found = causal_set(T) if causal else np.zeros((T, T), dtype=bool)
    if window is not None:
        found |= np.tril(np.ones((T, T), dtype=bool), k=-window)
    return found


def blocked_pattern(values: np.ndarray) -> np.ndarray | None:
    """The blocked (T, T) pattern of a (..., T, T) tensor if it is the same in every head."""
    b = blocked(values)
    if b.ndim < 2:
        return None
    flat = b.reshape(-1, *b.shape[-2:])
    return flat[0] if all(np.array_equal(f, flat[0]) for f in flat) else None




def linear_parts(g: Graph, op: OpRecord) -> tuple[Ref, np.ndarray, np.ndarray | None] | None:
    """(input, weight as (out, in), bias) of a projection op, from its recorded arguments."""
    x = g.x_inputs(op)
    if len(x) != 1:
        return None
    others = [r for r in op.inputs if not g.is_x(r)]
    mats = [r for r in others if g.snap(r).ndim == 2]
    vecs = [r for r in others if g.snap(r).ndim == 1]
    if not mats and op.name == "einsum":
        return _head_axis_einsum(g, op, x[0], others)
    if len(mats) != 1:
        return None
    w = f64(g.snap(mats[0]).values)
    bias = f64(g.snap(vecs[0]).values) if vecs else None
    if op.name == "linear":
        return x[0], w, bias
    if op.name == "addmm" or op.name in ("matmul", "mm"):
        operands = g.tensor_operands(op)
        if op.name == "addmm" and operands and operands[0] is not x[0] and len(operands) == 3:
            return (x[0], w.T, bias) if operands[1] is x[0] else None
        return (x[0], w.T, None) if operands and operands[0] is x[0] else None
    if op.name == "einsum":
        spec = einsum_spec(op)
        operands = g.tensor_operands(op)
        if spec is None or len(operands) != 2:
            return None
        ins, _ = spec
        w_letters = ins[operands.index(mats[0])] if mats[0] in operands else ""
        x_letters = ins[operands.index(x[0])] if x[0] in operands else ""
        if len(w_letters) != 2 or not x_letters:
            return None
        contracted = x_letters[-1]
        if w_letters[0] == contracted:
            return x[0], w.T, None
        if w_letters[1] == contracted:
            return x[0], w, None
    return None


def head_axis_product(g: Graph, op: OpRecord) -> bool:
    """x einsum'd with a 3-D weight parameter (a head axis: TransformerLens' W_Q, W_O)."""
    return op.name == "einsum" and any(r.kind == "param" and g.snap(r).ndim == 3
                                       for r in op.inputs)


def added_bias(g: Graph, op: OpRecord) -> tuple[OpRecord, Ref] | None:
    """The add that puts a bias parameter on a weight product's output, written apart
    (`x @ self.W_q + self.b_q`, TransformerLens' `einsum(...) + self.b_Q` with b_Q of shape
    (h, d_h)): (the add, the bias), or None. The bias is a parameter whose shape is the
    product output's trailing axes, so it adds the same number to every token."""
    shape = op.out.shape
    for later in (g.ops[i] for i in g.consumers.get(op.index, ())):
        if later.name not in ("add", "add_") or len(later.inputs) != 2:
            continue
        refs = list(later.inputs)
        if not any(r.kind == "op" and r.op == op.index and r.output == 0 for r in refs):
            continue
        bias = [r for r in refs if r.kind == "param"]
        if not bias:
            return None
        held = tuple(g.snap(bias[0]).shape)
        if 0 < len(held) < len(shape) and held == tuple(shape[len(shape) - len(held):]):
            return later, bias[0]
        return None
    return None


def head_axis_bias(g: Graph, op: OpRecord) -> np.ndarray | None:
    """The bias added to a head-axis product's output (b_Q of shape (h, d_h), b_O of (C,)),
    flattened as the product's Linear layout has it, or None."""
    found = added_bias(g, op)
    return None if found is None else f64(g.snap(found[1]).values).reshape(-1)


def _head_axis_einsum(g: Graph, op: OpRecord, x: Ref, others: list[Ref]
                      ) -> tuple[Ref, np.ndarray, np.ndarray | None] | None:
    """An einsum with a head-axis weight parameter (TransformerLens' and ARENA's W_Q of shape
    (h, C, d_h) or (C, h, d_h), W_O of shape (h, d_h, C)), as nn.Linear's (out, in) weight on
    the flattened axes: `bpd,hde->bphe` is a (h*d_h, C) layer whose output rows go head by
    head, `bphe,hed->bpd` a (C, h*d_h) layer reading the heads in z's order. None unless the
    summed letters are x's trailing ones and the weight's kept letters the output's trailing
    ones, in order (so the flattening is exactly a Linear's)."""
    spec, operands = einsum_spec(op), g.tensor_operands(op)
    params = [r for r in others if r.kind == "param" and g.snap(r).ndim == 3]
    if spec is None or len(operands) != 2 or len(params) != 1 or params[0] not in operands \
            or x not in operands:
        return None
    ins, out = spec
    w_letters, x_letters = ins[operands.index(params[0])], ins[operands.index(x)]
    summed = "".join(c for c in x_letters if c in w_letters and c not in out)
    kept = "".join(c for c in out if c in w_letters and c not in x_letters)
    if len(set(w_letters)) != 3 or len(summed) + len(kept) != 3 or not summed or not kept \
            or not x_letters.endswith(summed) or not out.endswith(kept) \
            or any(c not in out for c in x_letters if c not in summed):
        return None
    w = f64(g.snap(params[0]).values)
    laid = np.einsum(f"{w_letters}->{kept}{summed}", w)
    n_out = int(np.prod(laid.shape[:len(kept)]))
    return x, laid.reshape(n_out, -1), None


def einsum_spec(op: OpRecord) -> tuple[list[str], str] | None:
    equation = op.args[0] if op.args and isinstance(op.args[0], str) else None
    if equation is None or "->" not in equation or "." in equation:
        return None
    lhs, out = equation.replace(" ", "").split("->")
    return lhs.split(","), out


def token_axes(op: OpRecord) -> tuple[int, int]:
    """The output axes of a scores product that hold its query and key tokens: the last two
    of a matmul's; an einsum's letters that only the first or only the second operand has
    (labml's sequence-first 'ibhd,jbhd->ijbh' puts them first, heads last)."""
    spec = einsum_spec(op) if op.name == "einsum" else None
    if spec is None or len(spec[0]) != 2:
        return -2, -1
    (la, lb), out = spec
    q_only = [c for c in out if c in la and c not in lb]
    k_only = [c for c in out if c in lb and c not in la]
    if len(q_only) != 1 or len(k_only) != 1:
        return -2, -1
    return out.index(q_only[0]), out.index(k_only[0])


def baddbmm_beta(op: OpRecord) -> float:
    """torch.baddbmm(input, b1, b2, beta=, alpha=)'s beta (1 unless given). With beta 0 torch
    ignores the input, NaN and inf included: diffusers hands it `torch.empty(...)`, whose
    bytes are whatever the memory held, so nothing may be read from it."""
    beta = op.kwarg("beta", 1.0)
    return float(beta) if isinstance(beta, int | float) else 1.0


def recompute(g: Graph, op: OpRecord) -> np.ndarray | None:
    """What a product op computes from its recorded inputs (NumPy, float64), or None."""
    operands = [f64(g.snap(r).values) for r in g.tensor_operands(op)]
    try:
        if op.name in ("matmul", "mm", "bmm") and len(operands) == 2:
            return operands[0] @ operands[1]
        if op.name == "baddbmm" and len(operands) == 3:
            beta = baddbmm_beta(op)
            alpha = op.kwarg("alpha", 1)
            alpha = float(alpha) if isinstance(alpha, int | float) else 1.0
            product = alpha * (operands[1] @ operands[2])
            # beta = 0: torch ignores the input (diffusers passes torch.empty: any bytes)
            return beta * operands[0] + product if beta else product
        if op.name == "einsum":
            spec = einsum_spec(op)
            if spec is None:
                return None
            return np.einsum(f"{','.join(spec[0])}->{spec[1]}", *operands)
        if op.name in ("linear", "addmm"):
            parts = linear_parts(g, op)
            if parts is None:
                return None
            x, w, b = parts
            return f64(g.snap(x).values) @ w.T + (0 if b is None else b)
    except ValueError:
        return None
    return None


def products_agree(g: Graph, ops: list[OpRecord]) -> tuple[bool, float]:
    """Whether every product op's recorded output equals what its recorded inputs give
    (`recompute`), and the largest difference; an op that cannot be recomputed is passed over,
    and no op at all is not agreement."""
    worst, ok = 0.0, bool(ops)
    for op in ops:
        expected = recompute(g, op)
        if expected is None:
            continue
        good, d = close(op.out.values, expected.reshape(op.out.shape))
        ok &= good
        worst = max(worst, d)
    return ok, worst


def ratio(after: np.ndarray, before: np.ndarray) -> float | None:
    """after / before where both are finite and before is not tiny; None if not one number."""
    if after.shape != before.shape:
        try:
            after, before = np.broadcast_arrays(after, before)
        except ValueError:
            return None
    usable = np.isfinite(after) & np.isfinite(before) & (np.abs(before) > 1e-6) & \
        (before > LARGE_NEGATIVE)
    if not usable.any():
        return None
    ratios = after[usable] / before[usable]
    r = float(np.median(ratios))
    return r


# ---------------------------------------------------------------------------- entry point


def zero_columns(weights: np.ndarray, visible: int) -> list[int]:
    """Columns 0..visible-1 of attention weights (..., T_q, T_k) that are exactly 0 in every
    row of every leading index: the keys a mask blocked for all queries (a decode step's
    one new query may see keys 0..t: one blocked there means the mask forgot the cache)."""
    values = np.asarray(weights)
    if values.ndim < 2 or not values.size:
        return []
    seen = values.reshape(-1, values.shape[-1])[:, :visible]
    return [int(j) for j in np.flatnonzero((seen == 0).all(axis=0))]
