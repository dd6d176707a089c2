"""The verdict on a whole module: every kind's judge() in the registry's order, the rows
sorted by stage, the first wrong one's diagnosis, the legitimate differences noticed, and the
end-to-end comparison with the reference module (run by the torch-knowing side, see Facts).

Never import torch, rich, textual or typer here, so the same judge serves a NumPy module.
"""

from __future__ import annotations

import numpy as np

from ..recognise.registry import JUDGES
from ..records import Trace
from .judging import Judge, Row
from .numeric import close, f64, linear_parts
from .results import Diagnosis, Facts, RoleWeights, StageVerdict, Verdict


def judge(trace: Trace, facts: Facts, label: str = "") -> Verdict:
    """Judge every stage of a traced forward; see the module docstring."""
    if trace.recording is None:
        raise ValueError("judge() needs a trace that holds its recording")
    label = label or (trace.module.class_name if trace.module else trace.recording.module_class)
    return run(Judge(trace, facts, label))


def run(j: Judge) -> Verdict:
    rows: list[Row] = []
    for module, kind, named in JUDGES:
        try:
            rows.extend(module.judge(j))
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
        try:
            end, mismatch = _end_to_end(j)
        except Exception:  # no comparison rather than no verdict
            end, mismatch = None, None
        if end is not None and end.ok is False and diagnosis is None:
            diagnosis = mismatch
    equivalent = diagnosis is None and all(v.ok is not False for v in verdicts) and (
        end is None or end.ok is not False)
    return Verdict(j.label, equivalent, tuple(verdicts), diagnosis,
                   tuple(d for d in dict.fromkeys(j.differences) if d), end)


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
    if any(linear_parts(j.g, op)[2] is not None for op in project):  # type: ignore[index]
        j.differences.append("its projections have biases: the reference gets the same "
                                "biases, equivalent")
    if len(project) == 1 and project[0].out.shape[-1] == 3 * j.C:
        j.differences.append("computes Q, K and V with one fused (C, 3C) projection and "
                                "splits it: equivalent")
    heads = {j.head_index(op) for op in project} - {None}
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
            part, _, product, _ = j.chain_to_projection(ref)
            if part is None or product is None:
                return None
            if product.index in done:
                continue
            done.add(product.index)
            _, w, b = linear_parts(j.g, product)  # type: ignore[misc]
            out = f64(product.out.values)
            width = part.shape[-1]
            if out.shape[-1] != width:
                key = np.sort(f64(part).reshape(-1))
                start = next((o for o in range(0, out.shape[-1] - width + 1, width)
                              if np.array_equal(np.sort(out[..., o:o + width].reshape(-1)), key)),
                             None)
                if start is None:
                    return None
                w = w[start:start + width]
                b = None if b is None else b[start:start + width]
                how.append("a fused layer cut by role")
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
        if weight.shape != (j.C, j.C):
            return None
        if len(items) > 1:
            how.append(f"{role}: {len(items)} heads' layers stacked")
        result[role] = (weight, bias)
    o = None
    for op in j.g.ops:
        if j.kind(op) == "w_o":
            lin = linear_parts(j.g, op)
            if lin is not None and lin[1].shape == (j.C, j.C):
                o = (lin[1], lin[2])
    return RoleWeights(result["Q"], result["K"], result["V"], o, tuple(dict.fromkeys(how)))


def _end_to_end(j: Judge) -> tuple[StageVerdict | None, Diagnosis | None]:
    reference = j.facts.reference
    out_ref = j.g.rec.output
    if reference is None or out_ref is None:
        return None, None
    weights = role_weights(j)
    if weights is None:
        return None, None
    x = next((snap.values for name, snap in j.g.rec.inputs if name in j.g.x_names), None)
    if x is None:
        return None, None
    expected = reference(np.asarray(x), weights, j.h, j.facts.causal)
    got = f64(j.g.snap(out_ref).values)
    if got.size != expected.size:
        return None, None
    got = got.reshape(expected.shape)
    good, d = close(got, expected)
    last = j.g.ops[out_ref.op] if out_ref.op is not None else None
    file, line = j.where(last.source if last is not None else None)
    how = "; ".join(weights.how)
    verdict = StageVerdict("", "end_to_end", good, d, file, line,
                           f"output = {j.facts.reference_name} with these weights copied in "
                           f"by role{f' ({how})' if how else ''}")
    diag = Diagnosis("output_differs", file, line,
                     f"every stage checked out, but the output differs from the reference by "
                     f"up to {d:.3g}", "end_to_end")
    return verdict, diag
