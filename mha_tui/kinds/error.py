"""error: the line where the forward raised, after every stage that ran. Its cells (the last
tensor recorded) are explained by the op that made them (op_cell), with what the failing line
consumed and the exception's own message.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace

from ..records import Check, OpRecord, Stage
from ._parts.builder import BHTD, BTC, BTHD
from ._parts.cell import Cell, Why, WhyError
from ._parts.maker import StageMaker
from ._parts.op_cell import explain, locate, tensor_name

KIND = "error"
RULES = ()  # not an op: added after the stages when the recording ends in an error


def build(m: StageMaker) -> Stage:
    err = m.rec.error
    assert err is not None
    source = err.source
    last = m.rec.ops[-1] if m.rec.ops else None
    tensors = []
    if last is not None:
        # An op on the failing line made its tensor, but the line never finished: the name
        # it would have been assigned to is not this tensor's. Say what made it instead.
        unfinished = source is not None and last.source.file == source.file and \
            source.line <= last.source.line <= max(source.line, source.end_line)
        name = f"{m.call_text(last)}, on the failing line" if unfinished else m.tensor_name(last)
        tensors.append(m.b.record(f"last recorded tensor: {name}", last.out,
                                     m.dims(last.out.shape, BHTD, BTHD, BTC)))
    return Stage(
        id="error", title=f"The forward raised {err.type}", code=source.text if source else "",
        explanation=err.message,
        shape_in=last.out.shape if last else (), shape_out=(), dims_in=tensors[0].dims if tensors else (),
        dims_out=(), tensors=tuple(tensors),
        checks=(Check(f"{err.type} at line {source.line if source else '?'}: every stage before "
                      f"this one ran; this line did not finish", False),),
        note="This is where the forward stopped: the message is torch's own.",
        kind="error", source=source, ops=(), raised=err.type,
    )


def why(cell: Cell) -> Why:
    """The last recorded tensor's cell, by the op that made it; then what the failing line
    consumed (each tensor, where it came from, its shape and layout) and what raised, with
    the exception's message as it was."""
    recording = cell.trace.recording
    if recording is None or recording.error is None or not recording.ops:
        raise WhyError(f"stage {cell.stage.id} keeps no recording of the ops before the error")
    err, source = recording.error, recording.error.source
    explained = explain(cell, *locate(cell, recording.ops[-1:]))
    line = f"line {source.line}" if source else "an unknown line"
    notes = [f"the forward raised {err.type} at {line}: {err.message}"]
    on_line = [op for op in recording.ops if source is not None and op.source.file == source.file
               and source.line <= op.source.line <= max(source.line, source.end_line)]
    if on_line:
        notes.append(f"the failing line ran {', '.join(op.name for op in on_line)} before the "
                     "call that raised, which recorded nothing; what those ops read:")
        notes += [_consumed(cell, op, k) for op in on_line for k in range(len(op.inputs))
                  if not _made_on(op.inputs[k].op, on_line)]
        notes.append(f"{on_line[-1].name} made this tensor, the last before the error: "
                     f"{_layout(on_line[-1], 0)}")
    else:
        notes.append("no op of the failing line finished before it raised; this is the last "
                     f"tensor recorded before it (by {recording.ops[-1].name} at line "
                     f"{recording.ops[-1].source.line}): {_layout(recording.ops[-1], 0)}")
    return replace(explained, notes=(*notes, *explained.notes))  # what raised first: the panel may cut


def _made_on(index: int | None, on_line: list[OpRecord]) -> bool:
    return index is not None and any(op.index == index for op in on_line)


def _consumed(cell: Cell, op: OpRecord, k: int) -> str:
    recording = cell.trace.recording
    assert recording is not None
    snap = recording.snapshot(op.inputs[k])
    return (f"  {op.name} read {tensor_name(cell, op, k)}: shape {tuple(snap.shape)}, strides "
            f"{tuple(snap.strides)}{'' if snap.contiguous else ', not contiguous'}")


def _layout(op: OpRecord, k: int) -> str:
    snap = op.outputs[k]
    return (f"shape {tuple(snap.shape)}, strides {tuple(snap.strides)}, "
            f"{'contiguous' if snap.contiguous else 'not contiguous'}"
            + (f", dtype {snap.dtype}" if snap.dtype != "float32" else ""))
