"""The verdict on a whole module: every kind's judge() in the registry's order, the rows
sorted by stage, the first wrong one's diagnosis, the legitimate differences noticed, and the
end-to-end comparison with the reference module (run by the torch-knowing side, see Facts).

Never import torch, rich, textual or typer here, so the same judge serves a NumPy module.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..kinds._parts.grown import Grown, Part
from ..kinds._parts.judging import Judge, Row
from ..kinds.op import role as op_role
from ..kinds.registry import EXPECTED, FORWARD, KINDS
from ..kinds.rotary import scaled as rotary_scaled
from ..ops.numeric import (
    HALF,
    added_bias,
    close,
    computed_in,
    f64,
    head_axis_bias,
    head_axis_product,
    linear_parts,
    recorded_dtype,
)
from ..records import Ref, Stage, Trace
from ..records.verdict import (
    Diagnosis,
    Facts,
    Mechanism,
    Reference,
    RoleWeights,
    StageVerdict,
    Verdict,
)
from .numpy_reference import ROTARY_BASE, alibi_slopes, kv_heads, steps
from .track import departure, describe
from .whole import Finding, nan_origin, no_attention, output_shape


def judge(trace: Trace, facts: Facts, label: str = "") -> Verdict:
    """Judge every stage of a traced forward; see the module docstring."""
    if trace.recording is None:
        raise ValueError("judge() needs a trace that holds its recording")
    label = label or (trace.module.class_name if trace.module else trace.recording.module_class)
    dtype = recorded_dtype(trace.recording)
    with computed_in(dtype):  # `check --dtype bfloat16`: every check allows its rounding
        verdict = run(Judge(trace, facts, label))
    return replace(verdict, dtype=dtype) if dtype in HALF else verdict


def run(j: Judge) -> Verdict:
    rows: list[Row] = []
    for judged in (row for row in FORWARD if row.judge is not None):
        kind, named = judged.judged_as
        try:
            rows.extend(judged.judge(j))
        except Exception as error:  # a module no rule foresaw: say so, go on
            rows.append(j.row(None, kind, None, None,
                              f"not judged: mha-tui could not read this module's "
                              f"{named} ({type(error).__name__}: {error})",
                              position=len(j.trace.stages)))
    order = {stage.id: i for i, stage in enumerate(j.trace.stages)}
    for r in rows:
        if r.verdict.stage_id in order and not r.position:
            r.position = order[r.verdict.stage_id]
    claimed = {r.verdict.stage_id for r in rows if r.verdict.kind != "op" and r.verdict.stage_id}
    rows = [r for r in rows if r.verdict.kind != "op" or r.verdict.stage_id not in claimed]
    rows.sort(key=lambda r: r.position)
    _led(j, rows)
    crash = _crash(j)
    _notice_differences(j)
    verdicts = [r.verdict for r in rows]
    diagnosis = next((r.diagnosis or Diagnosis("wrong", r.verdict.file, r.verdict.line,
                                               f"{r.verdict.kind}: {r.verdict.checked} -- not so",
                                               r.verdict.kind)
                      for r in rows if r.verdict.ok is False), None)
    if crash is not None:
        verdicts.append(crash[0])
        diagnosis = diagnosis or crash[1]
    end = None
    if crash is None:
        end, diagnosis = _whole(j, diagnosis)
        diagnosis = _besides(j, diagnosis)
        diagnosis = _offered(j, diagnosis)
    # Equivalent only when the output equals the reference's end to end: a row that could
    # not be computed (ok None) is never a pass.
    equivalent = diagnosis is None and all(v.ok is not False for v in verdicts) and (
        end is not None and end.ok is True)
    return Verdict(j.label, equivalent, tuple(verdicts), diagnosis,
                   tuple(d for d in dict.fromkeys(j.differences) if d), end, j.grown,
                   compared_with=j.compared_with)


# The rows about how the heads are laid out, which a mechanism that lays them out its own way
# (differential attention's pairs of heads, 2 d_h values each) makes fail by design.
_HEAD_LAYOUT = {"split", "view", "transpose", "kv_repeat", "concat", "attend"}


def _led(j: Judge, rows: list[Row]) -> None:
    """With --expect for a mechanism that changes the heads' layout (a registry row that
    `leads`), the rows about the heads' layout are not judged on their own: the grown
    reference's end-to-end row judges them, and the mechanism's own rows name what is
    wrong or missing."""
    led = [row for row in KINDS if row.leads and row.expected in j.facts.mechanisms]
    if not led:
        return
    for r in rows:
        if r.verdict.kind in _HEAD_LAYOUT and r.verdict.ok is False:
            r.verdict = replace(r.verdict, ok=None, checked=(
                f"{r.verdict.checked} (not judged on its own: {led[0].kind} attention lays the "
                f"heads out its own way; the end-to-end row judges them)"))
            r.diagnosis = None


def _whole(j: Judge, diagnosis: Diagnosis | None) -> tuple[StageVerdict, Diagnosis | None]:
    """The whole forward, after its stages: is it attention at all, is its output x's shape,
    does it equal the reference end to end, and if not, where does it leave it; where NaN
    first appears. Returns the end-to-end row (always one) and the diagnosis."""
    rec = j.g.rec
    out_ref = rec.output
    last = j.g.ops[out_ref.op] if out_ref is not None and out_ref.kind == "op" \
        and out_ref.op is not None else None
    file, line = j.where(last.source if last is not None else None)
    found = no_attention(rec, j.g.x_names, j.facts.parameters)
    if found is not None:
        j.differences.clear()  # "equivalent" words about a module that does not attend
        return (StageVerdict("", "end_to_end", None, None, file, line,
                             "not compared: there is no attention to compare"),
                _diagnosis(found, file=rec.module_file))
    shape = output_shape(rec, j.g.x_names)
    if shape is not None:
        row = StageVerdict("", "end_to_end", False, None, file, line,
                           "output = the reference's, of x's shape (B, T, C)")
        return row, diagnosis or _diagnosis(shape)
    try:
        end, mismatch = _end_to_end(j)
    except Exception as error:  # no comparison: said, and never a pass
        end = StageVerdict("", "end_to_end", None, None, file, line,
                           f"not compared: the reference could not be computed "
                           f"({type(error).__name__}: {error})")
        mismatch = None
    nan = nan_origin(rec, j.g.x_names, j.h)
    if end.ok is None and diagnosis is None:
        diagnosis = Diagnosis("no_reference", end.file, end.line,
                              f"could not judge: {end.checked.removeprefix('not compared: ')}",
                              "end_to_end")
    if end.ok is False and diagnosis is None:
        diagnosis = _departure(j, end) or (
            _diagnosis(nan[0], "nan") if nan is not None else None) or mismatch
    elif end.ok is False and diagnosis is not None:
        # A stage judged against a tensor further back (the concat against the attend
        # op's output) blames itself for a line no rule placed in between: that line,
        # earlier in the forward, is the first wrong one.
        earlier = _departure(j, end)
        if earlier is not None and earlier.stage == "op" and earlier.file == diagnosis.file \
                and earlier.line < diagnosis.line:
            diagnosis = earlier
    if nan is not None and diagnosis is not None and nan[0].message not in diagnosis.message:
        finding = nan[0]
        nan_file, nan_line = j.where(finding.source)
        if (nan_file, nan_line) == (diagnosis.file, diagnosis.line):
            diagnosis = Diagnosis(diagnosis.kind, diagnosis.file, diagnosis.line,
                                  f"{diagnosis.message}; {finding.message}", diagnosis.stage)
    return end, diagnosis


def _diagnosis(found: Finding, stage: str = "", file: str = "") -> Diagnosis:
    """A finding about the whole forward (no attention, the output's shape) has no stage."""
    file = found.source.file if found.source is not None else file
    line = found.source.line if found.source is not None else 0
    return Diagnosis(found.kind, file, line, found.message, stage)


def _grows(j: Judge, weights: RoleWeights) -> bool:
    """Does the reference need growing beyond the plain (torch-side) module?"""
    f = j.facts
    return bool(f.rotary or f.window or f.alibi or f.mechanisms) or kv_heads(weights, j.h) != j.h


def _part(j: Judge, name: str) -> Part | None:
    """One named mechanism's share of the reference, read from the module's own stage."""
    grows = EXPECTED[name].reference
    try:
        return grows(j) if grows is not None else None
    except (ValueError, IndexError, TypeError):  # a module no layout foresaw: not grown
        return None


def _grown(j: Judge, names: tuple[str, ...]) -> Grown | None:
    """The named mechanisms (--expect softcap, ...) the reference grows, with the module's
    own parameters; None for none. A mechanism the module lacks is left out: its kind's
    judge names it missing."""
    parts = [(name, part) for name in names if (part := _part(j, name)) is not None]
    return Grown.of(parts) if parts else None


def _rotary_dims(j: Judge) -> list[int | None]:
    """The channels per head --expect rotary turns: all of an even d_h, else (odd d_h, or a
    partial rotary) as many as the module's own rotation turns (read from its rotary
    stage's angle table, one column per pair), else the largest even number."""
    found = [2 * stage.tensors[0].shape[-1] for stage in j.trace.stages
             if stage.kind == "rotary" and stage.tensors and len(stage.tensors[0].shape) == 2]
    dims: list[int | None] = [j.d_h] if j.d_h % 2 == 0 else []
    dims += [r for r in dict.fromkeys(found) if 2 <= r <= j.d_h and r not in dims]
    return dims or ([j.d_h - 1] if j.d_h > 2 else [])


def _described(j: Judge, weights: RoleWeights, kwargs: dict[str, object]) -> Reference:
    """What the reference computes (steps' keyword arguments `kwargs`; none: plain
    multi-head attention): each mechanism with its words and parameters, and the whole in
    words, as the verdict says it."""
    grown: list[Mechanism] = []
    if kwargs.get("rotary"):
        r = kwargs.get("rotary_dims") or j.d_h
        extent = "full" if r == j.d_h else f"partial: {r} of each head's {j.d_h} channels"
        pairs = "rotate_half" if kwargs["rotary"] == "half" else "interleaved pairs"
        other_way = ", turning the other way" if kwargs.get("rotary_sign") == -1 else ""
        base = float(kwargs.get("base", ROTARY_BASE))  # type: ignore[arg-type]
        parameters: list[tuple[str, object]] = [
            ("base", base), ("pairs", "rotate_half" if kwargs["rotary"] == "half" else
                             "interleaved"), ("channels", int(r)),  # type: ignore[call-overload]
            ("direction", -1 if kwargs.get("rotary_sign") == -1 else 1)]
        if kwargs.get("rotary_freq") is not None:
            found = rotary_scaled(j)
            other_way += f", {found.words()}" if found is not None else ""
            if found is not None:
                parameters.append(("scaling", found.parameters()))
        grown.append(Mechanism("rotary", f"rotary positions ({extent}, base {base:g}, "
                                         f"{pairs}{other_way})", tuple(parameters)))
    if kwargs.get("alibi"):
        slopes = alibi_slopes(j.h)
        shown = ", ".join(f"{m:.4g}" for m in slopes[:4])
        grown.append(Mechanism("alibi", f"ALiBi (slopes {shown}{', ...' if j.h > 4 else ''})",
                               (("slopes", [float(m) for m in slopes]),)))
    if kwargs.get("window"):
        grown.append(Mechanism("window", f"a sliding window of {kwargs['window']}",
                               (("size", int(kwargs["window"])),)))  # type: ignore[call-overload]
    h_kv = kv_heads(weights, j.h)
    if h_kv != j.h:
        grown.append(Mechanism(
            "shared_kv", "one K/V head shared by all query heads (multi-query, h_kv 1)"
            if h_kv == 1 else f"shared K/V heads (h_kv {h_kv})", (("h_kv", int(h_kv)),)))
    named = kwargs.get("grown")
    if isinstance(named, Grown):
        grown += [Mechanism(name, part.words, part.parameters()) for name, part in named.parts]
    mask = "causal" if j.facts.causal else "unmasked (bidirectional)"
    words = f"{mask} multi-head attention" + (
        f" with {' and '.join(m.words for m in grown)}" if grown else "")
    return Reference(words, j.facts.causal, tuple(grown))


def _reference(j: Judge, x: np.ndarray, weights: RoleWeights, got: np.ndarray
               ) -> tuple[np.ndarray, str, dict[str, object], Reference | None]:
    """The reference's output, its name, how it was grown (steps' keyword arguments) and
    what it computes (`_described`; None for plain multi-head attention).

    Plain attention is the torch-side reference module (Facts.reference); shared K/V heads
    (read from the K and V weights' shapes) and a mechanism the learner said they meant to
    build (--expect rotary / alibi, --window N) are grown into the NumPy reference
    (numpy_reference.steps); for rotary, the channel-pair layout (and, for a partial or odd
    d_h, the number of channels) that fits."""
    f = j.facts
    if not _grows(j, weights):
        assert f.reference is not None
        return f.reference(x, weights, j.h, f.causal), f.reference_name, {}, None
    common: dict[str, object] = {"window": f.window, "alibi": f.alibi,
                                 "grown": _grown(j, f.mechanisms),
                                 "padding": _padding(j)}
    tries: list[dict[str, object]] = [common]
    if f.rotary:
        grown_rope = rotary_scaled(j)
        if grown_rope is not None:  # Llama 3's / YaRN's rope_scaling: the module's frequencies
            common = {**common, "rotary_freq": grown_rope.omega,
                      "rotary_factor": grown_rope.attention}
        tries = [{**common, "rotary": layout, "rotary_dims": r, "base": f.rotary_base,
                  "rotary_sign": sign}
                 for r in _rotary_dims(j) for sign in (1, -1)
                 for layout in ("half", "interleaved")] or [common]
    named = common.get("grown")
    if isinstance(named, Grown) and named.differential is not None:  # which heads pair up
        tries = [{**t, "grown": replace(named, differential=replace(named.differential,
                                                                     pairs=pairs))}
                 for t in tries for pairs in ("adjacent", "halves")]
    best = None
    for kwargs in tries:
        out = steps(x, weights, j.h, f.causal, **kwargs)[-1].values  # type: ignore[arg-type]
        out = out if np.ndim(x) == 3 else out[0]
        d = close(got.reshape(out.shape), out)[1] if got.size == out.size else np.inf
        if best is None or d < best[0]:
            best = (d, out, kwargs)
    assert best is not None
    _, out, kwargs = best
    described = _described(j, weights, kwargs)
    return out, f"the NumPy reference ({described.words})", kwargs, described


def _padding(j: Judge) -> np.ndarray | None:
    """A padded batch's (B, T) padding (`--batch`), True = padding, for the NumPy reference
    to block those keys as the torch-side reference does; None without --batch."""
    return None if j.facts.padding is None else np.asarray(j.facts.padding, dtype=bool)


def _real_rows(j: Judge, got: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, str]:
    """A padded batch's output compared on its real tokens only: a padded query's row is
    never read for a real token's output, so whatever the module puts there (DeBERTa blocks
    those rows, giving the mean of every value) is its own choice, unless it is NaN (a row
    blocked with -inf: the next layer's 0 * NaN reaches the real tokens). Returns the output
    with the padded rows taken from the reference, and words when they differed."""
    pad = _padding(j)
    if pad is None or got.ndim < 2:
        return got, ""
    if got.shape[:2] == pad.shape:
        rows = pad
    elif got.shape[:2] == pad.T.shape:
        rows = pad.T
    else:
        return got, ""
    rows = rows.reshape(rows.shape + (1,) * (got.ndim - 2))
    same = np.broadcast_to(rows, got.shape)
    if close(got[same], expected[same])[0] or \
            (np.isnan(got[same]) & ~np.isnan(expected[same])).any():
        return got, ""
    return np.where(rows, expected, got), ("; the padded positions' own rows are not compared "
                                           "(no real token reads them: the module's own choice)")


def _mechanism(j: Judge, x: np.ndarray, weights: RoleWeights) -> str | None:
    """A known mechanism that explains the whole output: rotary positions, ALiBi."""
    got = f64(j.g.snap(j.g.rec.output).values) if j.g.rec.output is not None else None
    if got is None:
        return None
    f = j.facts
    tries: list[tuple[dict[str, object], str]] = []
    if not f.rotary:
        for r in _rotary_dims(j):
            extent = "full" if r == j.d_h else f"partial, {r} of {j.d_h} channels"
            for layout, pairs in (("half", "rotate_half"), ("interleaved", "interleaved pairs")):
                tries.append(({"rotary": layout, "rotary_dims": r},
                              f"rotary positions on Q and K ({extent}, base 10000, {pairs}): "
                              f"the output is attention with rotary positions, right for a "
                              f"rotary exercise (check --expect rotary); plain multi-head "
                              f"attention has no positions"))
    for kwargs, words in tries:
        out = steps(x, weights, j.h, f.causal, window=f.window, alibi=f.alibi,
                    padding=_padding(j), **kwargs)[-1].values  # type: ignore[arg-type]
        out = out if np.ndim(x) == 3 else out[0]
        if got.size == out.size and close(_real_rows(j, got.reshape(out.shape), out)[0], out)[0]:
            return words
    return None


def _inferred(j: Judge, x: np.ndarray, weights: RoleWeights, got: np.ndarray
              ) -> tuple[str, ...]:
    """The named mechanisms the module shows and the learner did not expect whose growth
    makes the output the reference's (with the expected ones): what `--expect` to pass."""
    f = j.facts
    shown = tuple(name for name, row in EXPECTED.items() if name not in f.mechanisms
                  and any(stage.kind == row.kind for stage in j.trace.stages))
    if not shown:
        return ()
    _, _, kwargs, _ = _reference(j, x, weights, got) if _grows(j, weights) else (
        None, None, {"window": f.window, "alibi": f.alibi, "padding": _padding(j)}, "")
    grown = _grown(j, tuple(n for n in EXPECTED if n in f.mechanisms or n in shown))
    if grown is None:
        return ()
    try:
        out = steps(x, weights, j.h, f.causal, **{**kwargs, "grown": grown})[-1].values  # type: ignore[arg-type]
    except (ValueError, IndexError, TypeError):
        return ()
    out = out if np.ndim(x) == 3 else out[0]
    if got.size == out.size and close(got.reshape(out.shape), out)[0]:
        return shown
    return ()


def _offered(j: Judge, diagnosis: Diagnosis | None) -> Diagnosis | None:
    """A NOT-equivalent verdict on a module with a named mechanism the learner did not
    expect, whose growth makes the output the reference's: the diagnosis says which
    `--expect` to pass (once)."""
    if diagnosis is None or "pass `--expect" in diagnosis.message or diagnosis.kind == "crash":
        return diagnosis
    try:
        weights = role_weights(j)
        x = next((snap.values for name, snap in j.g.rec.inputs if name in j.g.x_names), None)
        if weights is None or x is None or j.g.rec.output is None:
            return diagnosis
        got = f64(j.g.snap(j.g.rec.output).values)
        inferred = _inferred(j, np.asarray(x), weights, got)
    except (ValueError, IndexError, TypeError):  # a module no layout foresaw: said as it is
        return diagnosis
    if not inferred:
        return diagnosis
    return replace(diagnosis, message=f"{diagnosis.message}; {_hint(j, inferred)}")


def _hint(j: Judge, names: tuple[str, ...]) -> str:
    """The options that make the inferred mechanisms the exercise, with those already given."""
    f = j.facts
    base = f"{f.rotary_base:.0f}" if f.rotary_base == int(f.rotary_base) else f"{f.rotary_base:g}"
    given = (["--expect rotary"] if f.rotary else []) + (
        [f"--rotary-base {base}"] if f.rotary and f.rotary_base != ROTARY_BASE else [])
    given += ["--expect alibi"] if f.alibi else []
    given += [f"--expect {n}" for n in EXPECTED if n in f.mechanisms or n in names]
    return (f"with {' and '.join(names)} grown into the reference, the output is the "
            f"reference's: pass `{' '.join(given)}` if that is the exercise")


def _missing(j: Judge, x: np.ndarray, weights: RoleWeights, got: np.ndarray) -> str | None:
    """--expect rotary or alibi, and the output is attention without that mechanism."""
    f = j.facts
    if not (f.rotary or f.alibi):
        return None
    shown = tuple(name for name, row in EXPECTED.items()
                  if any(stage.kind == row.kind for stage in j.trace.stages))
    out = steps(x, weights, j.h, f.causal, window=f.window,  # without it, with what it has
                grown=_grown(j, shown), padding=_padding(j))[-1].values
    out = out if np.ndim(x) == 3 else out[0]
    if not (got.size == out.size and close(got.reshape(out.shape), out)[0]):
        return None
    if f.rotary:
        return ("no rotary positions: the output is attention without positions, but "
                f"--expect rotary wants Q and K rotated by position (base {f.rotary_base:g}) "
                "before the scores")
    return ("no ALiBi bias: the output is attention without positions, but --expect alibi "
            "wants each head's scores to get m_h (j - i) (its fixed slope times the distance "
            "back to the key) before softmax")


def _index_list(index: object) -> bool:
    """An index that picks positions by a list (t[:, [1, 0]]): recorded as a tuple of ints
    inside the index tuple (a slice is ("slice", start, stop, step); t[0, 1] is (0, 1))."""
    if isinstance(index, list):
        return True
    if not isinstance(index, tuple) or not index or index[0] == "slice":
        return False
    return any(isinstance(part, list) or (isinstance(part, tuple) and part and part[0] != "slice"
                                          and all(isinstance(i, int) for i in part))
               for part in index)


def _departure(j: Judge, end: StageVerdict) -> Diagnosis | None:
    """The line where the module leaves the reference computation, and what it did there;
    None when it cannot be found (the verdict then keeps the end-to-end difference)."""
    try:
        return _find_departure(j, end)
    except (ValueError, IndexError, TypeError):  # a module no layout foresaw: no line, no crash
        return None


def _find_departure(j: Judge, end: StageVerdict) -> Diagnosis | None:
    weights = role_weights(j)
    x = next((snap.values for name, snap in j.g.rec.inputs if name in j.g.x_names), None)
    if weights is None or x is None:
        return None
    x = np.asarray(x)
    got = f64(j.g.snap(j.g.rec.output).values) if j.g.rec.output is not None else np.zeros(0)
    _, _, grown, _ = _reference(j, x, weights, got) if _grows(j, weights) else (
        None, None, {"padding": _padding(j)}, "")
    found = departure(j.g.rec, j.g.x_names,
                      steps(x, weights, j.h, j.facts.causal, **grown))  # type: ignore[arg-type]
    if found is None:
        return None
    stage = j.stage_of.get(found.op.index)
    named = _named(j, stage)
    words = named or _mechanism(j, x, weights) or _missing(j, x, weights, got) or \
        describe(found, j.T_q)
    file, line = j.where(found.op.source)
    mechanism = bool(named) or words.startswith(("ALiBi", "a LayerNorm", "rotary", "no rotary",
                                                 "no ALiBi"))
    kind = "mechanism" if mechanism else "extra_op"
    lead = f"differs: {words} at line {line}" if mechanism else f"{words} (line {line})"
    hint = ""
    if named and stage is not None and BY_EXPECTED.get(stage.kind):
        inferred = _inferred(j, x, weights, got)
        hint = f"; {_hint(j, inferred)}" if inferred else ""
    # Unplaced: no rule put it in a stage, or indexing that reorders (t[:, [1, 0]]) taken in
    # with the reshapes around it.
    reorders = found.op.name == "getitem" and any(_index_list(a) for a in found.op.args[1:])
    unplaced = stage is None or stage.kind == "op" or reorders
    if unplaced and not mechanism:  # its place in the dataflow, then what it did
        lead = f"{op_role(j.classified(), found.op)}, line {line}: {words}"
    return Diagnosis(kind, file, line,
                     f"{lead}: the module leaves the attention computation here, and its "
                     f"output differs from the reference's by up to {end.max_diff:.3g}{hint}",
                     "op" if unplaced else stage.kind)


# kind -> the kind module that names its mechanism in words (rotary, a LayerNorm, ...)
_MECHANISMS = {row.kind: row.mechanism for row in KINDS if row.mechanism is not None}


def _named(j: Judge, stage: Stage | None) -> str | None:
    """The mechanism the stage holding the departing op shows, said by its own kind with
    its parameters (the same recognition explain shows); None for a plain stage."""
    said = _MECHANISMS.get(stage.kind) if stage is not None else None
    if said is None or stage is None:
        return None
    try:
        return said(j, stage)
    except (ValueError, IndexError, TypeError):  # a module no layout foresaw: the op's words
        return None


def _besides(j: Judge, diagnosis: Diagnosis | None) -> Diagnosis | None:
    """A diagnosis that is not a mechanism, in a module that also has a mechanism plain
    attention lacks and the learner did not ask for: the mechanism is said too, at its line,
    so that the verdict never keeps quiet about it (T5: its scores are not scaled, and it
    adds a relative position bias). A mechanism that changes the heads' layout (a row that
    `leads`) comes first: the rows about heads are its consequences."""
    if diagnosis is None or diagnosis.kind in ("mechanism", "crash"):
        return diagnosis
    said, first = [], None
    for stage in j.trace.stages:
        if stage.kind == diagnosis.stage or (stage.kind == "rotary" and j.facts.rotary) or \
                BY_EXPECTED.get(stage.kind) in j.facts.mechanisms:
            continue
        words = _named(j, stage)
        ops = [op for op in stage.ops if j.g.from_x[op.index]]
        if not words or not ops:
            continue
        if first is None and stage.kind in _LEADING:
            first = (words, ops[-1].source)
        else:
            said.append(f"{words} (line {ops[-1].source.line})")
    if first is not None:
        words, (file, line) = first[0], j.where(first[1])
        also = "; ".join([diagnosis.message, *said])
        return Diagnosis("mechanism", file, line, f"differs: {words} at line {line} (and so: "
                         f"{also})", stage=next(s.kind for s in j.trace.stages
                                                 if s.kind in _LEADING))
    if not said:
        return diagnosis
    return Diagnosis(diagnosis.kind, diagnosis.file, diagnosis.line,
                     f"{diagnosis.message}; besides, {'; '.join(said)}", diagnosis.stage)


_LEADING = {row.kind for row in KINDS if row.leads}
BY_EXPECTED = {row.kind: name for name, row in EXPECTED.items()}  # kind -> its --expect name


def _crash(j: Judge) -> tuple[StageVerdict, Diagnosis] | None:
    error = j.g.rec.error
    if error is None:
        return None
    file, line = j.where(error.source)
    stage = next((s for s in j.trace.stages if s.kind == "error"), None)
    message = f"the forward raised {error.type}: {error.message}"
    verdict = StageVerdict(stage.id if stage else "error", "error", False, None, file, line,
                           "the forward runs to the end")
    return verdict, Diagnosis("crash", file, line, message, "error")


def _notice_differences(j: Judge) -> None:
    """Legitimate differences from the reference, said from what the ops did."""
    ops = j.g.ops
    names = {op.name for op in ops if j.g.from_x[op.index]}
    project = [op for op in ops if j.kind(op) == "project"
               and linear_parts(j.g, op) is not None]
    if any(linear_parts(j.g, op)[2] is not None  # type: ignore[index]
           or added_bias(j.g, op) is not None for op in project):
        j.differences.append("its projections have biases: the reference gets the same "
                                "biases, equivalent")
    if len(project) == 1 and project[0].out.shape[-1] == 3 * j.C:
        j.differences.append("computes Q, K and V with one fused (C, 3C) projection and "
                                "splits it: equivalent")
    # one module per head: the queries' projections are numbered like heads (the Annotated
    # Transformer's clones(Linear, 4) are linears.0..2 for Q, K and V: one Q, not heads)
    queries = [j.chain_to_projection(ref, through=True)[2] for _, ref, _ in j.head_operands()["Q"]]
    heads = {j.head_index(op) for op in queries if op is not None} - {None}
    if len(heads) > 1:
        j.differences.append(f"runs each of the {len(heads)} heads as its own module and "
                                "concatenates their outputs: equivalent")
    if "einsum" in names:
        j.differences.append("uses einsum for the products: equivalent")
    if any(op.name in ("matmul", "mm", "addmm") for op in project):
        j.differences.append("stores its weights as (in, out) and computes x @ W: "
                                "equivalent")
    mask_i = j.position_of("mask")
    scale_i = j.position_of("scale")
    if mask_i is not None and scale_i is not None and mask_i < scale_i:
        j.differences.append("masks the scores before scaling them: -inf / sqrt(d_h) is "
                                "still -inf, equivalent")

# ------------------------------------------------------------ end to end


def role_weights(j: Judge) -> RoleWeights | None:
    """Each role's weight and bias in nn.Linear's (out, in) layout, found by following
    the tensors the scores and attend ops used back to their projection: a fused
    projection's block by the values of its slice, per-head layers stacked by head."""
    parts: dict[str, list[tuple[int, np.ndarray, np.ndarray | None]]] = {"Q": [], "K": [], "V": []}
    how: list[str] = []
    for role, entries in j.head_operands().items():
        done: set[int] = set()
        for _, ref, _ in entries:
            part, _, product, passed = j.chain_to_projection(ref, through=True)
            if part is None or product is None:
                return None
            chain = _path_values(j, ref, len(passed))
            if product.index in done:
                continue
            done.add(product.index)
            _, w, b = linear_parts(j.g, product)  # type: ignore[misc]
            out = f64(product.out.values)
            if b is None:  # `x @ self.W_q + self.b_q`: the bias added apart from the product
                b = head_axis_bias(j.g, product)
                apart = added_bias(j.g, product)
                if apart is not None:  # its parts are cut from the sum (picoGPT: x @ w + b)
                    out = f64(apart[0].out.values)
            if head_axis_product(j.g, product):  # W_Q (h, C, d_h): a (h*d_h, C) layer
                if out.size != j.B * j.T_q * w.shape[0]:
                    return None
                how.append("a head-axis weight read as a (h*d_h, C) layer, head by head")
            elif out.shape[-1] > j.C:  # a fused projection: this role's columns of it
                rows = _fused_rows(j, out, chain, f64(part))
                if rows is None:
                    return None
                w = w[rows]
                b = None if b is None else b[rows]
                how.append("a fused layer cut by role")
            elif out.shape[-1] != w.shape[0]:
                return None
            head = j.head_index(product)
            parts[role].append((head or 0, w, b))
    result: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for role, items in parts.items():
        if not items:
            return None
        items.sort(key=lambda t: t[0])
        weight = np.concatenate([w for _, w, _ in items], axis=0)
        biases = [b for _, _, b in items]
        bias = None if any(b is None for b in biases) else np.concatenate(biases)  # type: ignore[arg-type]
        if weight.shape != (j.C, j.C) and not (role in "KV" and _shared_width(j, weight)):
            return None
        if len(items) > 1:
            how.append(f"{role}: {len(items)} heads' layers stacked")
        result[role] = (weight, bias)
    if result["K"][0].shape != result["V"][0].shape:
        return None
    if result["K"][0].shape[0] != j.C:
        shared = result["K"][0].shape[0] // j.d_h
        how.append(f"K and V: {shared} shared head{'s' if shared > 1 else ''}, "
                   f"({result['K'][0].shape[0]}, {j.C}) layers")
    o = None
    classified = j.classified()
    for op in j.g.ops:
        head_axis = head_axis_product(j.g, op) and j.g.from_x[op.index] \
            and classified.op_derives(op, {"attend", "concat", "sdpa"})
        if j.kind(op) == "w_o" or head_axis:
            lin = linear_parts(j.g, op)
            if lin is not None and lin[1].shape == (j.C, j.C):
                o = (lin[1], head_axis_bias(j.g, op) if lin[2] is None else lin[2])
    return RoleWeights(result["Q"], result["K"], result["V"], o, tuple(dict.fromkeys(how)))


def _path_values(j: Judge, ref: Ref, n: int) -> list[np.ndarray]:
    """What the n ops on the walk back from ref (chain_to_projection's) made on this path,
    nearest the projection first."""
    values: list[np.ndarray] = []
    for _ in range(n):
        op = j.g.producer(ref)
        if op is None or not j.g.x_inputs(op):
            break
        values.append(np.asarray(op.outputs[ref.output].values))
        ref = j.g.x_inputs(op)[0]
    return values[::-1]


def _shared_width(j: Judge, weight: np.ndarray) -> bool:
    """A K or V weight of h_kv * d_h rows, h_kv dividing h: shared K/V heads."""
    rows, cols = weight.shape
    return cols == j.C and rows % j.d_h == 0 and 0 < rows // j.d_h < j.h \
        and j.h % (rows // j.d_h) == 0


def _tokens_leading(j: Judge, tensor: np.ndarray) -> list[np.ndarray]:
    """The tensor as it is, then with its token axis moved just after the batch axis (a
    head-form (B, h, T, d_h) as (B, T, h, d_h)): tokens lead its channels either way."""
    laid = [tensor]
    batch = 1 if tensor.ndim >= 3 and tensor.shape[0] == j.B else 0
    for axis in range(batch + 1, tensor.ndim - 1):
        if tensor.shape[axis] == j.T_q:
            laid.append(np.moveaxis(tensor, axis, batch))
    if not batch and j.B > 1 and tensor.ndim >= 3 and tensor.shape[0] % j.B == 0:
        # heads folded into the batch axis (SAM's (B * h, T, d_h)): as (B, h, T, d_h) first
        laid.extend(_tokens_leading(j, tensor.reshape(j.B, -1, *tensor.shape[1:]))[1:])
    return laid


def _fused_rows(j: Judge, out: np.ndarray, chain: list[np.ndarray], part: np.ndarray
                ) -> np.ndarray | None:
    """Which output channels of a fused projection one role took: the first tensor on the
    way from the projection to the operand (nearest first) whose every channel is one of
    the projection's output columns, found by value (any layout: [Q | K | V], or head by
    head as BLOOM's and GPT-NeoX's (h, 3, d_h)). None when no tensor is."""
    columns = out.reshape(-1, out.shape[-1])  # (B T, width)
    lead = columns.shape[0]
    for tensor in (laid for t in [*chain, part] for laid in _tokens_leading(j, t)):
        if tensor.dtype.kind != "f" or tensor.size % lead or tensor.size == out.size:
            continue
        candidate = tensor.reshape(lead, -1)  # (B T, channels), if tokens lead
        found: list[int] = []
        for channel in candidate.T:
            hits = np.flatnonzero((columns == channel[:, None]).all(axis=0))
            free = [int(c) for c in hits if c not in found]
            if not free:
                break
            found.append(free[0])
        else:
            if len(found) == j.C or _shared_width(j, np.zeros((len(found), j.C))):
                return np.asarray(found)
    return None


def _end_to_end(j: Judge) -> tuple[StageVerdict, Diagnosis | None]:
    """The output against the reference with the module's weights copied in by role: always
    a row; ok None (never a pass) when the reference cannot be computed, with the reason.
    NaN where the reference has numbers is a difference, counted apart (never `inf`)."""
    reference = j.facts.reference if not (j.facts.rotary or j.facts.window or j.facts.alibi
                                          or j.facts.mechanisms) else steps
    out_ref = j.g.rec.output
    last = j.g.ops[out_ref.op] if out_ref is not None and out_ref.op is not None else None
    file, line = j.where(last.source if last is not None else None)

    def not_compared(why: str) -> tuple[StageVerdict, None]:
        return StageVerdict("", "end_to_end", None, None, file, line, f"not compared: {why}"), None

    if reference is None:
        return not_compared("no reference computation was given")
    if out_ref is None:
        return not_compared("the forward returned no tensor")
    weights = role_weights(j)
    if weights is None:
        return not_compared("the weights of Q, K and V could not be found by role (each "
                            "must be a (C, C) linear map of x, or a slice of a fused one)")
    x = next((snap.values for name, snap in j.g.rec.inputs if name in j.g.x_names), None)
    if x is None:
        return not_compared("the forward has no input x to give the reference")
    got = f64(j.g.snap(out_ref).values)
    expected, name, kwargs, grown = _reference(j, np.asarray(x), weights, got)
    j.grown = grown.words if grown is not None else ""
    j.compared_with = grown or _described(j, weights, kwargs)  # plain attention: kwargs {}
    if got.size != expected.size:
        return not_compared(f"the output has {got.size} numbers, the reference's {expected.size}")
    got, padded_rows = _real_rows(j, got.reshape(expected.shape), expected)
    new_nan = np.isnan(got) & ~np.isnan(expected)
    good, d = close(np.where(new_nan, expected, got), expected)
    how = "; ".join(weights.how)
    checked = (f"output = {name} with these weights copied in by role"
               f"{f' ({how})' if how else ''}{padded_rows if good else ''}")
    nan_words = ""
    if new_nan.any():
        good = False
        nan_words = (f"; {int(new_nan.sum())} of the output's numbers are NaN where the "
                     f"reference's are not")
        checked += nan_words
    verdict = StageVerdict("", "end_to_end", good, d, file, line, checked)
    diag = Diagnosis("output_differs", file, line,
                     f"every stage checked out, but the output differs from the reference by "
                     f"up to {d:.3g}{nan_words}", "end_to_end")
    return verdict, diag
