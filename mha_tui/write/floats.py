"""float32 arrays as JSON text: NumPy's own `astype(str)` bytes, at orjson's speed.

A GPT-2-sized transcript holds 21 million float32s; NumPy's `astype(str)` (Dragon4) takes
about 0.5 us a value. orjson writes a float32 array as nested JSON lists with the same
shortest round-trip digits (ryu) some ten times faster, and where NumPy writes a float32
positionally (1e-4 <= |x| < 1e6, compared in float64, and zero) orjson writes the very same
text. Outside that range the two spell a number differently (`1e-05` against `0.00001`,
`-inf` against `null`): those values (in attention tensors -inf, and rare tiny or huge ones)
are written by orjson as nan, its `null`, the only value it spells so: the k-th `null` of
its text is the k-th of them in C order, and NumPy's own text goes there. The bytes are
always NumPy's: where the nulls and the values do not match one to one, `float32_json` says
so and the caller uses NumPy itself. A test compares the two on millions of values, every
bit pattern included.

Pure NumPy and orjson: never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np
import orjson

# Where NumPy prints a float32 positionally (1e-4 <= |x| < 1e6, compared in float64, and
# zero), and orjson prints it the same way, as bounds on the bits of |x| (the sign bit
# cleared: a float32's bits are ordered as its magnitude, inf and nan above every finite one).
_LOW = np.float32(1e-4)
if float(_LOW) < 1e-4:  # float32(1e-4) is just below it: NumPy writes "1e-04"
    _LOW = np.nextafter(_LOW, np.float32(1))
_LOW_BITS = int(_LOW.view(np.uint32))
_HIGH_BITS = int(np.float32(1e6).view(np.uint32))  # 1e6 is exact in float32
_INF_BITS = int(np.float32(np.inf).view(np.uint32))


def numpy_texts(values: np.ndarray) -> np.ndarray:
    """NumPy's `astype(str)` of each value, non-finite ones quoted ("-inf") for JSON."""
    text = values.astype(str)
    if values.dtype.kind == "f":
        finite = np.isfinite(values)
        text = np.where(finite, text, np.char.add(np.char.add('"', text), '"'))
    return text


def float32_json(values: np.ndarray) -> bytes | None:
    """A float32 array (ndim >= 1, not empty) as compact nested JSON lists, each value in
    NumPy's text; None where orjson's text cannot be mapped back one to one."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    magnitude = x.view(np.uint32) & np.uint32(0x7FFFFFFF)  # the bits of |x|
    # Outside [_LOW_BITS, _HIGH_BITS) (the subtraction wraps below it), and not zero.
    other = (magnitude - np.uint32(_LOW_BITS)) >= np.uint32(_HIGH_BITS - _LOW_BITS)
    other &= magnitude != 0
    if not other.any():  # the usual tensor: orjson's text is NumPy's
        return orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY)
    # One pass over the text, in C: each of them a nan in a copy, the text split at its nulls.
    y = x.copy()
    y[other] = np.nan
    parts = orjson.dumps(y, option=orjson.OPT_SERIALIZE_NUMPY).split(b"null")
    them = x[other]  # in C order, as the nulls come
    if len(parts) != len(them) + 1:
        return None  # not one null per value: never guess
    nonfinite = magnitude[other] >= _INF_BITS
    specials = them[nonfinite]
    if specials.size and any(test(specials).all()
                             for test in (np.isneginf, np.isposinf, np.isnan)):
        # the usual case, a mask's -inf (and a few tiny values): runs of it joined in C
        special = str(numpy_texts(specials[:1])[0]).encode("ascii")
        between = np.flatnonzero(~nonfinite).tolist()  # where another text goes
        texts = numpy_texts(them[~nonfinite]).tolist()
    else:
        special, between, texts = b"", range(len(them)), numpy_texts(them).tolist()
    out, done = [], 0
    for k, text in zip(between, texts, strict=True):  # the k-th null is this value
        out += [special.join(parts[done:k + 1]), text.encode("ascii")]
        done = k + 1
    out.append(special.join(parts[done:]))
    return b"".join(out)
