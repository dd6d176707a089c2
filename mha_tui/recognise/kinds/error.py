"""error: the line where the forward raised, after every stage that ran.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ...records import Check, Stage
from ..builder import BHTD, BTC, BTHD
from ..maker import StageMaker

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
        kind="error", source=source, ops=(),
    )
