"""float32 arrays as JSON text: NumPy's own `astype(str)` bytes, at orjson's speed.

A GPT-2-sized transcript holds 21 million float32s; NumPy's `astype(str)` (Dragon4) takes
about 0.5 us a value. orjson writes a float32 array as nested JSON lists with the same
shortest round-trip digits (ryu) some ten times faster, and where NumPy writes a float32
positionally (1e-4 <= |x| < 1e6, compared in float64, and zero) orjson writes the very same
text. Outside that range the two spell a number differently (`1e-05` against `0.00001`,
`-inf` against `null`): those values (in attention tensors -inf, and rare tiny or huge ones)
are found in orjson's text by their place (the k-th text between brackets and commas is the
k-th value in C order), checked by their spelling, and replaced with NumPy's own text.
The bytes are always NumPy's: where the replacements cannot be matched one to one,
`float32_json` says so and the caller uses NumPy itself. A test compares the two on
millions of values, every bit pattern included.

Pure NumPy and orjson: never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re

import numpy as np
import orjson

# Where NumPy prints a float32 positionally, and orjson prints it the same way.
_POSITIONAL = (1e-4, 1e6)
# A finite number as orjson spells it when NumPy would spell it otherwise: with an exponent,
# below 1e-4 written out ("0.0000..."; "0.0001" is the float32 just below 1e-4), or 1e6 and
# above written out (seven or more integer digits). orjson writes inf and nan as null.
_FINITE = rb"-?[0-9]+(?:\.[0-9]+)?e[-+]?[0-9]+|-?0\.0000[0-9]*|-?0\.0001|-?[0-9]{7,}(?:\.[0-9]*)?"
_OTHERWISE = re.compile(rb"null|" + _FINITE)


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
    text = orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY)
    with np.errstate(invalid="ignore"):
        a = np.abs(x.astype(np.float64))
        other = ~(((a >= _POSITIONAL[0]) & (a < _POSITIONAL[1])) | (a == 0))
    if not other.any():  # the usual tensor: orjson's text is NumPy's
        return text
    nonfinite = ~np.isfinite(x)
    spelled = other
    if nonfinite.any():
        specials = x[nonfinite]
        if any(test(specials).all() for test in (np.isneginf, np.isposinf, np.isnan)):
            # the usual case, a mask's -inf alone: one kind, one replace, in C
            text = text.replace(b"null", str(numpy_texts(specials[:1])[0]).encode("ascii"))
            spelled = other & ~nonfinite
    if not spelled.any():
        return text
    # Each value is the text between two of the brackets and commas, in C order: find those
    # bytes at once (a regex over the whole text took most of a large transcript's time).
    raw = np.frombuffer(text, dtype=np.uint8)
    marks = np.flatnonzero((raw == ord(",")) | (raw == ord("[")) | (raw == ord("]")))
    starts, ends = marks[:-1] + 1, marks[1:]
    filled = ends > starts
    starts, ends = starts[filled], ends[filled]
    if len(starts) != x.size:
        return None
    where = np.flatnonzero(spelled.reshape(-1))
    replacements = numpy_texts(x[spelled])  # in C order, as orjson wrote them
    out, done = [], 0
    for start, end, replacement in zip(starts[where].tolist(), ends[where].tolist(),
                                        replacements.tolist(), strict=True):
        if not _OTHERWISE.fullmatch(text, start, end):
            return None  # not a number orjson spells otherwise: never guess
        out += [text[done:start], replacement.encode("ascii")]
        done = end
    out.append(text[done:])
    return b"".join(out)
