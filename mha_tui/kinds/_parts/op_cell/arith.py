"""Elementwise and broadcast arithmetic, and products (matmul, bmm, linear, addmm, baddbmm,
einsum), for one output cell of a recorded op. Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import product

import numpy as np

from ....records import TensorArg
from ..cell import Term, Why, dot
from .reading import BINARY, UNARY, OpCell, Unknown, bracket, number, read_at
from .reduce import listed

# ---------------------------------------------------------------------- elementwise


def _operands(c: OpCell) -> tuple[str, list[object]]:
    """The op's formula (in a, b, ...) and its operands in order."""
    b = c.base
    if b in UNARY:
        return UNARY[b][0], [c.arg(0, "input")]
    if b in ("add", "sub", "rsub") and c.op.kwarg("alpha", 1) != 1:
        alpha = c.op.kwarg("alpha")
        return {"add": f"a + {alpha} × b", "sub": f"a - {alpha} × b", "rsub": f"b - {alpha} × a"}[b], \
            [c.arg(0, "input"), c.arg(1, "other")]
    if b == "pow" and len(c.op.args) < 2:
        return BINARY[b][0], [c.arg(0, "input", "self"), c.op.kwarg("exponent")]
    if b in BINARY:
        return BINARY[b][0], [c.arg(0, "input", "x1"), c.arg(1, "other", "x2")]
    raise Unknown(b)


def elementwise(c: OpCell) -> Why:
    b, numbers = c.base, {}
    terms, notes, names = [], [], []
    if b == "gelu":
        exact = c.op.kwarg("approximate", "none") == "none"
        formula = "a/2 × (1 + erf(a / √2))" if exact else "a/2 × (1 + tanh(√(2/π) × (a + 0.044715 a³)))"
        args = [c.arg(0, "input")]
    elif b in ("where", "masked_fill"):
        if b == "where":  # torch.where(cond, x, y) / np.where; x.where(cond, y)
            method = c.op.qualname.startswith("Tensor.")
            cond, x, y = ((c.arg(1, "condition"), c.arg(0), c.arg(2, "other")) if method
                          else (c.arg(0, "condition"), c.arg(1, "input", "x"), c.arg(2, "other", "y")))
        else:  # x.masked_fill(mask, value): the value where the mask is True
            cond, x, y = c.arg(1, "mask"), c.arg(2, "value"), c.arg(0)
        formula, args = "b if a else c", [cond, x, y]
    elif b in ("clamp", "clip", "clamp_min", "clamp_max"):
        low = c.arg(1, "min", "a_min") if b != "clamp_max" else None
        high = c.arg(2, "max", "a_max") if b == "clamp" or b == "clip" else (
            c.arg(1, "max") if b == "clamp_max" else None)
        args = [c.arg(0, "input", "a")] + [v for v in (low, high) if v is not None]
        formula = ("min(max(a, b), c)" if low is not None and high is not None
                   else "max(a, b)" if low is not None else "min(a, b)")
    else:
        formula, args = _operands(c)
    for letter, value in zip("abc", args, strict=False):
        values = c.array(value)
        at = read_at(values, c.index) if values.ndim else ()
        numbers[letter] = values[at] if values.ndim else values[()]
        name = c.name(value)
        names.append((letter, f"{name}{bracket(at)}" if values.ndim else name))
        if isinstance(value, TensorArg):
            terms.append(Term(f"{letter} = {name}{bracket(at)}", (), number(numbers[letter])))
            spread = [k for k, n in enumerate(values.shape) if n == 1 and
                      c.shape[len(c.shape) - values.ndim + k] > 1]
            if values.ndim < len(c.shape) or spread:
                notes.append(f"{name} has shape {values.shape}: broadcast to {c.shape}, this "
                             f"cell reads it at {bracket(at)}")
        else:
            terms.append(Term(f"{letter} = {name} (a number in the call)", (), number(numbers[letter])))
    computed = _compute(c, formula, numbers)
    if b in UNARY or b == "gelu":
        parts: tuple[float | str, ...] = (b, number(numbers["a"]))
    else:
        parts = tuple(number(numbers[p]) if p in numbers else p.strip()
                      for p in re.split(r"\b([abc])\b", formula) if p.strip())
    terms.append(Term(formula, parts, number(computed)))
    shown = formula
    for letter, text in names:
        shown = re.sub(rf"\b{letter}\b", text, shown)
    return c.why(f"{c.cell.name} = {shown}", terms, [f"{c.display}: computed by mha-tui from "
                                                     "the recorded inputs, in float64", *notes],
                 number(computed))


def _compute(c: OpCell, formula: str, n: dict[str, np.ndarray]) -> np.ndarray:
    a = n["a"] if np.iscomplexobj(n["a"]) else np.asarray(n["a"], dtype=np.float64)
    with np.errstate(all="ignore"):
        if c.base == "gelu":
            if c.op.kwarg("approximate", "none") == "none":
                return a / 2 * (1 + math.erf(float(a) / math.sqrt(2)))
            return a / 2 * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
        if c.base in ("where", "masked_fill"):
            return n["b"] if bool(n["a"]) else n["c"]
        if c.base in ("clamp", "clip", "clamp_min", "clamp_max"):
            bounds = [float(n[k]) for k in "bc" if k in n]
            if formula.startswith("min(max"):
                return np.minimum(np.maximum(a, bounds[0]), bounds[1])
            return np.maximum(a, bounds[0]) if formula.startswith("max") else np.minimum(a, bounds[0])
        if c.base in UNARY:
            return UNARY[c.base][1](a)
        b = n["b"] if np.iscomplexobj(n["b"]) else np.asarray(n["b"], dtype=np.float64)
        alpha = float(c.op.kwarg("alpha", 1))  # type: ignore[arg-type]
        if c.base == "div" and c.op.kwarg("rounding_mode") in ("trunc", "floor"):
            return (np.trunc if c.op.kwarg("rounding_mode") == "trunc" else np.floor)(a / b)
        if c.base in ("add", "sub"):
            return a + alpha * b if c.base == "add" else a - alpha * b
        if c.base == "rsub":
            return b - alpha * a
        return BINARY[c.base][1](a, b)


# ---------------------------------------------------------------------- products


@dataclass(frozen=True)
class Factors:
    """A product's output cell as a dot product of two recorded operands: the numbers each
    gives, one label per product, the formula's right-hand side. Kinds whose stage is a
    product (scores, attend, project, w_o) read it to explain their cells in their own words.

    at: each operand's index, ":" on the axes summed over; letters: each operand's einsum
    subscripts and the output's (None for matmul, mm, bmm, linear); positions: for each
    product, the values of the summed letters (einsum) or of the one summed axis."""

    a: np.ndarray
    b: np.ndarray
    labels: list[str]
    formula: str
    names: tuple[str, str]
    at: tuple[tuple[int | str, ...], tuple[int | str, ...]]
    letters: tuple[str, str, str] | None = None
    summed: tuple[str, ...] = ()
    positions: tuple[tuple[int, ...], ...] = ()
    extra: tuple[Term, ...] = ()


def products(c: OpCell) -> Why:
    b = c.base
    notes = [f"{c.display}: the products and their sum computed by mha-tui from the "
             "recorded inputs, in float64"]
    if b == "einsum" and _operand_count(c) != 2:
        return einsum(c, notes)
    if b in ("addmm", "baddbmm"):  # addmm(input, mat1, mat2), baddbmm(input, batch1, batch2)
        f, i = factors(c), c.index
        beta, alpha = float(c.op.kwarg("beta", 1)), float(c.op.kwarg("alpha", 1))  # type: ignore[arg-type]
        bias = c.arg(0, "input")
        base = c.array(bias)
        # beta 0: torch ignores the input (diffusers' torch.empty holds any bytes, NaN too)
        value = float(base[read_at(base, i)]) if beta else 0.0
        formula = (f"{beta:g} × {c.name(bias)}{bracket(read_at(base, i))} + " if beta else "") + \
            f"{alpha:g} × ({f.formula})"
        terms, more, total = dot(c.cell, f.a, f.b, f.labels, "products")
        total = beta * value + alpha * total
        added = (Term(f"+ {beta:g} × {c.name(bias)}{bracket(read_at(base, i))}", (beta, "×", value),
                      beta * value),) if beta else ()
        if not beta:
            notes = [*notes, f"beta = 0: torch ignores {c.name(bias)} (its bytes are not read)"]
        terms = (*terms[:-1], Term(f"{alpha:g} × the sum", (alpha, "×", terms[-1].value or 0.0),
                                   alpha * (terms[-1].value or 0.0)),
                 *added, Term("sum", (), total))
        return c.why(f"{c.cell.name} = {formula}", list(terms), [*notes, *more], total)
    f = factors(c)
    terms, more, total = dot(c.cell, f.a, f.b, f.labels, "products")
    if f.extra:
        total += sum(t.value or 0.0 for t in f.extra)
        terms = (*terms[:-1], *f.extra, Term("sum", (), total))
    return c.why(f"{c.cell.name} = {f.formula}", list(terms), [*notes, *more], total)


def _operand_count(c: OpCell) -> int:
    return len([a for a in c.op.args[1:] for a in (a if isinstance(a, tuple) else (a,))])


def factors(c: OpCell, names: tuple[str, str] | None = None) -> Factors:
    """The two factors whose products sum to the cell of a product op (matmul, mm, bmm,
    linear, addmm's and baddbmm's product, a two-operand einsum), read from the op's recorded
    inputs; `names`: how to call the two operands instead of by where they came from."""
    b, args, i = c.base, c.op.args, c.index
    if b == "einsum":
        return _einsum_factors(c, names)
    extra: tuple[Term, ...] = ()
    if b == "linear":
        x, w = c.array(args[0]), c.array(c.arg(1, "weight"))
        xn, wn = names or (c.name(args[0]), c.name(c.arg(1, "weight")))
        lead, o = i[:-1], i[-1]
        at_x = (*read_at(x[..., 0], lead), ":")
        row, col = x[read_at(x[..., 0], lead)], w[o]
        labels = [f"{xn}{bracket((*lead, k))} × {wn}{bracket((o, k))}" for k in range(len(row))]
        formula = f"{xn}{bracket((*lead, ':'))} · {wn}{bracket((o, ':'))}"
        bias = c.arg(2, "bias")
        if isinstance(bias, TensorArg):
            value = float(c.array(bias)[o])
            extra = (Term(f"+ {c.name(bias)}[{o}]", (), value),)
            formula += f" + {c.name(bias)}[{o}]"
        return Factors(row, col, labels, formula, (xn, wn), (at_x, (o, ":")),
                       positions=tuple((k,) for k in range(len(row))), extra=extra)
    if b in ("addmm", "baddbmm"):  # addmm(input, mat1, mat2), baddbmm(input, batch1, batch2)
        ka, kb = c.arg(1, "mat1", "batch1"), c.arg(2, "mat2", "batch2")
    else:
        ka, kb = c.arg(0, "input", "x1"), c.arg(1, "other", "x2")
    if b == "rmatmul":
        ka, kb = kb, ka
    a, m = c.array(ka), c.array(kb)
    an, mn = names or (c.name(ka), c.name(kb))
    a2, m2 = a.reshape(1, -1) if a.ndim == 1 else a, m.reshape(-1, 1) if m.ndim == 1 else m
    full = (*i[:-1], 0) if m.ndim == 1 else i  # a 1-d side gave no axis in the output
    full = (*full[:-1], 0, full[-1]) if a.ndim == 1 else full
    if a.ndim == 1 and m.ndim == 1:
        full = (0, 0)
    batch, r, col_k = full[:-2], full[-2], full[-1]
    at_a = (*read_at(a2[..., 0, 0], batch), r) if a2.ndim > 2 else (r,)
    at_m = (*read_at(m2[..., 0, 0], batch), slice(None), col_k) if m2.ndim > 2 else (slice(None), col_k)
    row, col = a2[at_a], m2[at_m]
    shown_a = at_a if a.ndim > 1 else ()
    shown_m = tuple(k for k in at_m if not isinstance(k, slice)) if m.ndim > 1 else ()
    labels = [f"{an}{bracket((*shown_a, k))} × {mn}{bracket((*shown_m[:-1], k, *shown_m[-1:]))}"
              for k in range(len(row))]
    formula = f"{an}{bracket((*shown_a, ':'))} · {mn}{bracket((*shown_m[:-1], ':', *shown_m[-1:]))}"
    return Factors(row, col, labels, formula, (an, mn),
                   ((*shown_a, ":"), (*shown_m[:-1], ":", *shown_m[-1:])),
                   positions=tuple((k,) for k in range(len(row))))


def _einsum_sum(c: OpCell, names: list[str] | None = None) -> _EinsumSum:
    """Each product of an einsum's sum at the cell: its factors, its label, the summed
    letters' values; `names`: how to call the operands instead of by where they came from."""
    equation = str(c.op.args[0]).replace(" ", "")
    refs = [a for a in c.op.args[1:] for a in (a if isinstance(a, tuple) else (a,))]
    arrays = [c.array(r) for r in refs]
    ins, _, out = equation.partition("->")
    terms_in = ins.split(",")
    if "..." in equation or len(terms_in) != len(arrays):
        raise Unknown("an einsum with ... or an operand count mha-tui cannot read")
    if "->" not in equation:
        out = "".join(sorted(ch for ch in set(ins) if ins.count(ch) == 1 and ch != ","))
    fixed = dict(zip(out, c.index, strict=True))
    sizes = {ch: n for term, a in zip(terms_in, arrays, strict=True)
             for ch, n in zip(term, a.shape, strict=True)}
    summed = sorted({ch for ch in ins if ch not in fixed and ch != ","})
    names = names or [c.name(r) for r in refs]
    factors_, labels, positions = [], [], []
    for combo in product(*(range(sizes[ch]) for ch in summed)):
        where_ = {**fixed, **dict(zip(summed, combo, strict=True))}
        at = [tuple(where_[ch] for ch in term) for term in terms_in]
        factors_.append([float(a[k]) for a, k in zip(arrays, at, strict=True)])
        labels.append(" × ".join(f"{n}{bracket(k)}" for n, k in zip(names, at, strict=True)))
        positions.append(combo)
    f = np.array(factors_, dtype=np.float64).reshape(len(factors_), len(arrays))
    formula = (f"Σ over {', '.join(summed) or 'nothing'} of "
               + " × ".join(f"{n}[{','.join(t)}]" for n, t in zip(names, terms_in, strict=True))
               + f"  (einsum {equation!r})")
    at_summed = tuple(tuple(":" if ch in summed else fixed[ch] for ch in term) for term in terms_in)
    return _EinsumSum(terms_in, out, tuple(summed), f, labels, tuple(positions), formula, names,
                      at_summed)


@dataclass(frozen=True)
class _EinsumSum:
    terms_in: list[str]
    out: str
    summed: tuple[str, ...]
    factors: np.ndarray  # (products, operands)
    labels: list[str]
    positions: tuple[tuple[int, ...], ...]
    formula: str
    names: list[str]
    at: tuple[tuple[int | str, ...], ...]


def _einsum_factors(c: OpCell, names: tuple[str, str] | None) -> Factors:
    s = _einsum_sum(c, list(names) if names else None)
    if len(s.terms_in) != 2:
        raise Unknown("an einsum of more than two operands is not one dot product")
    return Factors(s.factors[:, 0], s.factors[:, 1], s.labels, s.formula, (s.names[0], s.names[1]),
                   (s.at[0], s.at[1]), (s.terms_in[0], s.terms_in[1], s.out), s.summed,
                   s.positions)


def einsum(c: OpCell, notes: list[str]) -> Why:
    """An einsum of three or more operands: every product of its sum, listed."""
    s = _einsum_sum(c)
    terms, more, total = listed(np.prod(s.factors, axis=1), s.labels, "products", "sum")
    return c.why(f"{c.cell.name} = {s.formula}", terms, [*notes, *more], total)
