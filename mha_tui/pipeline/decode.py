"""`--decode N`: the last N tokens of the sentence generated one at a time against the
module's KV cache, each step its own Trace (`tracing.decode` records them), compared with the
same row of the full, uncached forward.

The Trace handed back is the first step's, holding every step's in `steps` (itself first):
the app moves between them, the transcripts draw each in turn.
Never import rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..records import Check, DecodeStep, Trace

if TYPE_CHECKING:
    from ..tracing.decode import RecordedDecode, RecordedStep

# Within float32 rounding: a decode step adds its products in another order than the full
# forward's row (one query against t keys, not T queries against T).
RTOL, ATOL = 1e-4, 1e-5


def step_trace(run: RecordedDecode, step: RecordedStep, index: int, steps: int) -> Trace:
    """One recorded step, recognised, with its place in the run and its comparison with the
    full forward said on its last stage."""
    import numpy as np

    from .recognition import recognised

    trace = recognised(step.recorded)
    recording = step.recorded.recording
    max_diff = equal = None
    if recording.output is not None and recording.error is None:
        out = recording.snapshot(recording.output).values  # (B, 1, C)
        got = np.asarray(out, dtype=np.float64).reshape(step.full_row.shape)
        want = step.full_row.astype(np.float64)
        max_diff = float(np.max(np.abs(got - want))) if got.size else 0.0
        equal = bool(np.allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True))
    info = DecodeStep(index=index, steps=steps, position=step.position, prefill=run.prefill,
                      style=run.style.words, full_row=step.full_row, max_diff=max_diff,
                      equal=equal, cache_bytes=step.cache_bytes, cache_tokens=step.cache_tokens,
                      cache_shapes=step.cache_shapes, cache_dtype=step.cache_dtype)
    stages = trace.stages
    if stages and not trace.failed:
        last = stages[-1]
        said = step_checks(info)
        stages = (*stages[:-1], replace(last, checks=(*last.checks, *said)))
    return replace(trace, stages=stages, step=info)


def step_checks(step: DecodeStep) -> tuple[Check, ...]:
    """What the last stage of a decode step says: equal to the full forward's row or not,
    and what the cache costs."""
    t = step.position
    checks = []
    if step.equal is not None:
        if step.equal:
            label = (f"decode step {step.index + 1}'s output equals row {t} of the full, uncached "
                     f"forward (max |difference| {step.max_diff:.1e})")
        else:
            label = (f"decode step {step.index + 1}'s output is NOT row {t} of the full, "
                     f"uncached forward: max |difference| {step.max_diff:.3g}")
        checks.append(Check(label, step.equal))
    if step.cache_bytes is not None and step.bytes_per_token is not None:
        shapes = ", ".join(str(s) for s in step.cache_shapes)
        checks.append(Check(
            f"the KV cache after this step: {len(step.cache_shapes)} tensors {shapes} "
            f"{step.cache_dtype} = {step.cache_bytes} bytes for room of {step.cache_tokens} tokens, "
            f"{step.bytes_per_token} bytes per token", None))
    return tuple(checks)


def decode_traces(run: RecordedDecode, steps: int) -> Trace:
    """Every step's Trace; the first holds them all."""
    traces = [step_trace(run, step, i, steps) for i, step in enumerate(run.steps)]
    first = traces[0]
    return replace(first, steps=(first, *traces[1:]))


def trace_decode(module: Any, x: Any, tokens: Sequence[str] | None, steps: int, *,
                 config: Config | None = None, embedding: Any = None, ids: Any = None) -> Trace:
    """The Python API's and the pipeline's decode run of a torch module on x (B, T, C)."""
    from ..config import config_for
    from ..tracing.decode import record_decode

    if x is None and embedding is not None and ids is not None:
        x = embedding(ids)
    config = config or config_for(module, tuple(x.shape), tokens)
    words = list(tokens) if tokens is not None else list(config.tokens)
    if len(words) != int(x.shape[-2]):
        words = [f"t{i}" for i in range(int(x.shape[-2]))]
    run = record_decode(module, x, words, steps, config=config, embedding=embedding, ids=ids)
    return decode_traces(run, steps)
