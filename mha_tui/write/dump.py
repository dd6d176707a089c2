"""Write a trace as a transcript: text drawn by `render`, or strict JSON.

Deterministic: the same arguments give the same bytes on any terminal and in any locale
(a private Console with a fixed width and no environment). JSON is streamed tensor by
tensor into whatever `destination.opened` gives, which delivers it only once complete.
Never import textual or typer here.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import unicodedata
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
from rich.cells import cell_len
from rich.console import Console

from ..records import OpRecord, TensorRecord, Trace
from ..render.header import display_path, masking, module_line, trace_header
from ..render.options import ASCII_GLYPHS, RenderOptions
from ..render.stage import labelled, stage_view
from ..render.tensor import shown_dims
from ..render.why import why_view
from .floats import float32_json, numpy_texts

if TYPE_CHECKING:
    from ..config import Config
    from ..judge.compare import Comparison
    from ..quiz import Question
    from ..why import Why


def transcript_console(file: io.StringIO, width: int, color: bool) -> Console:
    """A Console that ignores the environment (TERM, COLUMNS, NO_COLOR, locale)."""
    # `_environ` is private: Rich has no public switch to stop reading os.environ, and the
    # explicit arguments below leave some variables (LINES) still read; {} closes them all.
    return Console(
        file=file, width=width, color_system="truecolor" if color else None,
        force_terminal=color, force_jupyter=False, force_interactive=False,
        legacy_windows=False, emoji=False, highlight=False, markup=False,
        soft_wrap=False, no_color=not color, _environ={},
    )


def to_text(trace: Trace, opts: RenderOptions, width: int = 100, color: bool = False,
            first: int = 0, last: int | None = None) -> str:
    """The text transcript of trace.stages[first:last]."""
    # Without colour, every line drawn is checked to fit instead of cropped line by line by
    # Rich (a fifth of the drawing of --full's 280,000 lines); where one does not fit, the
    # transcript is drawn again, cropped as Rich crops it.
    text = _drawn(trace, opts, width, color, first, last, crop=color)
    if not color and not _fits(text, width):
        text = _drawn(trace, opts, width, color, first, last, crop=True)
    # Rich pads table rows to the full width; trailing blanks only make diffs noisy.
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    if opts.ascii:
        # Labels were escaped already; this maps the tool's own glyphs and guards the rest.
        text = text.translate(ASCII_GLYPHS).encode("ascii", "backslashreplace").decode("ascii")
    return text


def _drawn(trace: Trace, opts: RenderOptions, width: int, color: bool, first: int,
           last: int | None, crop: bool) -> str:
    buffer = io.StringIO()
    console = transcript_console(buffer, width, color)
    for shown in trace.steps or (trace,):  # --decode: every step in turn, each its own walk-through
        console.print(trace_header(shown, opts), crop=crop)
        if shown.module is not None:
            console.print(module_line(shown.module, opts), crop=crop)
        console.print(crop=crop)
        for stage in shown.stages[first:last]:
            console.print(stage_view(shown, stage, opts), crop=crop)
    return buffer.getvalue()


def _fits(text: str, width: int) -> bool:
    """Every line of text (split where Rich splits them) at most width cells wide."""
    return all((len(line) <= width and line.isascii()) or cell_len(line) <= width
               for line in text.split("\n"))


def why_text(why: Why, opts: RenderOptions, width: int = 100, color: bool = False) -> str:
    """How one cell was made (`explain --why`), as the app's side panel draws it."""
    buffer = io.StringIO()
    console = transcript_console(buffer, width, color)
    console.print(why_view(why, opts))
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    if opts.ascii:
        text = text.translate(ASCII_GLYPHS).encode("ascii", "backslashreplace").decode("ascii")
    return text


def worksheet_text(trace: Trace, questions: tuple[Question, ...], opts: RenderOptions,
                   width: int = 100) -> str:
    """`explain --quiz --dump`: the run's header, the questions, then the answer key with
    where each answer comes from in the records."""
    from rich.text import Text

    from .quiz_view import worksheet_parts

    buffer = io.StringIO()
    console = transcript_console(buffer, width, False)
    console.print(Text("mha-tui quiz: questions about this forward pass, answered from its "
                       "own numbers", style="bold"))
    console.print(trace_header(trace, opts))
    if trace.module is not None:
        console.print(module_line(trace.module, opts))
    console.print()
    asked, key = worksheet_parts(questions)
    console.print(Text("Questions", style="bold"))
    console.print(asked if questions else Text("(no stage of this trace has a question yet)"))
    console.print()
    console.print(Text("Answer key", style="bold"))
    console.print(key)
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    if opts.ascii:
        text = text.translate(ASCII_GLYPHS).encode("ascii", "backslashreplace").decode("ascii")
    return text


def worksheet_json(trace: Trace, questions: tuple[Question, ...], ascii_only: bool = False) -> str:
    """The worksheet as strict JSON: the run, the questions, and the answer key."""

    def value(expected: object) -> object:
        if isinstance(expected, tuple):
            return list(expected)
        if isinstance(expected, float) and not np.isfinite(expected):
            return str(expected)  # "-inf": strict JSON has no infinities
        return expected

    tokens, keys = trace.config.tokens, trace.config.key_tokens
    document = {
        "worksheet": "mha-tui quiz",
        "config": trace.config.as_dict(),
        "module": None if trace.module is None else {
            "class": trace.module.class_name, "file": display_path(trace.module.file)},
        "questions": [{"number": n, "stage": q.stage, "asks": q.asks, "question": q.text,
                       "answer_type": q.answer, "how": q.how}
                      for n, q in enumerate(questions, 1)],
        "answers": [{"number": n, "answer": value(q.expected), "shown": q.shown,
                     "source": q.source,
                     **({"tokens": [words[t] for t in q.expected if 0 <= t < len(words)]}
                        if q.answer in ("token", "key") and isinstance(q.expected, tuple)
                        and (words := keys if q.answer == "key" else tokens) is not None
                        else {})}
                    for n, q in enumerate(questions, 1)],
    }
    return json.dumps(document, indent=2, ensure_ascii=ascii_only, allow_nan=False) + "\n"


_CHUNK = 1 << 16  # values formatted at a time by NumPy: a few MB of text whatever the tensor
_SLICE = 1 << 20  # float32 values formatted at a time by orjson: about 11 MB of text at most
_TEXT = 24  # widest number text: "-1.2345678e-05", "-0.000123456789", '"-inf"'


def _number_texts(chunk: np.ndarray, rows: np.ndarray) -> None:
    """Write a 1-D chunk's JSON texts into rows[:, :_TEXT] (zeroed), 0 bytes not part of them."""
    if chunk.dtype == np.bool_:
        text = np.where(chunk, "true", "false")
    else:  # ints, floats: NumPy's shortest round-trip text, per dtype
        text = numpy_texts(chunk)
    rows[:, :_TEXT] = text.astype(f"S{_TEXT}").view(np.uint8).reshape(len(chunk), _TEXT)


def write_values(values: np.ndarray, out: BinaryIO) -> None:
    """A tensor's values as nested JSON lists on one line, written a block at a time.

    Each float32 in its shortest form that reads back exactly (NumPy's), -inf/inf/nan as
    strings so that any JSON parser reads the file. Never builds the whole text: a tensor
    larger than a slice is written one slice of its first axis at a time.
    """
    if values.dtype == np.float32 and values.ndim >= 1 and values.size:
        if values.size > _SLICE and values.ndim > 1:  # (1, h, T, T) too: one slice at a time
            out.write(b"[")
            for i, part in enumerate(values):
                if i:
                    out.write(b",")
                write_values(part, out)
            out.write(b"]")
            return
        text = float32_json(values)
        if text is not None:
            out.write(text)
            return
    _write_rows(values, out)


def _write_rows(values: np.ndarray, out: BinaryIO) -> None:
    """Any array (bools, ints, float64, a 0-d or empty one) through NumPy's own text."""
    if values.size == 0:
        out.write(json.dumps(values.tolist(), separators=(",", ":")).encode("ascii"))
        return
    if values.ndim == 0:
        rows = np.zeros((1, _TEXT), dtype=np.uint8)
        _number_texts(values.reshape(1), rows)
        out.write(rows[rows != 0].tobytes())
        return
    shape, ndim, size = values.shape, values.ndim, values.size
    # Each text is followed by a comma; where axes end, "]" before it and "[" after it, one
    # per axis closed (the blocks are the products of trailing axis lengths).
    blocks = [int(np.prod(shape[d:])) for d in range(1, ndim)]
    comma = _TEXT + ndim
    out.write(b"[" * ndim)
    flat = values.reshape(-1)  # a copy only for a strided view, one tensor at most
    for start in range(0, size, _CHUNK):
        chunk = flat[start:start + _CHUNK]
        rows = np.zeros((len(chunk), _TEXT + 2 * ndim + 1), dtype=np.uint8)
        _number_texts(chunk, rows)
        rows[:, comma] = ord(",")
        following = np.arange(start + 1, start + 1 + len(chunk))
        for block in blocks:  # few rows end an axis: mark only those
            ends = np.flatnonzero(following % block == 0)
            closed = (rows[ends, _TEXT:comma] != 0).sum(axis=1)  # axes closed so far
            rows[ends, _TEXT + closed] = ord("]")
            rows[ends, comma + 1 + closed] = ord("[")
        if start + len(chunk) == size:  # the very end: every axis closes, nothing follows
            rows[-1, _TEXT:] = 0
            rows[-1, _TEXT:comma] = ord("]")
        out.write(rows[rows != 0].tobytes())


# What the text transcript makes visible (`render.text.printable`: controls, lone surrogates,
# format characters but ZWNJ/ZWJ and emoji tags), plus the line and paragraph separators:
# escaped in JSON as \uXXXX rather than written raw. JSON syntax outside strings is ASCII,
# so escaping these characters anywhere in the document only ever touches string contents.
_NON_ASCII = re.compile(r"[^\x00-\x7e]")
_KEEP_FORMAT = {0x200C, 0x200D}


def _json_escape(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    category = unicodedata.category(ch)
    if category in ("Cc", "Cs", "Zl", "Zp") or (
        category == "Cf" and code not in _KEEP_FORMAT and not 0xE0000 <= code <= 0xE007F
    ):
        if code > 0xFFFF:  # a surrogate pair, as JSON spells characters beyond the BMP
            code -= 0x10000
            return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
        return f"\\u{code:04x}"
    return ch


def _tensor_json(record: TensorRecord, tensors: list[np.ndarray], nonce: str,
                 config: Config | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "shape": list(record.shape),
        "dims": list(shown_dims(record.dims, config)),  # T_q beside T_k, as the text says
        "strides": list(record.strides),
        "stride_unit": record.stride_unit,
        "contiguous": record.contiguous,
    }
    if record.dtype:  # a half-precision module's: its numbers, exact in the float32 text
        data["dtype"] = record.dtype
    if record.shares_storage is not None:
        data["shares_storage_with_input"] = record.shares_storage
    data["values"] = f"{nonce}{len(tensors)}"
    tensors.append(record.values)
    return data


def _op_json(op: OpRecord) -> dict[str, Any]:
    """An op as the stage holds it: what ran, where, and what it made (values stay in tensors)."""
    return {
        "index": op.index, "op": op.name, "call": op.qualname, "module": op.module,
        "line": op.source.line, "file": display_path(op.source.file),
        "inputs": [ref.name or (f"op {ref.op}" if ref.kind == "op" else ref.kind) for ref in op.inputs],
        "shapes": [list(out.shape) for out in op.outputs],
        "in_place": op.in_place,
    }


def _document(trace: Trace, first: int, tensors: list[np.ndarray], nonce: str) -> dict[str, Any]:
    """The transcript's structure, each tensor's values a placeholder naming its index.
    `--decode`: the first step's, and every step's under "decode" (each with its stages)."""
    document = _one_document(trace, first, tensors, nonce)
    if trace.steps:
        document["decode"] = [_step_document(step, first, tensors, nonce) for step in trace.steps]
    return document


def _step_document(trace: Trace, first: int, tensors: list[np.ndarray], nonce: str) -> dict[str, Any]:
    step = trace.step
    assert step is not None
    shown = _one_document(trace, first, tensors, nonce)
    return {"step": step.index, "steps": step.steps, "position": step.position,
            "prefill": step.prefill, "token": trace.config.sentence, "cache": step.style,
            "equal_to_full_forward": step.equal, "max_diff": step.max_diff,
            "cache_bytes": step.cache_bytes, "cache_tokens": step.cache_tokens,
            "bytes_per_token": step.bytes_per_token,
            "config": shown["config"], "stages": shown["stages"]}


def _one_document(trace: Trace, first: int, tensors: list[np.ndarray], nonce: str) -> dict[str, Any]:
    return {
        "config": trace.config.as_dict(),
        "module": None if trace.module is None else {
            "class": trace.module.class_name, "file": display_path(trace.module.file),
            "per_head_modules": trace.module.per_head_modules,
            **({"weights": display_path(trace.module.weights)} if trace.module.weights else {})},
        # what the module did about masking, as the header says it (config.causal is the
        # flag asked for: cross-attention with no mask still has it true)
        "masking": masking(trace),
        "stages": [
            {
                "id": stage.id,
                "kind": stage.kind,
                "title": stage.title,
                "source": None if stage.source is None else {
                    "file": display_path(stage.source.file), "line": stage.source.line},
                "code": stage.code,
                "explanation": stage.explanation,
                "shape_in": list(stage.shape_in),
                "shape_out": list(stage.shape_out),
                "dims_in": list(shown_dims(stage.dims_in, trace.config)),
                "dims_out": list(shown_dims(stage.dims_out, trace.config)),
                "note": stage.note,
                "tensors": {r.name: _tensor_json(r, tensors, nonce, trace.config)
                            for r in stage.tensors},
                "aside": {r.name: _tensor_json(r, tensors, nonce, trace.config)
                          for r in stage.aside},
                "checks": [{"label": c.label, "ok": c.ok} for c in stage.checks],
                "ops": [_op_json(op) for op in stage.ops],
            }
            for stage in map(labelled, trace.stages[first:])
        ],
    }


class TranscriptError(Exception):
    """The JSON transcript could not be built; nothing has been written. One line."""


def write_json(trace: Trace, out: BinaryIO, *, first: int = 0, ascii_only: bool = False) -> None:
    """Readable structure (indented), compact values (one line per tensor), streamed into
    out tensor by tensor. `first`: the index of the first stage written.

    Each tensor's values stand in the skeleton as a placeholder string holding a random
    nonce; no user text (tokens, file names, source lines) can contain it. Every tensor has
    its own key (`render.stage.labelled`), so the skeleton holds exactly one placeholder per
    tensor; anything else raises TranscriptError before a byte is written.
    """
    nonce = f"@values-{secrets.token_hex(16)}-"
    tensors: list[np.ndarray] = []
    try:
        document = _document(trace, first, tensors, nonce)
    except (TypeError, ValueError) as error:  # a value JSON cannot hold: a bug, said in one line
        raise TranscriptError(f"could not build the JSON transcript: {error}") from error
    _stream(document, tensors, nonce, out, ascii_only)


def _stream(document: dict[str, Any], tensors: list[np.ndarray], nonce: str, out: BinaryIO,
            ascii_only: bool) -> None:
    """The skeleton (indented), each `nonce + i` placeholder replaced by tensor i's values."""
    try:
        skeleton = json.dumps(document, indent=1, ensure_ascii=ascii_only, allow_nan=False)
    except (TypeError, ValueError) as error:  # a value JSON cannot hold: a bug, said in one line
        raise TranscriptError(f"could not build the JSON transcript: {error}") from error
    found = skeleton.count(f'"{nonce}')
    if found != len(tensors):
        raise TranscriptError(f"could not build the JSON transcript: {len(tensors)} tensors "
                              f"but {found} in the document")
    if not ascii_only:
        skeleton = _NON_ASCII.sub(_json_escape, skeleton)
    parts = skeleton.split(f'"{nonce}')
    out.write(parts[0].encode("utf-8"))
    for part in parts[1:]:
        index, rest = part.split('"', 1)
        write_values(tensors[int(index)], out)
        out.write(rest.encode("utf-8"))
    out.write(b"\n")


def to_json(trace: Trace, *, first: int = 0, ascii_only: bool = False) -> str:
    """The JSON transcript as one string (tests, small traces); `write_json` streams it."""
    buffer = io.BytesIO()
    write_json(trace, buffer, first=first, ascii_only=ascii_only)
    return buffer.getvalue().decode("utf-8")


# ---------------------------------------------------------------- explain --against


def comparison_text(comparison: Comparison, opts: RenderOptions, width: int = 100,
                    color: bool = False) -> str:
    """The comparison (`explain --against`) as text: the header, then every row."""
    from ..render.compare import comparison_header, row_view

    buffer = io.StringIO()
    console = transcript_console(buffer, width, color)
    console.print(trace_header(comparison.mine, opts))
    console.print(comparison_header(comparison, opts))
    console.print()
    for k in range(len(comparison.rows)):
        console.print(row_view(comparison, k, opts))
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    if opts.ascii:
        text = text.translate(ASCII_GLYPHS).encode("ascii", "backslashreplace").decode("ascii")
    return text


def _side(stage: Any) -> dict[str, Any] | None:
    if stage is None:
        return None
    return {"id": stage.id, "title": stage.title, "code": stage.code,
            "source": None if stage.source is None else {
                "file": display_path(stage.source.file), "line": stage.source.line}}


def _pair_json(pair: Any, tensors: list[np.ndarray], nonce: str) -> dict[str, Any]:
    def side(record: TensorRecord | None) -> dict[str, Any] | None:
        if record is None:
            return None
        return {"name": record.name, **_tensor_json(record, tensors, nonce)}

    data: dict[str, Any] = {"yours": side(pair.mine), "reference": side(pair.theirs),
                            "note": pair.note}
    if pair.diff is not None:
        data["difference"] = {
            "computed_by": "mha-tui",
            "max": float(pair.max_diff) if np.isfinite(pair.max_diff) else "inf",
            "at": list(pair.at),
            "cells_differing": pair.count,
            "one_side_not_a_number": [{"yours": m.yours, "reference": m.reference,
                                       "cells": m.count, "first": list(m.first)}
                                      for m in pair.mismatches],
            "differing": f"{nonce}{len(tensors)}",
        }
        tensors.append(pair.differs)
    return data


def write_comparison_json(comparison: Comparison, out: BinaryIO, *, ascii_only: bool = False
                          ) -> None:
    """The comparison as JSON: both modules, how the weights were copied, every row with
    both sides' tensors (their own values) and mha-tui's difference: the largest, where,
    and which cells differ (a boolean array in the learner's layout)."""
    from ..judge.compare import TOLERANCE

    c = comparison
    nonce = f"@values-{secrets.token_hex(16)}-"
    tensors: list[np.ndarray] = []

    def module(trace: Trace, shown: str) -> dict[str, Any]:
        return {"label": shown, "class": trace.module.class_name if trace.module else "",
                "file": display_path(trace.module.file) if trace.module else ""}

    document = {
        "config": c.mine.config.as_dict(),
        "yours": module(c.mine, c.mine_label),
        "reference": module(c.theirs, c.theirs_label),
        "weights_copied_by_role": list(c.weights),
        "tolerance": TOLERANCE,
        "parting": None if c.parting is None else {"row": c.parting, "kind": c.rows[c.parting].kind},
        "rows": [{"kind": row.kind, "status": row.status,
                  "yours": _side(row.mine), "reference": _side(row.theirs),
                  "tensors": [_pair_json(p, tensors, nonce) for p in row.tensors]}
                 for row in c.rows],
    }
    _stream(document, tensors, nonce, out, ascii_only)
