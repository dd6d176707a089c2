"""Why this number, for a rotary stage's cell, and its quiz question."""


from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ...records import OpRecord, Stage, TensorRecord, Trace
from .._parts.cell import Cell, Term, Why, WhyError, maker, reindex, where
from .._parts.quizzing import Question, number_text
from .finding import KIND

# ---------------------------------------------------------------- why this number


_UNWRAP = {"flatten", "view_as_real", "reshape", "view", "type_as", "to", "float", "contiguous"}


def why(cell: Cell) -> Why:
    """A turned channel: x_c · cos + rot(x)_c · sin with the module's own recorded tables
    (rot(x)_c = −x of its partner for the first channel of a pair, +x for the second), or a
    pass-through channel read unchanged."""
    record, index = cell.record, cell.index
    before = _before(cell)
    if before.values.shape != record.values.shape:
        raise WhyError(f"cannot read {cell.name} against {before.name}: their shapes differ")
    x_full = before.values
    op, at = maker(cell)
    c = index[-1]
    recording = cell.trace.recording
    assert recording is not None  # maker found the op in the recording
    if op.name == "cat" and _halves(cell, op):
        return _why_halves(cell, op, at, x_full, before.name)
    if op.name == "cat":
        r = cell.operand(op, 0).shape[-1]
        if c >= r:
            computed = float(x_full[index])
            return Why(cell.stage.id, KIND, record.name, index, where(cell),
                       f"{cell.name} = {before.name}{_at(index)}",
                       (Term(f"{before.name}{_at(index)}", (), computed),),
                       (f"channel {c} is a pass-through channel: only the first r = {r} channels "
                        "of each head are turned (partial rotary); it is joined back unchanged "
                        "by the cat", "moved, not computed"), computed, cell.recorded)
        ref = op.inputs[0]
        if ref.kind != "op" or ref.op is None:
            raise WhyError(f"cannot follow {cell.name} to its rotation")
        op = recording.ops[ref.op]  # joined on the channel axis: the same index
    while op.name in _UNWRAP and op.inputs and op.inputs[0].kind == "op":
        inner = recording.ops[op.inputs[0].op]  # type: ignore[index]
        if inner.out.values.dtype.kind == "c" and op.name == "view_as_real":
            at = reindex(at, op.out.shape, (*inner.out.shape, 2))
        else:
            at = reindex(at, op.out.shape, inner.out.shape)
        op = inner
    if op.name == "cat" and _halves(cell, op):  # a partial rotary's turned part, in halves
        return _why_halves(cell, op, at, x_full, before.name)
    if op.name == "mul" and op.out.values.dtype.kind == "c":
        return _why_complex(cell, op, at, x_full)
    if op.name == "stack" and len(op.inputs) == 2 and at[-1] in (0, 1):
        return _why_stacked(cell, op, at, x_full)
    if op.name not in {"add", "add_"}:
        raise WhyError(f"cannot tell how {cell.name} was turned: it comes from {op.name}")
    return _why_real(cell, op, at, x_full)


def _before(cell: Cell) -> TensorRecord:
    """The tensor the cell's was turned from: the builder's pairs are (role before, role
    after), so the one before the cell's own (Q's for a Q cell, K's for a K cell)."""
    before = cell.record_before()
    if before is None:
        raise WhyError(f"cannot tell which tensor {cell.name} was turned from")
    return before


def _at(index: tuple[int, ...]) -> str:
    return f"[{', '.join(map(str, index))}]"


def _products(cell: Cell, op: OpRecord) -> list[tuple[np.ndarray, np.ndarray]]:
    """The add's two products, each as its two recorded operands broadcast to the output."""
    recording = cell.trace.recording
    assert recording is not None
    pairs = []
    for ref in op.inputs:
        mul = recording.ops[ref.op] if ref.kind == "op" and ref.op is not None else None
        if mul is None or mul.name not in {"mul", "mul_"} or len(mul.inputs) != 2:
            raise WhyError(f"the rotation's add in stage {cell.stage.id} is not of two products")
        pairs.append(tuple(np.broadcast_to(cell.operand(mul, k), op.out.shape) for k in (0, 1)))
    return pairs  # type: ignore[return-value]


def _why_real(cell: Cell, op: OpRecord, at: tuple[int, ...], x_full: np.ndarray) -> Why:
    r = op.out.shape[-1]
    x = x_full[..., :r].reshape(op.out.shape)
    first, second = _products(cell, op)
    # The product with x itself holds cos; the other holds rot(x) and sin.
    plain, turned = (first, second) if any(np.array_equal(v, x) for v in first) else (second, first)
    k = next((k for k in (0, 1) if np.array_equal(plain[k], x)), None)
    if k is None:
        raise WhyError(f"cannot find {cell.name}'s input among the rotation's products")
    cos = plain[1 - k]
    x1, x2 = x[..., : r // 2], x[..., r // 2:]
    half = np.concatenate([-x2, x1], axis=-1)
    interleaved = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    found = next(((pairing, j) for pairing, rot in (("half", half), ("interleaved", interleaved))
                  for j in (0, 1) if np.array_equal(turned[j], rot)), None)
    if found is None:
        raise WhyError(f"cannot tell which channels of {cell.name}'s head form its pairs")
    pairing, j = found
    sin = turned[1 - j]
    c = at[-1]
    if pairing == "half":
        pair, partner, sign = c % (r // 2), (c + r // 2) % r, -1.0 if c < r // 2 else 1.0
    else:
        pair, partner, sign = c // 2, c ^ 1, -1.0 if c % 2 == 0 else 1.0
    xc, xp = float(x[at]), float(x[(*at[:-1], partner)])
    cos_c, sin_c = float(cos[at]), float(sin[at])
    a, b = xc * cos_c, sign * xp * sin_c
    computed = a + b
    name = _before(cell).name
    t = _position(cell)
    angle = math.atan2(sin_c, cos_c)
    terms = (Term(f"{name}[.., {c}] × cos", (xc, "×", cos_c), a),
             Term(f"rot(x)[{c}] × sin, rot(x)[{c}] = {'−' if sign < 0 else '+'}{name}[.., {partner}]",
                  (sign * xp, "×", sin_c), b),
             Term("sum", (), computed))
    notes = (f"channel {c} is in pair {pair} with channel {partner} ("
             + ("half-split: channel i pairs with i + r/2" if pairing == "half" else
                "interleaved: channel 2i pairs with 2i + 1")
             + f"); the pair is turned by the angle atan2(sin, cos) = {angle:.6g} rad"
             + (f" at position {t}" if t is not None else ""),
             "cos and sin are the module's own recorded tables, read at this cell; rot(x) is "
             "the module's recorded rotate-half of x",)
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = x[{c}] · cos − x[{partner}] · sin" if sign < 0 else
               f"{cell.name} = x[{c}] · cos + x[{partner}] · sin",
               terms, notes, computed, cell.recorded)


def _why_complex(cell: Cell, op: OpRecord, at: tuple[int, ...], x_full: np.ndarray) -> Why:
    """view_as_complex(x) * freqs_cis: (a + ib)(cos + i sin), the real or the imaginary part."""
    *lead, part = at
    z = np.broadcast_to(cell.operand(op, 0), op.out.shape)
    w = np.broadcast_to(cell.operand(op, 1), op.out.shape)
    if z.dtype.kind != "c" or w.dtype.kind != "c":
        raise WhyError(f"cannot tell how {cell.name} was turned")
    zc, wc = complex(z[tuple(lead)]), complex(w[tuple(lead)])
    pair = lead[-1]
    a, b, cos_c, sin_c = zc.real, zc.imag, wc.real, wc.imag
    if part == 0:
        terms = (Term(f"x[{2 * pair}] × cos", (a, "×", cos_c), a * cos_c),
                 Term(f"−x[{2 * pair + 1}] × sin", (-b, "×", sin_c), -b * sin_c))
        computed = a * cos_c - b * sin_c
    else:
        terms = (Term(f"x[{2 * pair + 1}] × cos", (b, "×", cos_c), b * cos_c),
                 Term(f"x[{2 * pair}] × sin", (a, "×", sin_c), a * sin_c))
        computed = b * cos_c + a * sin_c
    t = _position(cell)
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {'Re' if part == 0 else 'Im'}((x[{2 * pair}] + i·x[{2 * pair + 1}])"
               f" × (cos + i·sin))", (*terms, Term("sum", (), computed)),
               (f"channels {2 * pair} and {2 * pair + 1} are pair {pair}, one complex number; "
                f"it is multiplied by the module's recorded freqs_cis, angle "
                f"{math.atan2(sin_c, cos_c):.6g} rad" + (f" at position {t}" if t is not None else ""),),
               computed, cell.recorded)


def _why_stacked(cell: Cell, op: OpRecord, at: tuple[int, ...], x_full: np.ndarray) -> Why:
    """gpt-fast's and torchtune's pairs `x.reshape(..., -1, 2)` turned one half at a time and
    stacked back: `stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1)`. The cell is part
    `at[-1]` of pair `at[-2]`: the recorded sub or add of two recorded products."""
    recording = cell.trace.recording
    assert recording is not None
    *lead, pair, part = at
    ref = op.inputs[part]
    combine = recording.ops[ref.op] if ref.kind == "op" and ref.op is not None else None
    if combine is None or combine.name not in {"add", "sub"} or len(combine.inputs) != 2:
        raise WhyError(f"cannot tell how {cell.name} was turned: part {part} of its pair is "
                       f"not a sum or difference of two products")
    muls = _combines(cell, combine)
    if muls is None:
        raise WhyError(f"the rotation's {combine.name} in stage {cell.stage.id} is not of "
                       "two products")
    terms, angle = _pair_terms(cell, combine, muls, (*lead, pair), x_full,
                               (2 * pair, 2 * pair + 1), 2 * pair + part,
                               lambda xc: f"x[{xc}]")
    computed = sum(term.value for term in terms)
    t = _position(cell)
    c = 2 * pair + part
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = x[{2 * pair}] · cos − x[{2 * pair + 1}] · sin" if part == 0 else
               f"{cell.name} = x[{2 * pair + 1}] · cos + x[{2 * pair}] · sin",
               (*terms, Term("sum", (), computed)),
               (f"channel {c} is in pair {pair} with channel {c ^ 1} (interleaved: the module "
                f"reshapes each head's channels to (..., {x_full.shape[-1] // 2}, 2) and stacks "
                f"the two turned halves back); the pair is turned by the angle atan2(sin, cos) = "
                f"{angle:.6g} rad" + (f" at position {t}" if t is not None else ""),
                "cos and sin are the module's own recorded tables, read at this cell; each "
                "product is the module's recorded operands, multiplied by mha-tui"),
               computed, cell.recorded)


def _combines(cell: Cell, ref_op: OpRecord) -> list[OpRecord] | None:
    """The two recorded products a rotation's sub or add combines (None: it is not one)."""
    recording = cell.trace.recording
    assert recording is not None
    if ref_op.name not in {"add", "sub"} or len(ref_op.inputs) != 2:
        return None
    muls = [recording.ops[r.op] if r.kind == "op" and r.op is not None else None
            for r in ref_op.inputs]
    if any(mul is None or mul.name not in {"mul", "mul_"} or len(mul.inputs) != 2
           for mul in muls):
        return None
    return muls  # type: ignore[return-value]


def _halves(cell: Cell, op: OpRecord) -> bool:
    """gpt-oss's `torch.cat((first_, second_), dim=-1)`: two halves of equal width, each a
    sum or difference of two products (a partial rotary's cat joins x's own channels)."""
    recording = cell.trace.recording
    if recording is None or len(op.inputs) != 2 or op.out.shape[-1] % 2:
        return False
    for k, ref in enumerate(op.inputs):
        part = recording.ops[ref.op] if ref.kind == "op" and ref.op is not None else None
        if part is None or cell.operand(op, k).shape[-1] != op.out.shape[-1] // 2 or \
                _combines(cell, part) is None:
            return False
    return True


def _why_halves(cell: Cell, op: OpRecord, at: tuple[int, ...], x_full: np.ndarray,
                name: str) -> Why:
    """gpt-oss's halves `torch.chunk(x, 2, dim=-1)`, turned one at a time and joined by a
    cat: `first_ = x1 * cos - x2 * sin`, `second_ = x2 * cos + x1 * sin`. The cell is channel
    `at[-1] % half` of half `at[-1] // half`: the recorded sub or add of two recorded
    products."""
    recording = cell.trace.recording
    assert recording is not None
    half = op.out.shape[-1] // 2
    *lead, c = at
    part, k = divmod(c, half)
    combine = recording.ops[op.inputs[part].op]  # type: ignore[index]
    muls = _combines(cell, combine)
    assert muls is not None  # _halves checked it
    terms, angle = _pair_terms(cell, combine, muls, (*lead, k), x_full, (k, k + half), c,
                               lambda xc: f"{name}[.., {xc}]")
    computed = sum(term.value for term in terms)
    partner = k + half if part == 0 else k
    t = _position(cell)
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = x[{c}] · cos − x[{partner}] · sin" if part == 0 else
               f"{cell.name} = x[{c}] · cos + x[{partner}] · sin",
               (*terms, Term("sum", (), computed)),
               (f"channel {c} is in pair {k} with channel {partner} (half-split: the module "
                f"chunks each head's {2 * half} channels into two halves, turns them, and joins "
                f"them back with a cat); the pair is turned by the angle atan2(sin, cos) = "
                f"{angle:.6g} rad" + (f" at position {t}" if t is not None else ""),
                "cos and sin are the module's own recorded tables, read at this cell; each "
                "product is the module's recorded operands, multiplied by mha-tui"),
               computed, cell.recorded)


def _pair_terms(cell: Cell, combine: OpRecord, muls: list[OpRecord], here: tuple[int, ...],
                x_full: np.ndarray, channels: tuple[int, ...], own: int,
                label: Callable[[int], str]) -> tuple[list[Term], float]:
    """The two recorded products a rotation's sub or add (`combine`) joins, read at `here`,
    as terms: in each, which operand is a channel of the pair (`channels` of the head tensor
    before rotary, `x_full`) and which the module's table, cos for the cell's `own` channel,
    sin for its partner's; and the angle atan2(sin, cos) the pair is turned by."""
    *lead, _ = here
    terms: list[Term] = []
    tables: dict[str, float] = {}
    for n, mul in enumerate(muls):
        a, b = (float(np.broadcast_to(cell.operand(mul, j), combine.out.shape)[here])
                for j in (0, 1))
        xc = _channel_in(x_full, lead, channels, a)
        x_value, table = (a, b) if xc is not None else (b, a)
        if xc is None:
            xc = _channel_in(x_full, lead, channels, b)
        if xc is None:
            raise WhyError(f"cannot find {cell.name}'s pair among the rotation's products")
        table_name = "cos" if xc == own else "sin"
        sign = -1.0 if combine.name == "sub" and n == 1 else 1.0
        terms.append(Term(f"{'−' if sign < 0 else ''}{label(xc)} × {table_name}",
                          (sign * x_value, "×", table), sign * x_value * table))
        tables[table_name] = table
    return terms, math.atan2(tables.get("sin", 0.0), tables.get("cos", 1.0))


def _channel_in(x_full: np.ndarray, lead: list[int], channels: tuple[int, ...],
                value: float) -> int | None:
    """Which of `channels` of the head tensor before rotary holds `value` at the cell's place
    (None: none, the operand is a table)."""
    if len(lead) != x_full.ndim - 1:
        return None
    return next((c for c in channels if c < x_full.shape[-1]
                 and float(x_full[(*lead, c)]) == value), None)


def _position(cell: Cell) -> int | None:
    """The token's position: its index on the T axis, after the cached tokens in a decode
    step."""
    dims = cell.record.dims
    return cell.index[dims.index("T")] + len(cell.trace.config.cached) if "T" in dims else None


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """How far pair 0 is turned at position 1: the angle table, from the module's own cos and
    sin."""
    angles = stage.tensors[0] if stage.tensors else None
    if angles is None or angles.values.ndim != 2 or angles.values.shape[0] < 2:
        return ()
    value = float(angles.values[1, 0])
    return (Question(stage.id, "angle", "By how many radians is pair 0 of Q and K turned at "
                     "position 1?", "number", value, number_text(value),
                     f"{angles.name}[1, 0]: atan2(sin, cos) of the module's own recorded tables "
                     "(computed by mha-tui)"),)

