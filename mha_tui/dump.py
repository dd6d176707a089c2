"""Write a trace as a transcript: text drawn by `render`, or strict JSON.

Deterministic: the same arguments give the same bytes on any terminal and in any locale
(a private Console with a fixed width and no environment). A file is replaced only once
the whole transcript exists. Never import textual or typer here.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from .records import OpRecord, TensorRecord, Trace
from .render import ASCII_GLYPHS, RenderOptions, display_path, header, module_line, stage_view


def transcript_console(file: io.StringIO, width: int, color: bool) -> Console:
    """A Console that ignores the environment (TERM, COLUMNS, NO_COLOR, locale)."""
    return Console(
        file=file, width=width, color_system="truecolor" if color else None,
        force_terminal=color, force_jupyter=False, force_interactive=False,
        legacy_windows=False, emoji=False, highlight=False, markup=False,
        soft_wrap=False, no_color=not color, _environ={},
    )


def to_text(trace: Trace, opts: RenderOptions, width: int = 100, color: bool = False) -> str:
    buffer = io.StringIO()
    console = transcript_console(buffer, width, color)
    console.print(header(trace.config, opts, batched=trace.batched))
    if trace.module is not None:
        console.print(module_line(trace.module, opts))
    console.print()
    for stage in trace.stages:
        console.print(stage_view(trace, stage, opts))
    # Rich pads table rows to the full width; trailing blanks only make diffs noisy.
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    if opts.ascii:
        # Labels were escaped already; this maps the tool's own glyphs and guards the rest.
        text = text.translate(ASCII_GLYPHS).encode("ascii", "backslashreplace").decode("ascii")
    return text


def _values_json(values: np.ndarray) -> str:
    """Nested lists on one line, each float32 in its shortest form that reads back exactly;
    -inf/inf/nan as strings so that any JSON parser reads the file."""
    text = values.astype(str)  # NumPy's shortest round-tripping repr, per dtype, in C
    if values.dtype.kind == "f":
        finite = np.isfinite(values)
        if not finite.all():
            text = np.where(finite, text, np.char.add(np.char.add('"', text), '"'))

    def nest(block: np.ndarray) -> str:
        if block.ndim <= 1:
            return "[" + ",".join(block.reshape(-1).tolist()) + "]"
        return "[" + ",".join(nest(row) for row in block) + "]"

    return nest(text) if values.ndim else str(text)


def _tensor_json(record: TensorRecord, placeholders: dict[str, str], nonce: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "shape": list(record.shape),
        "dims": list(record.dims),
        "strides": list(record.strides),
        "stride_unit": record.stride_unit,
        "contiguous": record.contiguous,
    }
    if record.shares_storage is not None:
        data["shares_storage_with_input"] = record.shares_storage
    key = f"{nonce}{len(placeholders)}"
    placeholders[key] = _values_json(record.values)
    data["values"] = key
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


def to_json(trace: Trace) -> str:
    """Readable structure (indented), compact values (one line per tensor)."""
    placeholders: dict[str, str] = {}
    user_text = json.dumps(trace.config.as_dict(), ensure_ascii=False)
    nonce = "@values-"
    while nonce in user_text:  # the only user text in the document is the config
        nonce = f"@{secrets.token_hex(8)}-"
    document = {
        "config": trace.config.as_dict(),
        "module": None if trace.module is None else {
            "class": trace.module.class_name, "file": display_path(trace.module.file),
            "per_head_modules": trace.module.per_head_modules},
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
                "dims_in": list(stage.dims_in),
                "dims_out": list(stage.dims_out),
                "note": stage.note,
                "tensors": {r.name: _tensor_json(r, placeholders, nonce) for r in stage.tensors},
                "aside": {r.name: _tensor_json(r, placeholders, nonce) for r in stage.aside},
                "checks": [{"label": c.label, "ok": c.ok} for c in stage.checks],
                "ops": [_op_json(op) for op in stage.ops],
            }
            for stage in trace.stages
        ],
    }
    skeleton = json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False)
    parts = skeleton.split(f'"{nonce}')
    out = [parts[0]]
    for part in parts[1:]:
        index, rest = part.split('"', 1)
        out.append(placeholders[f"{nonce}{index}"])
        out.append(rest)
    return "".join(out) + "\n"


def check_writable(path: Path) -> str | None:
    """Why a transcript could not be written to path, before any work is done."""
    if path.is_dir():
        return f"--dump {path} is a directory; give a file name such as {path / 'transcript.txt'}"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"--dump {path}: the folder {parent} does not exist"
    unwritable = f"--dump {path} is not writable; choose another path or '-' for stdout"
    if path.exists() and not os.access(path, os.W_OK):
        return unwritable
    try:  # the real test (permission bits lie to root and on special file systems)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError:
        return unwritable
    return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, content: str) -> None:
    """Write next to the target, then rename over it: never a half-written file."""
    parent = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(content)
        # mkstemp makes 0600; a transcript gets the mode a plain open() would give it, or
        # keeps the mode of the file it replaces.
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
