"""`check --decode N`: a module's KV-cache decoding judged step by step.

The module's full, uncached forward is judged against the reference as always (`judge`);
each decode step's output must then equal the same row of that forward (a correct cache
changes no number, only the work), and a second run, after the module's own reset, must
give the same steps again. Where a step departs, the classic mistakes are named at their
line, from what the step recorded: a cache concatenated on the wrong axis (the step raises
at the concatenation), a mask that ignores the cache's offset (the new token's weights are
0 on keys it may see), a rotary position that ignores it (the step rotates its new query
and key from a table sliced at the wrong place), a cache not emptied between runs (the
second run's step looks at more keys than the first's).

Plain data in, a Verdict out; never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from ..ops.numeric import zero_columns
from ..records import Stage, Trace
from ..records.verdict import Diagnosis, StageVerdict, Verdict

_CAT_SIZES = re.compile(r"Sizes of tensors must match except in dimension (-?\d+)")
# Ops that carry a mask or a rotary table from where the module keeps it to where it is used.
_SLICES = ("getitem",)


def _keys(step: Trace) -> int | None:
    """How many keys the step's new query looked at (its scores' last axis)."""
    scores = next((s for s in step.stages if s.kind == "scores"), None)
    if scores is None or not scores.tensors:
        return None
    return int(scores.tensors[-1].values.shape[-1])


def _stage(step: Trace, kind: str) -> Stage | None:
    return next((s for s in step.stages if s.kind == kind), None)


def _where(step: Trace, stage: Stage | None) -> tuple[str, int]:
    """The stage's line; for a mask or a rotary, the line that sliced its table from where
    the module keeps it (a buffer or a constant), which is where an offset goes."""
    if stage is None:
        return "", 0
    for op in stage.ops:
        if op.name in _SLICES and any(r.kind in ("buffer", "const", "param") or (
                r.kind == "op" and r.op is not None and step.recording is not None
                and step.recording.ops[r.op].name in ("bool", "to", "float")
                and step.recording.ops[r.op].inputs[:1]
                and step.recording.ops[r.op].inputs[0].kind in ("buffer", "const"))
                for r in op.inputs):
            return op.source.file, op.source.line
    if stage.source is None:
        return "", 0
    return stage.source.file, stage.source.line


def _blocked_visible(step: Trace) -> list[int]:
    """Keys 0..t the new token (position t) may see, yet whose weight is 0 in every head."""
    softmax = _stage(step, "softmax")
    if softmax is None or not softmax.tensors or step.step is None:
        return []
    weights = softmax.tensors[-1].values
    if weights.ndim < 2 or weights.shape[-2] != 1:
        return []
    return zero_columns(weights, step.step.position + 1)


def _rotary_position(rotary: Stage, t: int) -> int | None:
    """The position the step's rotary turned the new token for, read from its angle table
    (row 0: the new token; pair 0 turns by one radian per position in every base)."""
    from ..kinds.rotary.finding import turned_position

    angles = rotary.tensors[0].values if rotary.tensors else None
    if angles is None or angles.ndim != 2 or not angles.size:
        return None
    return turned_position(float(angles[0, 0]), 4 * t + 64)


def step_diagnosis(step: Trace) -> Diagnosis:
    """Why a decode step departs from the full forward's row: the mistake and its line."""
    info = step.step
    assert info is not None
    t, n = info.position, info.index + 1
    if step.failed:
        error = step.stages[-1]
        where = (error.source.file, error.source.line) if error.source else ("", 0)
        axis = _CAT_SIZES.search(error.explanation)
        if axis is not None:
            return Diagnosis("cache_axis", *where, (
                f"decode step {n}: the cache is concatenated on the wrong axis: the new token's "
                f"keys or values are joined to the cache along dimension {axis.group(1)}, but the "
                f"tokens run along another (the one whose sizes differ: {info.prefill + info.index} "
                f"cached, 1 new); torch: {error.explanation}"), error.id)
        return Diagnosis("decode_error", *where, (
            f"decode step {n} (the new token at position {t}) raised: {step.raised}"), error.id)
    blocked = _blocked_visible(step)
    if blocked:
        mask = _stage(step, "mask")
        shown = ", ".join(map(str, blocked[:8])) + (", ..." if len(blocked) > 8 else "")
        return Diagnosis("cache_mask_offset", *_where(step, mask or _stage(step, "softmax")), (
            f"decode step {n}: the mask ignores the cache's offset: the new token at position "
            f"{t} may look at keys 0..{t}, but keys {shown} are blocked, as if it stood at "
            f"position {t - len(blocked)}; the mask's rows must start at the {info.prefill + info.index} "
            "tokens the cache holds"), mask.id if mask else "")
    rotary = _stage(step, "rotary")
    if rotary is not None:
        used = _rotary_position(rotary, t)
        said = (f"they were rotated for position {used} instead" if used is not None else
                "they were rotated for no position from 0 to the cache's end")
        return Diagnosis("cache_rotary_offset", *_where(step, rotary), (
            f"decode step {n}: the rotary position ignores the cache's offset: the new token's "
            f"query and key must be rotated for position {t}, but {said}, so the step's output "
            f"is not row {t} of the full forward (max |difference| {info.max_diff:.3g}); the "
            f"rotary table must be read from position {t}"
            + (", not from 0" if used == 0 else "")), rotary.id)
    last = step.stages[-1] if step.stages else None
    return Diagnosis("decode_step", *_where(step, last), (
        f"decode step {n}'s output is not row {t} of the full forward (max |difference| "
        f"{info.max_diff:.3g}): the cache changes the numbers"), last.id if last else "")


def _row(step: Trace) -> StageVerdict:
    info = step.step
    assert info is not None
    last = step.stages[-1] if step.stages else None
    source = last.source if last is not None else None
    keys = _keys(step)
    against = f", against {keys} keys" if keys is not None else ""
    checked = (f"decode step {info.index + 1}: the new token at position {info.position}"
               f"{against}, equals row {info.position} of the full forward ({info.style})")
    return StageVerdict(f"step-{info.index + 1}", "decode", False if step.failed else info.equal,
                        info.max_diff, source.file if source else "", source.line if source else 0,
                        checked)


def decode_verdict(base: Verdict, steps: Sequence[Trace], again: Sequence[Trace] = (),
                   reset: tuple[str, int, str] | None = None, asked: int = 0) -> Verdict:
    """The full forward's verdict (`base`) with a row per decode step; equivalent only if
    every step equals its row and a second run gives the same steps. reset: the module's
    reset method (file, line, name), where a cache kept between runs is named."""
    rows = tuple(_row(step) for step in steps)
    diagnosis = base.diagnosis
    found: Diagnosis | None = None
    for step in steps:
        if step.failed or not (step.step and step.step.equal):
            found = step_diagnosis(step)
            break
    if found is None and len(steps) < asked:
        found = Diagnosis("decode_step", "", 0, f"only {len(steps)} of {asked} decode steps ran")
    if found is None and again:
        first, second = _keys(steps[0]), _keys(again[0])
        stale = second is not None and first is not None and second > first
        if stale or any(s.failed or not (s.step and s.step.equal) for s in again):
            file, line, name = reset or ("", 0, "")
            said = (f"{name}() at line {line} leaves them there" if name
                    else "the module has no reset_cache() to empty it")
            if stale:
                what = (f"a second run's first step looks at {second} keys, {first} expected: the "
                        f"cache still holds the first run's keys and values; {said}")
            else:
                what = (f"a second run, after the module's reset, does not give the first run's "
                        f"steps: the cache keeps something of the first run; {said}")
            if not name:
                cat = _where(again[0], _stage(again[0], "scores"))
                file, line = cat
            found = Diagnosis("cache_not_reset", file, line,
                              f"the cache is not emptied between runs: {what}", "step-1")
            rows = (*rows, StageVerdict("run-2", "decode", False, None, file, line,
                                        "a second run gives the same steps"))
    if found is not None and diagnosis is None:
        diagnosis = found
    ok = found is None
    return replace(base, equivalent=base.equivalent and ok, stages=(*base.stages, *rows),
                   diagnosis=diagnosis)
