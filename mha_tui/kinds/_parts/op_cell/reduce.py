"""Reductions (sum, mean, max, softmax, var, norm ...) for one output cell of a recorded op.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from itertools import product

import numpy as np

from ..cell import MANY_TERMS, SHOWN_TERMS, Term, Why
from .reading import ALONG, OpCell, Unknown, bracket

# ---------------------------------------------------------------------- reductions


def listed(values: np.ndarray, labels: list[str], what: str, how: str
           ) -> tuple[list[Term], list[str], float]:
    """The values a reduction reads, one line each, or the largest and the rest on one line."""
    values = values.astype(np.float64)
    order = list(range(len(values)))
    notes: list[str] = []
    if len(values) > MANY_TERMS:
        key = (lambda k: -values[k]) if how == "max" else (lambda k: values[k]) if how == "min" \
            else (lambda k: -abs(values[k]))
        order = sorted(sorted(order, key=key)[:SHOWN_TERMS])
    terms = [Term(labels[k], (), float(values[k])) for k in order]
    rest = [k for k in range(len(values)) if k not in set(order)]
    if rest:
        if how == "sum":
            terms.append(Term(f"the other {len(rest)} {what}", (), float(values[rest].sum())))
        else:
            terms.append(Term(f"the other {len(rest)} {what}, each "
                              f"{'at most' if how == 'max' else 'at least'} the {how}", ()))
        notes.append(f"{len(values)} {what}: {SHOWN_TERMS} are shown"
                     + (", the other summed on one line" if how == "sum" else ""))
    return terms, notes, float(values.sum())


def reduction(c: OpCell) -> Why:
    b, x_arg = c.base, c.arg(0, "input", "a")
    x = c.array(x_arg).astype(np.float64)
    xn = c.name(x_arg)
    default_all = None if not c.op.qualname.endswith(".reduce") else 0
    if b in ("norm",):
        p, dim = c.arg(1, "p", default="fro"), c.arg(2, "dim")
        keep = c.arg(3, "keepdim", default=False)
    elif b in ("linalg_vector_norm", "vector_norm"):
        p, dim, keep = c.arg(1, "ord", default=2), c.arg(2, "dim"), c.arg(3, "keepdim", default=False)
    else:
        p = None
        dim = c.arg(1, "dim", "axis", default=default_all)
        keep = c.arg(2, "keepdim", "keepdims", default=False)
    axes = c.dims(dim, x.ndim) or tuple(range(x.ndim))
    if b in ALONG:
        at: list[object] = list(c.index)
        at[axes[0]] = slice(None)
    elif keep:
        at = [slice(None) if k in axes else v for k, v in enumerate(c.index)]
    else:
        rest = iter(c.index)
        at = [slice(None) if k in axes else next(rest) for k in range(x.ndim)]
    values = x[tuple(at)].ravel()
    positions = list(product(*(range(x.shape[k]) if isinstance(s, slice) else (s,)
                               for k, s in enumerate(at))))
    labels = [f"{xn}{bracket(k)}" for k in positions]
    shown = f"{xn}{bracket(tuple(':' if isinstance(s, slice) else s for s in at))}"
    notes = [f"{c.display} over dim {', '.join(map(str, axes))}: computed by mha-tui from "
             "the recorded input, in float64"]
    with np.errstate(all="ignore"):
        return _reduce(c, b, values, labels, shown, notes, p, positions, axes)


def _reduce(c: OpCell, b: str, values: np.ndarray, labels: list[str], shown: str,
            notes: list[str], p: object, positions: list[tuple[int, ...]],
            axes: tuple[int, ...]) -> Why:
    n, name = len(values), c.cell.name
    if b in ("max", "amax", "min", "amin", "argmax", "argmin"):
        how = "min" if "min" in b else "max"
        terms, more, _ = listed(values, labels, "values", how)
        best = int(np.argmin(values) if how == "min" else np.argmax(values))
        if b.startswith("arg") or c.out == 1:  # torch.max(x, dim) returns (values, indices)
            index = positions[best][axes[0]] if len(axes) == 1 else best
            terms.append(Term(f"where the {how} is: {labels[best]}", (), float(index)))
            return c.why(f"{name} = arg{how} of {shown}", terms, [*notes, *more], index)
        terms.append(Term(f"the {how}", (), float(values[best])))
        return c.why(f"{name} = {how} of {shown}", terms, [*notes, *more], float(values[best]))
    if b in ("sum", "mean", "prod"):
        if b == "prod":
            terms, more, _ = listed(values, labels, "values", "max")
            total = float(np.prod(values))
            terms.append(Term("their product", (), total))
            return c.why(f"{name} = Π {shown}", terms, [*notes, *more], total)
        terms, more, total = listed(values, labels, "values", "sum")
        terms.append(Term("sum", (), total))
        if b == "mean":
            terms.append(Term(f"sum / {n}", (total, "/", n), total / n))
        return c.why(f"{name} = {'Σ' if b == 'sum' else f'(1/{n}) Σ'} {shown}", terms,
                     [*notes, *more], total if b == "sum" else total / n)
    if b in ("var", "std"):
        ddof = (c.op.kwarg("ddof", 0) if c.numpy else c.op.kwarg("correction", None))
        if ddof is None:
            ddof = 1 if c.op.kwarg("unbiased", True) else 0
        mean = float(values.mean())
        squares = (values - mean) ** 2
        terms, more, total = listed(squares, [f"({t} - mean)²" for t in labels], "squares", "sum")
        var = total / (n - float(ddof))  # type: ignore[arg-type]
        terms = [Term(f"mean of the {n} values", (), mean), *terms, Term("Σ squares", (), total),
                 Term(f"Σ / ({n} - {ddof})", (total, "/", n - float(ddof)), var)]  # type: ignore[arg-type]
        if b == "std":
            terms.append(Term("√variance", ("√", var), math.sqrt(var)))
        return c.why(f"{name} = {'√' if b == 'std' else ''}Σ ({shown} - mean)² / ({n} - {ddof})",
                     terms, [*notes, *more], var if b == "var" else math.sqrt(var))
    if b in ("norm", "linalg_vector_norm", "vector_norm"):
        order = 2.0 if p in ("fro", None) else float(p)  # type: ignore[arg-type]
        powers = np.abs(values) ** order
        terms, more, total = listed(powers, [f"|{t}|^{order:g}" for t in labels], "powers", "sum")
        norm = total ** (1 / order)
        terms += [Term("Σ", (), total), Term(f"Σ^(1/{order:g})", (), norm)]
        return c.why(f"{name} = (Σ |{shown}|^{order:g})^(1/{order:g})", terms, [*notes, *more], norm)
    if b in ("softmax", "log_softmax", "logsumexp"):
        top = float(np.max(values))
        exps = np.exp(values - top)
        total = float(exps.sum())
        mine = labels.index(f"{shown.split('[')[0]}{bracket(c.index)}") if b != "logsumexp" else 0
        terms = [Term(f"exp({t} - max)", ("exp(", float(v), "-", top, ")"), float(e))
                 for t, v, e in zip(labels, values, exps, strict=True)]
        if n > MANY_TERMS:
            keep = sorted({mine, *np.argsort(-exps)[:SHOWN_TERMS - 1].tolist()})
            rest = [k for k in range(n) if k not in keep]
            terms = [terms[k] for k in keep] + [Term(f"the other {n - len(keep)} exps", (),
                                                     float(exps[rest].sum()))]
            notes.append(f"{n} values: the largest exps and this cell's are shown, the other summed")
        terms.append(Term("Σ exps", (), total))
        notes.append(f"max = {top:.6g} is subtracted first: the result is the same, exp cannot overflow")
        if b == "logsumexp":
            terms.append(Term("max + log Σ", (top, "+", math.log(total)), top + math.log(total)))
            return c.why(f"{name} = log Σ exp({shown})", terms, notes, top + math.log(total))
        if b == "log_softmax":
            value = float(values[mine]) - top - math.log(total)
            terms.append(Term("x - max - log Σ", (float(values[mine]), "-", top, "-",
                                                  math.log(total)), value))
            return c.why(f"{name} = {labels[mine]} - max - log Σ exp({shown} - max)", terms, notes, value)
        value = float(exps[mine]) / total
        terms.append(Term(f"exp({labels[mine]} - max) / Σ", (float(exps[mine]), "/", total), value))
        return c.why(f"{name} = exp({labels[mine]} - max) / Σ exp({shown} - max)", terms, notes, value)
    if b == "cumsum":
        upto = [k for k, q in enumerate(positions) if q <= tuple(c.index)]
        terms, more, total = listed(values[upto], [labels[k] for k in upto], "values", "sum")
        terms.append(Term("sum", (), total))
        return c.why(f"{name} = Σ {shown} up to this position", terms, [*notes, *more], total)
    raise Unknown(b)
