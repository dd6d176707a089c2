"""float32 values as JSON text, vectorised: NumPy's own shortest round-trip digits, faster.

`array.astype(str)` gives every float32 its shortest decimal that reads back exactly (Dragon4,
about 0.5 us a value); a GPT-2-sized transcript holds 21 million of them. This module finds
the same digits with a few NumPy passes over whole chunks and writes the characters
straight into a byte matrix. Each value goes through NumPy's own `astype(str)` instead
whenever the fast arithmetic cannot prove its answer (ties, values on a float32 rounding
boundary, far-out exponents, inf and nan), so the text is always byte-identical to NumPy's:
the fast path only ever chooses between answers it has checked exactly.

Why the check is exact: a candidate decimal m * 10**s (m < 10**10, |s| <= 22) is one
correctly rounded float64 operation away from its exact value; rounding that float64 to
float32 gives the exact decimal's float32 unless the float64 lands exactly on a float32
rounding midpoint, which is detected and sent to NumPy.

Pure NumPy: never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

_P10 = np.array([10.0**k for k in range(23)])  # exact in float64
_P10_INT = np.array([10**k for k in range(19)], dtype=np.int64)
# NumPy prints a float32 positionally in [1e-4, 1e6) and in scientific notation outside.
_POSITIONAL = (1e-4, 1e6)
_FAST = (1e-13, 1e13)  # where |s| stays within the exact powers of ten
WIDTH = 16  # widest fast-path text: "-0.000123456789" or "-999999.94"
_ZERO, _DOT, _MINUS, _PLUS, _E = 48, 46, 45, 43, 101
_MID_BITS = np.int64((1 << 29) - 1)  # float64 bits below float32's 24-bit significand
_MID = np.int64(1 << 28)


def _midpoint(v: np.ndarray) -> np.ndarray:
    """Whether float64 v lies exactly halfway between two float32s (normal range)."""
    return (v.view(np.int64) & _MID_BITS) == _MID


def _at_precision(a: np.ndarray, x: np.ndarray, E: np.ndarray, p: int):
    """The closest p-significant-digit decimal m * 10**s that reads back as x, if any.

    Returns (found, m, s, unsure), m as float64 holding an integer. a = |x| in float64,
    E = floor(log10(a)). unsure: the arithmetic could not decide; NumPy must.
    """
    s = E - (p - 1)
    power = _P10[np.abs(s)]  # exact: |s| <= 22 in the fast range
    down = s <= 0
    every = bool(down.all())  # the usual case: one operation instead of both and a select

    def times(value: np.ndarray, reverse: bool = False) -> np.ndarray:
        """value * 10**-s (or * 10**s when reverse), always one correctly rounded op."""
        mul, div = (value / power, value * power) if reverse else (value * power, value / power)
        return mul if every else np.where(down, mul, div)

    t = times(a)  # in [10**(p-1), 10**p) when E is right
    lo = np.floor(t)
    f = t - lo
    up = f >= 0.5
    near = lo + up
    # t carries at most half an ulp of error: only a near-tie could make "near" the far one.
    unsure = (t < _P10[p - 1]) | (t >= _P10[p]) | (np.abs(f - 0.5) <= t * 2.0**-50)
    v = times(near, reverse=True)
    # Rounding v to float32 is the exact decimal's rounding unless v is a midpoint.
    unsure |= _midpoint(v)
    found = v.astype(np.float32) == x
    miss = np.flatnonzero(~found)
    if miss.size:  # the other neighbour, only where the nearer one does not read back
        far = lo[miss] + ~up[miss]
        scale = power[miss]
        v = far / scale if every else np.where(down[miss], far / scale, far * scale)
        unsure[miss] |= _midpoint(v)
        found[miss] = v.astype(np.float32) == x[miss]
        near[miss] = far
    return found, near, s, unsure


def _shortest(a: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, s, unsure): x == float32(m * 10**s) with the fewest digits, m (float64 holding an
    integer) without trailing zeros."""
    E = np.floor(np.log10(a)).astype(np.int64)
    E -= a < _P10_SIGNED[E + 30]
    E += a >= _P10_SIGNED[E + 31]
    # Existence is monotone in p (a p-digit answer is also a (p+1)-digit one): start at 8,
    # where most float32s land, go up to 9 for the rest and down while shorter ones exist.
    found, m, s, unsure = _at_precision(a, x, E, 8)
    rest = np.flatnonzero(~found)
    if rest.size:
        ok, m9, s9, bad = _at_precision(a[rest], x[rest], E[rest], 9)
        unsure[rest] |= bad | ~ok
        m[rest], s[rest] = m9, s9
    shorter = np.flatnonzero(found)
    for p in range(7, 0, -1):
        if not shorter.size:
            break
        ok, mp, sp, bad = _at_precision(a[shorter], x[shorter], E[shorter], p)
        unsure[shorter] |= bad
        shorter = shorter[ok]
        m[shorter], s[shorter] = mp[ok], sp[ok]
    for _ in range(2):  # 10**p itself (a rounded-up 99..9) has a trailing zero or two
        tenth = np.floor(m / 10)  # np.fmod is ten times slower than this
        zeros = (m == tenth * 10) & (m != 0)
        m = np.where(zeros, tenth, m)
        s = s + zeros
    return m, s, unsure


# 10.0**k for k in -30..30: exact for k >= 0; for k < 0 within an ulp, which no float32
# comes close enough to for a comparison with it to go the wrong way.
_P10_SIGNED = np.array([10.0**k for k in range(-30, 31)])


def _digits(number: np.ndarray, count: int) -> np.ndarray:
    """(N, count) uint8 decimal digits of integers held exactly in float64 (< 2**50), least
    significant first. Float division by 10 is exact enough here: a quotient's error
    (< 2**-6) never reaches the nearest non-integer (a tenth away)."""
    out = np.empty((len(number), count), dtype=np.uint8)
    q = number
    for k in range(count):
        r = np.floor(q / 10)
        out[:, k] = q - r * 10
        q = r
    return out


def _count_digits(m: np.ndarray) -> np.ndarray:
    return 1 + (m[:, None] >= _P10[None, 1:11]).sum(axis=1)


def _table(group: int, strip: bool) -> np.ndarray:
    """Every group-digit number as little-endian uint32 words of its characters; `strip`
    leaves its leading zeros out (0 bytes) but keeps a lone "0"."""
    words = np.zeros(10**group, dtype="<u4")
    for i in range(10**group):
        text = f"{i:0{group}d}"
        if strip:
            text = (text.lstrip("0") or "0").rjust(group, "\0")
        words[i] = int.from_bytes(text.encode("latin-1"), "little")
    return words


_QUAD = _table(4, strip=False)
_TRIPLE = _table(3, strip=False)
_TRIPLE_STRIPPED = _table(3, strip=True)
_KEEP = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF, 0xFFFFFFFF], dtype="<u4")  # first k characters


def _positional(neg: np.ndarray, m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """`[-]int.frac` (at least one digit each side) as (N, 20) uint8 rows in fixed slots:
    sign, 6 integer digits right-aligned, dot, 12 fraction digits left-aligned; 0 marks an
    empty slot. Five 32-bit words a row, each from a table of digit groups.

    Every quantity is an integer below 2**53 held in float64; each floor of a quotient is
    exact because the quotient's rounding error (< 1e-11) is far below its distance to the
    next integer (>= 1e-8 for these sizes)."""
    frac_len = np.maximum(-s, 1)  # <= 12: positional values are >= 1e-4
    whole = m * _P10[s + frac_len]  # all the digits, as an integer < 1e10
    int_part = np.floor(whole / _P10[frac_len])  # < 1e6
    frac = (whole - int_part * _P10[frac_len]) * _P10[12 - frac_len]  # 12 digits, < 1e12
    words = np.empty((5, len(m)), dtype="<u4")
    int_high = np.floor(int_part / 1000)
    int_low = (int_part - int_high * 1000).astype(np.intp)
    big = int_part >= 1000
    words[0] = (neg * _MINUS).astype("<u4") | (_TRIPLE_STRIPPED[int_high.astype(np.intp)] << 8) * big
    words[1] = np.where(big, _TRIPLE[int_low], _TRIPLE_STRIPPED[int_low]) | (_DOT << 24)
    for q, divisor in enumerate((1e8, 1e4, 1.0)):
        group = np.floor(frac / divisor)
        frac -= group * divisor
        words[2 + q] = _QUAD[group.astype(np.intp)] & _KEEP[np.clip(frac_len - 4 * q, 0, 4)]
    return np.ascontiguousarray(words.T).view(np.uint8)


def _scientific_rows(neg: np.ndarray, m: np.ndarray, s: np.ndarray) -> np.ndarray:
    chars, _ = _scientific(neg, m, s)
    return chars


def _scientific(neg: np.ndarray, m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`[-]d[.ddd]e±XX` as (N, WIDTH) uint8 rows and lengths."""
    n = _count_digits(m)
    exp = s + n - 1
    digits = _digits(m, 10)
    cols = np.arange(WIDTH, dtype=np.int64)[None, :] - neg[:, None]
    nn = n[:, None]
    index = np.where(cols == 0, nn - 1, nn - cols)  # from the right of m
    chars = _ZERO + np.take_along_axis(digits, np.clip(index, 0, 9), axis=1)
    chars[(cols == 1) & (nn > 1)] = _DOT
    e_at = np.where(nn > 1, nn + 1, 1)  # after "d" or "d.ddd"
    ex = np.abs(exp)[:, None]
    chars = np.where(cols == e_at, _E, chars)
    chars = np.where(cols == e_at + 1, np.where(exp[:, None] < 0, _MINUS, _PLUS), chars)
    chars = np.where(cols == e_at + 2, _ZERO + ex // 10, chars)
    chars = np.where(cols == e_at + 3, _ZERO + ex % 10, chars).astype(np.uint8)
    chars[:, 0] = np.where(neg == 1, _MINUS, chars[:, 0])
    length = neg + e_at[:, 0] + 4
    chars[np.arange(WIDTH)[None, :] >= length[:, None]] = 0
    return chars, length


def float32_text(values: np.ndarray, out: np.ndarray, width: int = 24) -> None:
    """Write each float32 of a 1-D array as NumPy's `astype(str)` text, non-finite ones
    quoted ("-inf"), into the zeroed rows out[:, :width] (width >= 24), where 0 bytes are
    not part of the text: `out[out != 0]` is the texts one after another."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    count = len(x)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a = np.abs(x).astype(np.float64)
        neg = np.signbit(x).astype(np.int64)
        fast = (a >= _FAST[0]) & (a < _FAST[1])
        slow = ~fast & (a != 0)
        zero = np.flatnonzero(a == 0)
        if zero.size:  # "0.0" and "-0.0"
            out[zero, :20] = _positional(neg[zero], np.zeros(len(zero)),
                                         np.zeros(len(zero), np.int64))
        every = bool(fast.all())  # the usual chunk: no fancy indexing
        idx = np.arange(count) if every else np.flatnonzero(fast)
        if idx.size:
            m, s, unsure = _shortest(a if every else a[idx], np.abs(x if every else x[idx]))
            if unsure.any():
                slow[idx[unsure]] = True
                keep = ~unsure
                idx, m, s = idx[keep], m[keep], s[keep]
            positional = (a[idx] >= _POSITIONAL[0]) & (a[idx] < _POSITIONAL[1])
            if len(idx) == count and positional.all():  # the usual chunk: no fancy indexing
                out[:, :20] = _positional(neg, m, s)
            elif positional.any():
                rows = idx[positional]
                out[rows, :20] = _positional(neg[rows], m[positional], s[positional])
            rows = idx[~positional]
            if rows.size:
                out[rows, :WIDTH] = _scientific_rows(neg[rows], m[~positional], s[~positional])
    rows = np.flatnonzero(slow)
    if rows.size:  # NumPy's own text: nan, inf, far exponents, and anything unsure
        text = x[rows].astype(str)
        finite = np.isfinite(x[rows])
        text = np.where(finite, text, np.char.add(np.char.add('"', text), '"'))
        out[rows, :width] = text.astype(f"S{width}").view(np.uint8).reshape(len(rows), width)
