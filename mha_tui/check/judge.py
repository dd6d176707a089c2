"""Judge every recognised stage of a recorded forward against what that stage should compute.

Each stage is judged from the learner's own input to it (the tensors its ops consumed, as
recorded), so one mistake is reported once, where it happens: a wrong split does not make
the scores, the softmax and the output "wrong" after it. At the first wrong stage the
diagnosis is computed from the numbers -- the ratio of scaled to raw scores, which axis
sums to 1, which entries a mask blocked, whether a tensor is a reordering of the right one
-- never from the code's text. Where a judgement needs something run again (a second run
of the forward; the reference module with the learner's weights copied in by role) the
torch-knowing side runs it and hands plain facts in (`Facts`).

Reads only records (NumPy arrays and plain values): never import torch, rich, textual or
typer here, so the same judge serves a NumPy module's recording.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..records import OpRecord, Recording, Ref, Snapshot, Source, Stage, TensorArg, Trace

# A score this low is "blocked": softmax gives it weight 0 in float32 (-inf, finfo.min, -1e9).
LARGE_NEGATIVE = -1e4
# float32 arithmetic in a different order (fused ops, einsum, scale before or after the
# mask) differs by a few ulps; anything above this is a different computation.
ATOL = 1e-5
RTOL = 1e-4

SHAPE_OPS = {"view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze",
             "expand", "expand_as", "flatten", "unflatten", "swapaxes", "swapdims", "movedim",
             "t", "T", "mT", "float", "to", "type", "type_as", "clone", "detach", "getitem",
             "split", "chunk", "unbind", "tensor_split", "double", "half"}
SCALE_OPS = {"div", "mul", "div_", "mul_", "true_divide"}
MASK_OPS = {"add", "add_", "sub", "sub_", "masked_fill", "masked_fill_", "where"}
PRODUCTS = {"linear", "addmm", "matmul", "mm", "einsum", "bmm", "baddbmm"}
SOFTMAXES = {"softmax", "_softmax", "softmax_"}
DROPOUTS = {"dropout", "dropout_", "feature_dropout", "alpha_dropout"}


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True)
class StageVerdict:
    """One row of the verdict: a stage, whether it computed what it should, and how far off.

    ok None: not judged (an op no rule recognises). max_diff: the largest absolute
    difference between what the stage made and what it should have made from its input.
    stage_id "" marks a row for a step the module never performed (a missing scale).
    """

    stage_id: str
    kind: str
    ok: bool | None
    max_diff: float | None
    file: str
    line: int
    checked: str
    note: str = ""


@dataclass(frozen=True)
class Diagnosis:
    """The first wrong stage: where, and the likely mistake, said from the numbers."""

    kind: str
    file: str
    line: int
    message: str
    stage: str = ""


@dataclass(frozen=True)
class Verdict:
    """A module judged: equivalent to multi-head attention, or not, and where and why."""

    module: str
    equivalent: bool
    stages: tuple[StageVerdict, ...]
    diagnosis: Diagnosis | None
    differences: tuple[str, ...] = ()
    end_to_end: StageVerdict | None = None

    def as_dict(self) -> dict[str, object]:
        """The grader's JSON object (see the README): module, equivalent, stages, diagnosis."""
        rows = [*self.stages, *([self.end_to_end] if self.end_to_end else [])]
        return {
            "module": self.module,
            "equivalent": self.equivalent,
            "stages": [{"kind": r.kind, "ok": r.ok,
                        "max_diff": None if r.max_diff is None else _json_float(r.max_diff),
                        "file": r.file, "line": r.line, "checked": r.checked} for r in rows],
            "diagnosis": None if self.diagnosis is None else {
                "kind": self.diagnosis.kind, "file": self.diagnosis.file,
                "line": self.diagnosis.line, "message": self.diagnosis.message},
            "differences": list(self.differences),
        }


def _json_float(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.3e}")


# ---------------------------------------------------------------------------- facts in


@dataclass(frozen=True)
class RoleWeights:
    """The module's projections by role, in nn.Linear's layout: weight (out, in), bias or None.

    o is None when the module has no output projection. How each was found (fused, per
    head, x @ W) is said in `how`.
    """

    q: tuple[np.ndarray, np.ndarray | None]
    k: tuple[np.ndarray, np.ndarray | None]
    v: tuple[np.ndarray, np.ndarray | None]
    o: tuple[np.ndarray, np.ndarray | None] | None
    how: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Facts:
    """What the torch-knowing side found by running things (plain values and callables).

    second: a recording of a second call of the same forward on the same input (None if
    not made). parameters: every parameter of the module, (name, shape). reference:
    called with (x, role weights, heads, causal), returns the reference module's output
    with those weights copied in.
    """

    causal: bool = True
    heads: int = 1
    parameters: tuple[tuple[str, tuple[int, ...]], ...] = ()
    second: Recording | None = None
    reference: Callable[[np.ndarray, RoleWeights, int, bool], np.ndarray] | None = None
    training: bool = False
    # What the reference is, as the verdict names it.
    reference_name: str = "the mygpt reference"


# ---------------------------------------------------------------------------- numbers


def _f64(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b|; equal infinities and NaN in the same place count as equal."""
    a, b = _f64(a), _f64(b)
    if a.shape != b.shape:
        try:
            a, b = np.broadcast_arrays(a, b)
        except ValueError:
            return math.inf
    if a.size == 0:
        return 0.0
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max())


def close(a: np.ndarray, b: np.ndarray, scale: float | None = None) -> tuple[bool, float]:
    """(within tolerance, largest difference): ATOL + RTOL * the size of the numbers."""
    d = max_diff(a, b)
    finite = _f64(b)[np.isfinite(_f64(b))] if np.size(b) else np.zeros(0)
    size = scale if scale is not None else (float(np.abs(finite).max()) if finite.size else 0.0)
    return d <= ATOL + RTOL * size, d


def softmax(values: np.ndarray, axis: int = -1) -> np.ndarray:
    values = _f64(values)
    with np.errstate(invalid="ignore", over="ignore"):
        top = np.max(values, axis=axis, keepdims=True)
        e = np.exp(values - top)
        return e / np.sum(e, axis=axis, keepdims=True)


def blocked(values: np.ndarray) -> np.ndarray:
    """Entries softmax will give weight 0: -inf or a very large negative number."""
    values = _f64(values)
    return np.isneginf(values) | (values <= LARGE_NEGATIVE)


def causal_set(T: int) -> np.ndarray:
    """(T, T) True where query i may not look at key j (j > i)."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def _pattern(values: np.ndarray) -> np.ndarray | None:
    """The blocked (T, T) pattern of a (..., T, T) tensor if it is the same in every head."""
    b = blocked(values)
    if b.ndim < 2:
        return None
    flat = b.reshape(-1, *b.shape[-2:])
    return flat[0] if all(np.array_equal(f, flat[0]) for f in flat) else None


# ---------------------------------------------------------------------------- the graph


class Flow:
    """The recording with producers, consumers and each op's stage."""

    def __init__(self, trace: Trace, rec: Recording) -> None:
        self.rec = rec
        self.ops = rec.ops
        self.stage_of: dict[int, Stage] = {}
        for stage in trace.stages:
            for op in stage.ops:
                self.stage_of.setdefault(op.index, stage)
        self.consumers: dict[int, list[tuple[int, int, int]]] = {i: [] for i in range(len(self.ops))}
        for op in self.ops:
            for position, ref in enumerate(op.inputs):
                if ref.kind == "op" and ref.op is not None:
                    self.consumers[ref.op].append((op.index, position, ref.output))
        # x, and q/k/v when given apart; never the mask the loader passed by name (NumPy's
        # additive mask is a float array too).
        float_inputs = {name for name, snap in rec.inputs if snap.dtype.startswith("float")
                        and name not in ("mask", "attn_mask")}
        self.x_names = float_inputs or {name for name, _ in rec.inputs[:1]}
        self.from_x = [False] * len(self.ops)
        for op in self.ops:
            self.from_x[op.index] = any(self.is_x(r) for r in op.inputs)

    def kind(self, op: OpRecord | int) -> str:
        index = op if isinstance(op, int) else op.index
        stage = self.stage_of.get(index)
        return stage.kind if stage is not None else ""

    def is_x(self, ref: Ref) -> bool:
        if ref.kind == "input":
            return ref.name in self.x_names
        return ref.kind == "op" and ref.op is not None and self.from_x[ref.op]

    def snap(self, ref: Ref) -> Snapshot:
        return self.rec.snapshot(ref)

    def producer(self, ref: Ref) -> OpRecord | None:
        return self.ops[ref.op] if ref.kind == "op" and ref.op is not None else None

    def x_inputs(self, op: OpRecord) -> list[Ref]:
        return [r for r in op.inputs if self.is_x(r)]

    def tensor_operands(self, op: OpRecord) -> list[Ref]:
        """Tensor arguments in call order (einsum's operands come as a tuple)."""
        refs = []
        for arg in op.args:
            if isinstance(arg, TensorArg):
                refs.append(op.inputs[arg.index])
            elif isinstance(arg, tuple):
                refs.extend(op.inputs[a.index] for a in arg if isinstance(a, TensorArg))
        return refs


# ---------------------------------------------------------------------------- op semantics


def _linear_parts(flow: Flow, op: OpRecord) -> tuple[Ref, np.ndarray, np.ndarray | None] | None:
    """(input, weight as (out, in), bias) of a projection op, from its recorded arguments."""
    x = flow.x_inputs(op)
    if len(x) != 1:
        return None
    others = [r for r in op.inputs if not flow.is_x(r)]
    mats = [r for r in others if flow.snap(r).ndim == 2]
    vecs = [r for r in others if flow.snap(r).ndim == 1]
    if len(mats) != 1:
        return None
    w = _f64(flow.snap(mats[0]).values)
    bias = _f64(flow.snap(vecs[0]).values) if vecs else None
    if op.name == "linear":
        return x[0], w, bias
    if op.name == "addmm" or op.name in ("matmul", "mm"):
        operands = flow.tensor_operands(op)
        if op.name == "addmm" and operands and operands[0] is not x[0] and len(operands) == 3:
            return (x[0], w.T, bias) if operands[1] is x[0] else None
        return (x[0], w.T, None) if operands and operands[0] is x[0] else None
    if op.name == "einsum":
        spec = _einsum_spec(op)
        operands = flow.tensor_operands(op)
        if spec is None or len(operands) != 2:
            return None
        ins, _ = spec
        w_letters = ins[operands.index(mats[0])] if mats[0] in operands else ""
        x_letters = ins[operands.index(x[0])] if x[0] in operands else ""
        if len(w_letters) != 2 or not x_letters:
            return None
        contracted = x_letters[-1]
        if w_letters[0] == contracted:
            return x[0], w.T, None
        if w_letters[1] == contracted:
            return x[0], w, None
    return None


def _einsum_spec(op: OpRecord) -> tuple[list[str], str] | None:
    equation = op.args[0] if op.args and isinstance(op.args[0], str) else None
    if equation is None or "->" not in equation or "." in equation:
        return None
    lhs, out = equation.replace(" ", "").split("->")
    return lhs.split(","), out


def recompute(flow: Flow, op: OpRecord) -> np.ndarray | None:
    """What a product op computes from its recorded inputs (NumPy, float64), or None."""
    operands = [_f64(flow.snap(r).values) for r in flow.tensor_operands(op)]
    try:
        if op.name in ("matmul", "mm", "bmm") and len(operands) == 2:
            return operands[0] @ operands[1]
        if op.name == "baddbmm" and len(operands) == 3:
            beta = float(op.kwarg("beta", 1) or 1)
            alpha = float(op.kwarg("alpha", 1) or 1)
            return beta * operands[0] + alpha * (operands[1] @ operands[2])
        if op.name == "einsum":
            spec = _einsum_spec(op)
            if spec is None:
                return None
            return np.einsum(f"{','.join(spec[0])}->{spec[1]}", *operands)
        if op.name in ("linear", "addmm"):
            parts = _linear_parts(flow, op)
            if parts is None:
                return None
            x, w, b = parts
            return _f64(flow.snap(x).values) @ w.T + (0 if b is None else b)
    except ValueError:
        return None
    return None


# ---------------------------------------------------------------------------- the judge


@dataclass
class _Row:
    verdict: StageVerdict
    diagnosis: Diagnosis | None = None
    position: float = 0.0


@dataclass
class Judge:
    trace: Trace
    facts: Facts
    label: str
    flow: Flow = field(init=False)
    B: int = 1
    T: int = 1
    C: int = 1
    h: int = 1
    d_h: int = 1
    differences: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.trace.recording is not None
        self.flow = Flow(self.trace, self.trace.recording)
        x = next((snap for name, snap in self.flow.rec.inputs if name in self.flow.x_names), None)
        shape = x.shape if x is not None else (1, self.trace.config.seq_len, self.trace.config.embed_dim)
        self.B, self.T, self.C = (1, *shape)[-3:] if len(shape) == 2 else shape[:3]
        self.h = max(1, self.facts.heads)
        self.d_h = max(1, self.C // self.h)

    # ------------------------------------------------------------ helpers

    def where(self, source: Source | None) -> tuple[str, int]:
        return (source.file, source.line) if source is not None else ("", 0)

    def row(self, stage: Stage | None, kind: str, ok: bool | None, diff: float | None,
            checked: str, *, source: Source | None = None, note: str = "",
            diagnosis: tuple[str, str] | None = None, position: float = 0.0) -> _Row:
        src = source or (stage.source if stage is not None else None)
        file, line = self.where(src)
        verdict = StageVerdict(stage.id if stage is not None else "", kind, ok, diff, file, line,
                               checked, note)
        diag = Diagnosis(diagnosis[0], file, line, diagnosis[1], kind) if diagnosis else None
        return _Row(verdict, diag, position)

    def main_ops(self, stage: Stage, names: set[str]) -> list[OpRecord]:
        found = [op for op in stage.ops if op.name in names and self.flow.from_x[op.index]]
        if not found and names is SOFTMAXES:
            return self._hand_written_softmax(stage)
        return found

    def _hand_written_softmax(self, stage: Stage) -> list[OpRecord]:
        """A softmax written out (exp(s - max) / sum(exp)) as one softmax op per division:
        its input the scores the chain started from, its output the division's."""
        found = []
        for div in stage.ops:
            if div.name not in ("div", "true_divide") or len(div.inputs) != 2:
                continue
            e = self.flow.producer(div.inputs[0])
            if e is None or e.name != "exp" or not e.inputs:
                continue
            start = e.inputs[0]
            shifted = self.flow.producer(start)
            if shifted is not None and shifted.name == "sub" and shifted.inputs:
                start = shifted.inputs[0]
            found.append(replace(div, name="softmax", qualname="(written by hand)", inputs=(start,),
                                 args=(TensorArg(0),), kwargs=(("dim", -1),)))
        return found

    def heads_axis(self, values: np.ndarray) -> np.ndarray:
        """(..., a, b) with leading axes B*h (or B, h) as (B, h, a, b); per-head (B, a, b) kept."""
        values = np.asarray(values)
        if values.ndim == 4:
            return values
        if values.ndim == 3 and values.shape[0] == self.B * self.h and self.h > 1:
            return values.reshape(self.B, self.h, *values.shape[1:])
        if values.ndim == 3:
            return values[:, None]
        if values.ndim == 2:
            return values[None, None]
        return values

    def head_index(self, op: OpRecord) -> int | None:
        match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", op.module)
        return int(match.group(1)) if match else None

    # ------------------------------------------------------------ project / w_o

    def linear_row(self, stage: Stage, kind: str) -> _Row:
        ops = [op for op in stage.ops if op.name in PRODUCTS and self.flow.from_x[op.index]
               and _linear_parts(self.flow, op) is not None]
        if not ops:
            return self.row(stage, kind, None, None, "no weight product recognised; not judged")
        worst, ok, bias = 0.0, True, False
        for op in ops:
            x, w, b = _linear_parts(self.flow, op)  # type: ignore[misc]
            expected = _f64(self.flow.snap(x).values) @ w.T + (0 if b is None else b)
            good, d = close(op.out.values, expected.reshape(op.out.shape))
            ok &= good
            worst = max(worst, d)
            bias |= b is not None
        b_text = " + b" if bias else ""
        checked = (f"Q, K, V = x @ W^T{b_text}: linear maps of the input x" if kind == "project"
                   else f"out = concat @ W_O^T{b_text}: a linear map of the concat")
        return self.row(stage, kind, ok, worst, checked)

    # ------------------------------------------------------------ head forms

    def _chain_to_projection(self, ref: Ref
                             ) -> tuple[np.ndarray | None, float, OpRecord | None, list[OpRecord]]:
        """Walk back from a head-form operand to the projection output it was cut from.

        Returns (the projection's part that became this operand -- for a fused projection
        the slice after its split --, the scale factor applied on the way, the projection's
        product op, the ops passed through, nearest first).
        """
        factor = 1.0
        passed: list[OpRecord] = []
        values: list[np.ndarray] = []  # what each passed op made, on this path
        want = self.flow.snap(ref).values.size
        for _ in range(48):
            op = self.flow.producer(ref)
            if op is None:
                return None, factor, None, passed
            xs = self.flow.x_inputs(op)
            if self.flow.kind(op) == "project" and _linear_parts(self.flow, op) is not None:
                # the part: the tensor nearest the projection that has the operand's size
                chain = [op.outputs[ref.output].values, *reversed(values)]
                part = next((c for c in chain if c.size == want), None)
                return part, factor, op, passed
            if not xs:
                return None, factor, None, passed
            if op.name in SCALE_OPS:
                r = _ratio(_f64(op.out.values), _f64(self.flow.snap(xs[0]).values))
                if r is not None:
                    factor *= r
            elif op.name not in SHAPE_OPS:
                return None, factor, None, passed
            passed.append(op)
            values.append(op.outputs[ref.output].values)
            ref = xs[0]
        return None, factor, None, passed

    def canonical_projection(self, values: np.ndarray) -> np.ndarray:
        """A projection output as (B, T, width): torch's MHA works on (T, B, width)."""
        if values.ndim == 3 and values.shape[:2] == (self.T, self.B) and self.B != self.T:
            return values.transpose(1, 0, 2)
        if values.ndim == 2:
            return values[None]
        return values

    def head_operands(self) -> dict[str, list[tuple[np.ndarray, Ref, OpRecord]]]:
        """Per role, the head-form tensors the scores and attend ops used, as (B?, h?, T, d_h).

        Each entry: (values laid out with the token axis second to last and the channel
        axis last, the operand ref, the consuming op).
        """
        found: dict[str, list[tuple[np.ndarray, Ref, OpRecord]]] = {"Q": [], "K": [], "V": []}
        for stage in self.trace.stages:
            if self._is_sdpa(stage) and stage.kind == "attend":
                op = next(op for op in stage.ops if op.name == "scaled_dot_product_attention")
                for role, ref in zip("QKV", self.flow.tensor_operands(op)[:3], strict=False):
                    found[role].append((self.flow.snap(ref).values, ref, op))
                continue
            if stage.kind not in ("scores", "attend") or self._is_sdpa(stage):
                continue
            for op in self.main_ops(stage, {"matmul", "bmm", "baddbmm", "einsum"}):
                operands = self.flow.tensor_operands(op)
                if op.name == "baddbmm":
                    operands = operands[1:]
                if len(operands) != 2:
                    continue
                a, b = operands
                if op.name == "einsum":
                    laid = self._einsum_layout(op, stage.kind)
                    if laid is None:
                        continue
                    (a_vals, b_vals) = laid
                else:
                    a_vals = self.flow.snap(a).values
                    b_vals = np.swapaxes(self.flow.snap(b).values, -1, -2) if stage.kind == "scores" \
                        else self.flow.snap(b).values
                if stage.kind == "scores":
                    found["Q"].append((a_vals, a, op))
                    found["K"].append((b_vals, b, op))
                else:
                    found["V"].append((b_vals, b, op))
        return found

    def _einsum_layout(self, op: OpRecord, kind: str) -> tuple[np.ndarray, np.ndarray] | None:
        """einsum operands transposed to (batch..., token, channel) for Q/K, V."""
        spec = _einsum_spec(op)
        operands = self.flow.tensor_operands(op)
        if spec is None or len(operands) != 2:
            return None
        (la, lb), out = spec
        if len(out) < 2:
            return None
        if kind == "scores":
            q_letter, k_letter = out[-2], out[-1]
            contracted = [c for c in la if c in lb and c not in out]
            if len(contracted) != 1:
                return None
            d = contracted[0]
            batch = [c for c in out[:-2]]
            try:
                a = np.einsum(f"{la}->{''.join(batch)}{q_letter}{d}", self.flow.snap(operands[0]).values)
                b = np.einsum(f"{lb}->{''.join(batch)}{k_letter}{d}", self.flow.snap(operands[1]).values)
            except ValueError:
                return None
            return a, b
        # attend: weights (…, q, k) times v (…, k, d)
        contracted = [c for c in la if c in lb and c not in out]
        if len(contracted) != 1:
            return None
        k_letter = contracted[0]
        d_letters = [c for c in lb if c not in la]
        if len(d_letters) != 1:
            return None
        batch = [c for c in lb if c not in (k_letter, d_letters[0])]
        try:
            b = np.einsum(f"{lb}->{''.join(batch)}{k_letter}{d_letters[0]}",
                          self.flow.snap(operands[1]).values)
        except ValueError:
            return None
        return self.flow.snap(operands[0]).values, b

    def split_rows(self) -> list[_Row]:
        """Judge the head split on the tensors the scores and attend ops actually used."""
        rows: list[_Row] = []
        split_stages = [s for s in self.trace.stages if s.kind in ("view", "transpose")]
        worst, ok, diagnosis, culprit = 0.0, True, None, None
        judged = False
        for role, entries in self.head_operands().items():
            per_head = [e for e in entries if self.head_index(e[2]) is not None]
            for values, ref, _consumer in entries:
                projected, factor, proj_op, passed = self._chain_to_projection(ref)
                if projected is None:
                    continue
                projected = self.canonical_projection(_f64(projected))
                got = _f64(values)
                if per_head and got.ndim == 3:  # one head's own module: nothing was split
                    expected = projected * factor
                    judged = True
                    good, d = close(got, expected)
                else:
                    if projected.shape[-1] != self.h * self.d_h or got.size != projected.size:
                        continue
                    judged = True
                    expected = (projected.reshape(self.B, self.T, self.h, self.d_h)
                                .transpose(0, 2, 1, 3) * factor)
                    got4 = got.reshape(expected.shape) if got.ndim != 4 else got
                    good, d = close(got4, expected)
                    if not good and diagnosis is None:
                        diagnosis = self._split_diagnosis(got4, projected * factor, role)
                        culprit = passed[0] if passed else proj_op
                worst = max(worst, d)
                ok &= good
        if not judged:
            return rows
        target = None
        if culprit is not None:
            target = self.flow.stage_of.get(culprit.index)
        if target is None or target.kind not in ("view", "transpose"):
            target = split_stages[-1] if split_stages else None
        checked = (f"head i holds channels [{self.d_h}i, {self.d_h}i+{self.d_h}) of every "
                   f"token's Q, K, V")
        for stage in split_stages:
            if stage is target:
                continue
            same, d = self.same_numbers(stage)
            rows.append(self.row(stage, stage.kind, same, d,
                                 "a new shape or axis order only: the same numbers"))
        if target is not None:
            rows.append(self.row(target, target.kind, ok, worst, checked,
                                 source=culprit.source if (culprit and not ok) else None,
                                 diagnosis=diagnosis))
        elif not ok:
            src = culprit.source if culprit is not None else None
            rows.append(self.row(None, "view", ok, worst, checked, source=src,
                                 diagnosis=diagnosis, position=self._position_before("scores")))
        return rows

    def same_numbers(self, stage: Stage) -> tuple[bool, float]:
        """Every op of a view/transpose stage keeps its input's numbers (order aside)."""
        worst = 0.0
        for op in stage.ops:
            xs = self.flow.x_inputs(op)
            if not xs or op.name not in SHAPE_OPS:
                continue
            before = _f64(self.flow.snap(xs[0]).values).reshape(-1)
            for out in op.outputs:
                after = _f64(out.values).reshape(-1)
                if op.name in ("view", "reshape", "flatten", "unflatten", "contiguous", "clone",
                               "float", "to", "detach"):
                    d = max_diff(after, before) if after.size == before.size else math.inf
                else:
                    d = max_diff(np.sort(after), np.sort(before)) if after.size == before.size \
                        else 0.0 if np.isin(after, before).all() else math.inf
                worst = max(worst, d)
        return worst <= ATOL, worst

    def _split_diagnosis(self, got: np.ndarray, projected: np.ndarray, role: str) -> tuple[str, str]:
        name = {"Q": "queries", "K": "keys", "V": "values"}[role]
        if np.allclose(got.reshape(-1), projected.reshape(-1), atol=ATOL, rtol=RTOL, equal_nan=True):
            last = (self.T * self.d_h - 1) // self.C  # the token head 0's last number is from
            tokens = "token 0" if last == 0 else f"tokens 0-{last}"
            return ("split_without_transpose",
                    f"heads split with a single view(B, h, T, d_h) and no transpose: the {name}' "
                    f"numbers are all there but in memory order, so head 0 holds the first "
                    f"T*d_h = {self.T * self.d_h} numbers ({tokens}, all channels) instead of "
                    f"channels 0-{self.d_h - 1} of every token; view(B, T, h, d_h), then "
                    f"transpose(1, 2)")
        if np.allclose(np.sort(got.reshape(-1)), np.sort(projected.reshape(-1)), atol=ATOL,
                       rtol=RTOL):
            return ("split_permuted",
                    f"the {name} hold the right numbers in the wrong places (a permutation): "
                    f"head i must get channels [i*{self.d_h}, (i+1)*{self.d_h}) of each token")
        return ("split_wrong", f"the head-split {name} are not the projection's numbers")

    # ------------------------------------------------------------ scores / scale / mask / softmax

    def scores_row(self, stage: Stage) -> _Row:
        ops = self.main_ops(stage, {"matmul", "bmm", "baddbmm", "einsum"})
        worst, ok = 0.0, bool(ops)
        for op in ops:
            expected = recompute(self.flow, op)
            if expected is None:
                continue
            good, d = close(op.out.values, expected.reshape(op.out.shape))
            ok &= good
            worst = max(worst, d)
        shapes_ok = all(op.out.shape[-1] == op.out.shape[-2] == self.T for op in ops)
        return self.row(stage, "scores", ok and shapes_ok, worst,
                        "scores = Q_i @ K_i^T, a (T, T) matrix per head")

    def scale_chain(self, soft: OpRecord) -> tuple[float, list[OpRecord], OpRecord] | None:
        """The factor between the raw product Q_i @ K_i^T and what softmax normalises.

        Walks back from softmax's input through masks, scalings and reshapes to the scores
        product, then from its two operands back to the projections: a scale applied to q
        (torch's own MHA), to the scores, or inside the softmax call all count; the factor
        is measured as the ratio of the numbers after to before each scaling op.
        """
        xs = self.flow.x_inputs(soft)
        if not xs:
            return None
        ref, factor, ops = xs[0], 1.0, []
        for _ in range(32):
            op = self.flow.producer(ref)
            if op is None:
                return None
            inputs = self.flow.x_inputs(op)
            if op.name in ("matmul", "bmm", "baddbmm", "einsum") and len(inputs) >= 2:
                operands = self.flow.tensor_operands(op)
                if op.name == "baddbmm":
                    operands = operands[1:]
                for operand in operands[:2]:
                    _, f, _, passed = self._chain_to_projection(operand)
                    factor *= f
                    ops.extend(p for p in passed if p.name in SCALE_OPS)
                return factor, ops, op
            if op.name in SCALE_OPS and len(inputs) == 1:
                r = _ratio(_f64(op.out.values), _f64(self.flow.snap(inputs[0]).values))
                if r is not None:
                    factor *= r
                ops.append(op)
            elif op.name not in MASK_OPS | SHAPE_OPS or not inputs:
                return None
            ref = inputs[0]
        return None

    def scale_rows(self) -> list[_Row]:
        stages = [s for s in self.trace.stages if s.kind == "scale" and not self._is_sdpa(s)]
        expected = 1 / math.sqrt(self.d_h)
        chains = [c for c in (self.scale_chain(op) for op in self.softmax_ops()) if c is not None]
        if not chains:
            return [self.row(s, "scale", None, None, "not judged: no path from the scores to "
                                                     "softmax was found") for s in stages]
        totals = [c[0] for c in chains]
        ok = all(math.isclose(t, expected, rel_tol=1e-5) for t in totals)
        total = next((t for t in totals if not math.isclose(t, expected, rel_tol=1e-5)), totals[0])
        scale_ops = [op for c in chains for op in c[1]]
        scores_op = chains[0][2]
        last_op = scale_ops[0] if scale_ops else None  # walked backwards: the last applied
        out = _f64(last_op.out.values) if last_op is not None else _f64(scores_op.out.values)
        finite = out[np.isfinite(out) & (out > LARGE_NEGATIVE)]
        diff = float(np.abs(finite - finite * expected / total).max()) if finite.size and total else 0.0
        checked = f"scores * 1/sqrt(d_h) = {expected:.4f} before softmax (measured {total:.4f})"
        diagnosis = None if ok else self._scale_diagnosis(total)
        note = ""
        per_chain = len(chains[0][1])
        if ok and per_chain == 1 and scale_ops[0].name.startswith("mul"):
            note = "multiplies by d_h ** -0.5 instead of dividing by sqrt(d_h): equivalent"
        elif ok and per_chain > 1:
            note = (f"scales in {per_chain} steps whose product is 1/sqrt(d_h) (e.g. q and k "
                    "each by d_h ** -0.25): equivalent")
        upstream = {p.index for c in chains for operand in
                    self.flow.tensor_operands(c[2])[-2:]
                    for p in self._chain_to_projection(operand)[3] if p.name in SCALE_OPS}
        if note:
            self.differences.append(note)
        if ok and upstream:
            self.differences.append("scales q (or k) before the product q @ k^T instead of the "
                                    "scores: equivalent")
        if not stages:
            if ok:
                return []
            src = last_op.source if last_op is not None else scores_op.source
            return [self.row(None, "scale", False, diff, checked + (
                "; no op scales them" if last_op is None else ""), source=src,
                diagnosis=diagnosis, position=self._position_after("scores"))]
        rows = []
        for stage in stages:
            final = stage is stages[-1]
            src = last_op.source if final and last_op is not None else None
            rows.append(self.row(stage, "scale", ok if final else True, diff if final else None,
                                 checked if final else "part of the scaling, judged with the last",
                                 source=src, note=note if final else "",
                                 diagnosis=diagnosis if final else None))
        return rows

    def _scale_diagnosis(self, total: float) -> tuple[str, str]:
        named = [
            ("scaled_by_sqrt_C", 1 / math.sqrt(self.C),
             f"scaled by 1/sqrt(C) = 1/sqrt({self.C}) (the model width) instead of 1/sqrt(d_h) = "
             f"1/sqrt({self.d_h}) (one head's width): the scaled scores are {total:.4f} times the "
             f"raw ones, sqrt(h) = {math.sqrt(self.h):.4f} times too small"),
            ("not_scaled", 1.0, "the scores are not scaled: what softmax gets is 1.0000 times "
                                f"Q @ K^T, it should be 1/sqrt({self.d_h}) = "
                                f"{1 / math.sqrt(self.d_h):.4f} times"),
            ("scaled_by_d_h", 1 / self.d_h,
             f"divided by d_h = {self.d_h} instead of sqrt(d_h): scaled / raw = {total:.4f}"),
            ("scale_inverted", math.sqrt(self.d_h),
             f"multiplied by sqrt(d_h) instead of dividing: scaled / raw = {total:.4f}"),
            ("scaled_by_C", 1 / self.C, f"divided by C = {self.C}: scaled / raw = {total:.4f}"),
        ]
        for kind, value, message in named:
            if math.isclose(total, value, rel_tol=1e-5) and not math.isclose(
                    value, 1 / math.sqrt(self.d_h), rel_tol=1e-9):
                return kind, message
        return "wrong_scale", (f"scaled by {total:.4f}; it should be 1/sqrt(d_h) = "
                               f"{1 / math.sqrt(self.d_h):.4f}")

    def softmax_ops(self) -> list[OpRecord]:
        ops = []
        for stage in self.trace.stages:
            if stage.kind == "softmax" and not self._is_sdpa(stage):
                ops.extend(self.main_ops(stage, SOFTMAXES))
        return ops

    def mask_rows(self) -> list[_Row]:
        """Judge the entries blocked by the mask op, then what actually reaches softmax."""
        stages = [s for s in self.trace.stages if s.kind == "mask" and not self._is_sdpa(s)]
        expected = causal_set(self.T) if self.facts.causal else np.zeros((self.T, self.T), bool)
        rows: list[_Row] = []
        mask_ok = True
        value_note = ""
        for stage in stages:
            ops = self.main_ops(stage, MASK_OPS | {"baddbmm"})
            if not ops:
                rows.append(self.row(stage, "mask", None, None, "no masking op recognised"))
                continue
            op = ops[-1]
            after = _f64(op.out.values)
            if op.name == "baddbmm":  # mask + q @ k^T in one op (torch's own MHA)
                operands = [_f64(self.flow.snap(r).values) for r in self.flow.tensor_operands(op)]
                before = float(op.kwarg("alpha", 1) or 1) * (operands[1] @ operands[2])
                self.differences.append("adds the mask inside the scores product (baddbmm): "
                                        "equivalent")
            else:
                before = _f64(self.flow.snap(self.flow.x_inputs(op)[0]).values)
            if before.shape != after.shape:
                before = np.broadcast_to(before, after.shape)
            newly = blocked(after) & ~blocked(before)
            square = newly.ndim >= 2 and newly.shape[-1] == self.T
            flat = newly.reshape(-1, self.T, self.T) if square else None
            same = flat is not None and all(np.array_equal(f, flat[0]) for f in flat)
            pattern = flat[0] if same and flat is not None else None
            kept = ~newly
            d = max_diff(np.where(kept, after, 0.0), np.where(kept, before, 0.0))
            good = pattern is not None and np.array_equal(pattern, expected) and d <= ATOL
            mask_ok &= good
            values = after[newly]
            if good and values.size and np.isfinite(values).all():
                value_note = (f"masks with {float(values.max()):.3g} instead of -inf: softmax gives "
                              f"those entries weight 0 in float32, the same weights: equivalent")
            diag = None if good else self._mask_diagnosis(pattern, expected, d)
            n = int(expected.sum())
            rows.append(self.row(stage, "mask", good, d,
                                 f"blocks exactly the {n} causal entries (key after query)"
                                 if self.facts.causal else
                                 "blocks nothing (--no-causal)",
                                 source=op.source, note=value_note, diagnosis=diag))
        if value_note:
            self.differences.append(value_note)
        # What softmax normalises: the masked scores must be what reaches it.
        soft = self.softmax_ops()
        if not soft or not mask_ok:
            return rows
        logits = _f64(self.flow.snap(self.flow.x_inputs(soft[0])[0]).values)
        pattern = _pattern(logits) if logits.ndim >= 2 and logits.shape[-1] == self.T else None
        if pattern is not None and np.array_equal(pattern, expected):
            if not stages and expected.any():
                self.differences.append("applies the mask inside the scores op (an additive "
                                        "attn_mask in baddbmm): equivalent")
            return rows
        if pattern is None:
            return rows
        # The future is not blocked before softmax.
        after = self._mask_after_softmax(soft[0], expected)
        if after is not None:
            op, d = after
            sums = _f64(op.out.values).sum(axis=-1)
            rows.append(self.row(self.flow.stage_of.get(op.index), "mask", False, d,
                                 "the causal entries are blocked before softmax",
                                 source=op.source, diagnosis=(
                                     "mask_after_softmax",
                                     "the mask is applied after softmax: the causal entries are "
                                     "blocked in the weights, not in the scores, so the rows "
                                     f"no longer sum to 1 (row sums {np.nanmin(sums):.4f} to "
                                     f"{np.nanmax(sums):.4f}); mask the scores, then softmax"),
                                 position=self._position_after("softmax")))
            return rows
        if stages:
            last = stages[-1]
            rows[-1] = self.row(last, "mask", False, None,
                                "the masked scores are what softmax normalises",
                                source=self.main_ops(last, MASK_OPS)[-1].source,
                                diagnosis=("mask_missing",
                                           "the mask's result never reaches softmax: softmax "
                                           f"normalises scores with {int(expected.sum())} causal "
                                           "entries unblocked (the masked tensor is not the one "
                                           "passed on)"))
            return rows
        rows.append(self.row(None, "mask", False, None,
                             f"blocks exactly the {int(expected.sum())} causal entries before softmax",
                             source=soft[0].source,
                             diagnosis=("mask_missing" if self.facts.causal else "mask_unexpected",
                                        "no mask: softmax gets every score, so each token also "
                                        "attends to the tokens after it" if self.facts.causal else
                                        "the scores are masked although --no-causal was given"),
                             position=self._position_before("softmax")))
        return rows

    def _mask_diagnosis(self, pattern: np.ndarray | None, expected: np.ndarray, d: float
                        ) -> tuple[str, str]:
        T = self.T
        if pattern is None:
            return "mask_wrong", "the mask blocks different entries in different heads"
        lower = np.tril(np.ones((T, T), bool), k=-1)
        n = int(pattern.sum())
        if not expected.any() and pattern.any():
            return "mask_unexpected", (f"{n} entries are masked although --no-causal was given")
        if np.array_equal(pattern, lower) or np.array_equal(pattern, ~expected):
            what = ("the earlier tokens and each token itself ({n} entries: the diagonal and "
                    "below)" if np.array_equal(pattern, ~expected) else
                    "the earlier tokens ({n} entries below the diagonal)").format(n=n)
            return "mask_reversed", (f"the mask is reversed: it blocks {what} and lets every "
                                     "token see the ones after it; block key j > query i")
        if not pattern.any():
            return "mask_missing", "the mask line blocks nothing: every score reaches softmax"
        if np.array_equal(pattern, expected | np.eye(T, dtype=bool)):
            return "mask_diagonal", "the mask also blocks each token from itself (the diagonal)"
        if d > ATOL and np.array_equal(pattern, expected):
            return "mask_changes_scores", f"the mask also changes unmasked scores (by up to {d:.3g})"
        return "mask_wrong", (f"the mask blocks {n} entries, {int((pattern & ~expected).sum())} of "
                              f"them not causal ones, and misses {int((expected & ~pattern).sum())}")

    def _mask_after_softmax(self, soft: OpRecord, expected: np.ndarray
                            ) -> tuple[OpRecord, float] | None:
        """An op after softmax that blocks exactly the causal entries of the weights."""
        for op in self.flow.ops[soft.index + 1:]:
            if not self.flow.from_x[op.index] or op.name not in MASK_OPS:
                continue
            xs = self.flow.x_inputs(op)
            before, after = _f64(self.flow.snap(xs[0]).values), _f64(op.out.values)
            if before.shape != after.shape or after.shape[-1] != self.T:
                continue
            changed = (before != after) & ~(np.isnan(before) & np.isnan(after))
            flat = changed.reshape(-1, self.T, self.T)
            if all(np.array_equal(f & ~expected, np.zeros_like(f)) for f in flat) and changed.any():
                return op, max_diff(after, before)
        return None

    def softmax_rows(self) -> list[_Row]:
        rows = []
        for stage in self.trace.stages:
            if stage.kind != "softmax" or self._is_sdpa(stage):
                continue
            ops = self.main_ops(stage, SOFTMAXES)
            if not ops:
                continue
            op = ops[0]
            logits = _f64(self.flow.snap(self.flow.x_inputs(op)[0]).values)
            got = _f64(op.out.values)
            good, d = close(got, softmax(logits, -1), 1.0)
            diag = None
            if not good:
                diag = self._softmax_diagnosis(logits, got)
            rows.append(self.row(stage, "softmax", good, d,
                                 "each query's row normalised over the keys",
                                 source=op.source, diagnosis=diag))
        return rows

    def _softmax_diagnosis(self, logits: np.ndarray, got: np.ndarray) -> tuple[str, str]:
        names = {logits.ndim - 2: "the query axis: every column sums to 1",
                 logits.ndim - 3: "the head axis: the heads' weights for one entry sum to 1",
                 0: "the batch axis"}
        for axis in range(logits.ndim - 1):
            if np.allclose(got, softmax(logits, axis), atol=ATOL, rtol=RTOL, equal_nan=True):
                dim = axis - logits.ndim
                return "softmax_wrong_axis", (f"softmax over the wrong axis (dim={dim}, "
                                              f"{names.get(axis, 'axis ' + str(axis))}): each "
                                              "query's row must be normalised over the keys, "
                                              "dim=-1")
        sums = got.sum(axis=-1)
        return "softmax_wrong", (f"the weights are not a softmax of the scores over the keys "
                                 f"(row sums range {np.nanmin(sums):.4f} to {np.nanmax(sums):.4f})")

    def dropout_rows(self) -> list[_Row]:
        rows = []
        for stage in self.trace.stages:
            if stage.kind != "dropout":
                continue
            ops = self.main_ops(stage, DROPOUTS)
            if not ops:
                continue
            op = ops[0]
            before = _f64(self.flow.snap(self.flow.x_inputs(op)[0]).values)
            d = max_diff(op.out.values, before)
            good = d <= ATOL
            diag = None
            if not good:
                p = op.kwarg("p", next((a for a in op.scalars() if isinstance(a, float)), None))
                training = op.kwarg("training", next((a for a in op.scalars() if isinstance(a, bool)), None))
                zeroed = int(((_f64(op.out.values) == 0) & (before != 0)).sum())
                again = self._runs_differ()
                mode = ("the module is in eval mode, but this dropout ran with training=True"
                        if training is True and not self.facts.training else
                        "the module is in training mode")
                diag = ("dropout_active",
                        f"dropout is active: {mode}, so it zeroed {zeroed} of {before.size} "
                        f"entries and scaled the rest by 1/(1-p)"
                        f"{f' (p={p})' if isinstance(p, float) else ''}; {again}. Call "
                        f"module.eval(), or pass training=self.training to F.dropout")
            rows.append(self.row(stage, "dropout", good, d,
                                 "dropout leaves the numbers unchanged in eval mode",
                                 source=op.source, diagnosis=diag))
        return rows

    def _runs_differ(self) -> str:
        second = self.facts.second
        if second is None:
            return "a second run was not made"
        for a, b in zip(self.flow.ops, second.ops, strict=False):
            if a.name != b.name or any(
                    x.shape != y.shape or max_diff(x.values, y.values) > 0
                    for x, y in zip(a.outputs, b.outputs, strict=False)):
                return (f"two runs of the forward on the same input differ, first at line "
                        f"{a.source.line}")
        return "two runs of the forward gave the same numbers"

    def attend_rows(self) -> list[_Row]:
        rows = []
        for stage in self.trace.stages:
            if stage.kind != "attend" or self._is_sdpa(stage):
                continue
            ops = self.main_ops(stage, {"matmul", "bmm", "einsum", "baddbmm"})
            worst, ok = 0.0, bool(ops)
            for op in ops:
                expected = recompute(self.flow, op)
                if expected is None:
                    continue
                good, d = close(op.out.values, expected.reshape(op.out.shape))
                ok &= good
                worst = max(worst, d)
            rows.append(self.row(stage, "attend", ok, worst,
                                 "context = weights_i @ V_i for every head"))
        return rows

    # ------------------------------------------------------------ concat

    def attend_output(self) -> np.ndarray | None:
        """The heads' contexts as (B, h, T, d_h), from the attend op(s)' own outputs."""
        outs: list[tuple[int | None, np.ndarray]] = []
        for stage in self.trace.stages:
            if stage.kind != "attend":
                continue
            if self._is_sdpa(stage):
                op = next(op for op in stage.ops if op.name == "scaled_dot_product_attention")
                return self.heads_axis(_f64(op.out.values))
            for op in self.main_ops(stage, {"matmul", "bmm", "einsum", "baddbmm"}):
                values = _f64(op.out.values)
                if op.name == "einsum":
                    spec = _einsum_spec(op)
                    if spec is None:
                        return None
                    (la, lb), out = spec
                    d = next((c for c in lb if c not in la), None)
                    k = next((c for c in la if c in lb and c not in out), None)
                    q = next((c for c in la if c not in lb and c in out), None)
                    if d is None or q is None or k is None:
                        return None
                    batch = [c for c in out if c not in (q, d)]
                    values = np.einsum(f"{out}->{''.join(batch)}{q}{d}", values)
                outs.append((self.head_index(op), values))
        if not outs:
            return None
        if len(outs) > 1:
            return np.stack([v.reshape(self.B, self.T, -1) for _, v in
                             sorted(outs, key=lambda o: o[0] or 0)], axis=1)
        values = outs[0][1]
        if values.ndim == 4 and values.shape[1] != self.h and values.shape[2] == self.h:
            values = values.transpose(0, 2, 1, 3)  # (B, T, h, d_h) from an einsum
        return self.heads_axis(values)

    def concat_rows(self) -> list[_Row]:
        rows = []
        context = self.attend_output()
        for stage in self.trace.stages:
            if stage.kind != "concat":
                continue
            ops = [op for op in stage.ops if self.flow.from_x[op.index]]
            if not ops or context is None:
                rows.append(self.row(stage, "concat", None, None, "not judged"))
                continue
            final = _f64(ops[-1].out.values)
            if final.size != context.size:
                rows.append(self.row(stage, "concat", None, None, "not judged (sizes differ)"))
                continue
            got = final.reshape(self.B, self.T, self.h * context.shape[-1])
            expected = context.transpose(0, 2, 1, 3).reshape(got.shape)
            good, d = close(got, expected)
            diag = None
            if not good:
                if np.allclose(got.reshape(-1), context.reshape(-1), atol=ATOL, rtol=RTOL):
                    diag = ("merge_without_transpose",
                            "heads merged without moving the head axis back: (B, h, T, d_h) was "
                            "viewed as (B, T, C) directly, so token t's row holds pieces of other "
                            "tokens from one head; transpose(1, 2) first, then "
                            "contiguous().view(B, T, C)")
                elif np.allclose(np.sort(got.reshape(-1)), np.sort(context.reshape(-1)),
                                 atol=ATOL, rtol=RTOL):
                    diag = ("merge_permuted", "the concatenated heads hold the right numbers in "
                                              "the wrong places (a permutation)")
                else:
                    diag = ("merge_wrong", "the concatenation is not the heads' contexts")
            culprit = next((op for op in reversed(ops) if op.name in ("view", "reshape", "flatten",
                                                                      "cat", "concat")), ops[-1])
            rows.append(self.row(stage, "concat", good, d,
                                 f"head i's context in channels [{self.d_h}i, {self.d_h}i+"
                                 f"{self.d_h}) of its token's row",
                                 source=culprit.source if not good else None, diagnosis=diag))
        return rows

    # ------------------------------------------------------------ output projection

    def output_projection_rows(self) -> list[_Row]:
        stages = [s for s in self.trace.stages if s.kind == "w_o"]
        if stages:
            return [self.linear_row(s, "w_o") for s in stages]
        if self.trace.failed:
            return []
        used = {r.name for op in self.flow.ops for r in op.inputs if r.kind == "param"}
        unused = [(n, s) for n, s in self.facts.parameters if n not in used and len(s) == 2]
        last = self.flow.ops[-1] if self.flow.ops else None
        src = last.source if last is not None else None
        if unused:
            name, shape = unused[0]
            return [self.row(None, "w_o", False, None,
                             "the concatenated heads go through the output projection",
                             source=src, position=len(self.trace.stages) + 1,
                             diagnosis=("no_output_projection",
                                        f"no output projection: the module has {name} "
                                        f"{tuple(shape)} but its forward never uses it, so the "
                                        "concatenated heads are returned unmixed"))]
        self.differences.append("has no output projection (the heads' concatenation is the "
                                "output, as in Raschka's MultiHeadAttentionWrapper): compared "
                                "with a reference whose W_O is the identity")
        return []

    # ------------------------------------------------------------ sdpa

    def _is_sdpa(self, stage: Stage) -> bool:
        return any(op.name == "scaled_dot_product_attention" for op in stage.ops)

    def sdpa_rows(self) -> list[_Row]:
        """F.scaled_dot_product_attention, judged as a whole from its own q, k, v.

        The recogniser shows it expanded into scores, scale, mask, softmax and attend (its
        own computation); the module ran one fused op, so the op's output is compared with
        causal attention computed here from the op's inputs, and a mismatch is put on the
        step whose variant (another scale, no mask) reproduces the output.
        """
        rows: list[_Row] = []
        done: set[int] = set()
        for stage in self.trace.stages:
            if not self._is_sdpa(stage):
                continue
            op = next(op for op in stage.ops if op.name == "scaled_dot_product_attention")
            if op.index in done:
                continue
            done.add(op.index)
            kinds = [s for s in self.trace.stages if op in s.ops]
            good, diff, diag = self._judge_sdpa(op)
            wrong = "" if diag is None else "attend" if diag[0] in ("sdpa_wrong", "dropout_active") \
                else "scale" if "scale" in diag[0] else "mask"
            checked = {
                "scores": "Q_i @ K_i^T for every head, inside the fused op",
                "scale": f"scaled by 1/sqrt(d_h) = {1 / math.sqrt(self.d_h):.4f} inside the fused op",
                "mask": "blocks exactly the causal entries, inside the fused op",
                "softmax": "rows normalised over the keys, inside the fused op",
                "attend": "F.scaled_dot_product_attention = softmax(Q K^T / sqrt(d_h) + causal "
                          "mask) V, recomputed here from its q, k, v",
            }
            seen_kinds = set()
            for s in kinds:
                seen_kinds.add(s.kind)
                is_wrong = s.kind == wrong
                rows.append(self.row(s, s.kind, not is_wrong, diff if s.kind in (wrong, "attend") else None,
                                     checked.get(s.kind, "inside the fused op"), source=op.source,
                                     diagnosis=diag if is_wrong else None))
            if wrong and wrong not in seen_kinds:
                rows.append(self.row(None, wrong, False, diff, checked[wrong], source=op.source,
                                     diagnosis=diag,
                                     position=self.trace.stages.index(kinds[0]) + 0.5 if kinds else 0))
            self.differences.append("computes attention with F.scaled_dot_product_attention "
                                    "(scores, scale, mask, softmax and attend in one fused op): "
                                    "equivalent" if good else "")
        return rows

    def _judge_sdpa(self, op: OpRecord) -> tuple[bool, float, tuple[str, str] | None]:
        q, k, v = (_f64(self.flow.snap(r).values) for r in self.flow.tensor_operands(op)[:3])
        d = q.shape[-1]
        T = q.shape[-2]
        expected_mask = causal_set(T) if self.facts.causal else np.zeros((T, T), bool)

        def attention(factor: float, mask: np.ndarray) -> np.ndarray:
            scores = q @ np.swapaxes(k, -1, -2) * factor
            return softmax(np.where(mask, -np.inf, scores)) @ v

        good, diff = close(op.out.values, attention(1 / math.sqrt(d), expected_mask))
        if good:
            return True, diff, None
        p = op.kwarg("dropout_p", 0.0)
        if isinstance(p, float) and p > 0:
            return False, diff, ("dropout_active",
                                 f"dropout is active inside F.scaled_dot_product_attention "
                                 f"(dropout_p={p}): {self._runs_differ()}; pass "
                                 "dropout_p=self.dropout if self.training else 0.0")
        for factor in (1 / math.sqrt(self.C), 1.0, 1 / d, math.sqrt(d)):
            if close(op.out.values, attention(factor, expected_mask))[0]:
                return False, diff, self._scale_diagnosis(factor)
        if close(op.out.values, attention(1 / math.sqrt(d), np.zeros_like(expected_mask)))[0]:
            return False, diff, ("mask_missing", "F.scaled_dot_product_attention ran without the "
                                                 "causal mask: the output equals unmasked attention "
                                                 "(is_causal=True, or an attn_mask, is missing)")
        if close(op.out.values, attention(1 / math.sqrt(d), ~expected_mask))[0] or close(
                op.out.values, attention(1 / math.sqrt(d), np.tril(np.ones_like(expected_mask), -1)))[0]:
            return False, diff, ("mask_reversed", "F.scaled_dot_product_attention's mask is "
                                                  "reversed: it blocks the earlier tokens")
        return False, diff, ("sdpa_wrong", "F.scaled_dot_product_attention's output is not causal "
                                           "attention with 1/sqrt(d_h) scaling of its q, k, v")

    # ------------------------------------------------------------ ordering

    def _position_of(self, kind: str) -> int | None:
        for i, stage in enumerate(self.trace.stages):
            if stage.kind == kind:
                return i
        return None

    def _position_after(self, kind: str) -> float:
        i = self._position_of(kind)
        return (i if i is not None else len(self.trace.stages)) + 0.5

    def _position_before(self, kind: str) -> float:
        i = self._position_of(kind)
        return (i if i is not None else len(self.trace.stages)) - 0.5

    # ------------------------------------------------------------ the whole

    def run(self) -> Verdict:
        rows: list[_Row] = []
        for make in (self.project_rows, self.split_rows, self.scores_rows, self.scale_rows,
                     self.mask_rows, self.softmax_rows, self.dropout_rows, self.attend_rows,
                     self.sdpa_rows, self.concat_rows, self.output_projection_rows, self.op_rows):
            try:
                rows.extend(make())
            except Exception as error:  # a module no rule foresaw: say so, go on
                kind = make.__name__.removesuffix("_rows").removeprefix("output_projection")
                rows.append(self.row(None, kind or "w_o", None, None,
                                     f"not judged: mha-tui could not read this module's "
                                     f"{kind or 'output projection'} ({type(error).__name__}: "
                                     f"{error})", position=len(self.trace.stages)))
        order = {stage.id: i for i, stage in enumerate(self.trace.stages)}
        for r in rows:
            if r.verdict.stage_id in order and not r.position:
                r.position = order[r.verdict.stage_id]
        claimed = {r.verdict.stage_id for r in rows if r.verdict.kind != "op" and r.verdict.stage_id}
        rows = [r for r in rows if r.verdict.kind != "op" or r.verdict.stage_id not in claimed]
        rows.sort(key=lambda r: r.position)
        crash = self.crash()
        self.notice_differences()
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
                end, mismatch = self.end_to_end()
            except Exception:  # no comparison rather than no verdict
                end, mismatch = None, None
            if end is not None and end.ok is False and diagnosis is None:
                diagnosis = mismatch
        equivalent = diagnosis is None and all(v.ok is not False for v in verdicts) and (
            end is None or end.ok is not False)
        return Verdict(self.label, equivalent, tuple(verdicts), diagnosis,
                       tuple(d for d in dict.fromkeys(self.differences) if d), end)

    def project_rows(self) -> list[_Row]:
        return [self.linear_row(s, "project") for s in self.trace.stages if s.kind == "project"]

    def scores_rows(self) -> list[_Row]:
        return [self.scores_row(s) for s in self.trace.stages
                if s.kind == "scores" and not self._is_sdpa(s)]

    def op_rows(self) -> list[_Row]:
        return [self.row(s, "op", None, None, "an op no rule of mha-tui recognises: not judged "
                                              "on its own") for s in self.trace.stages
                if s.kind == "op"]

    def crash(self) -> tuple[StageVerdict, Diagnosis] | None:
        error = self.flow.rec.error
        if error is None:
            return None
        file, line = self.where(error.source)
        stage = next((s for s in self.trace.stages if s.kind == "error"), None)
        message = f"the forward raised {error.type}: {error.message}"
        verdict = StageVerdict(stage.id if stage else "error", "error", False, None, file, line,
                               "the forward runs to the end")
        return verdict, Diagnosis("crash", file, line, message, "error")

    def notice_differences(self) -> None:
        """Legitimate differences from the reference, said from what the ops did."""
        ops = self.flow.ops
        names = {op.name for op in ops if self.flow.from_x[op.index]}
        project = [op for op in ops if self.flow.kind(op) == "project"
                   and _linear_parts(self.flow, op) is not None]
        if any(_linear_parts(self.flow, op)[2] is not None for op in project):  # type: ignore[index]
            self.differences.append("its projections have biases: the reference gets the same "
                                    "biases, equivalent")
        if len(project) == 1 and project[0].out.shape[-1] == 3 * self.C:
            self.differences.append("computes Q, K and V with one fused (C, 3C) projection and "
                                    "splits it: equivalent")
        heads = {self.head_index(op) for op in project} - {None}
        if len(heads) > 1:
            self.differences.append(f"runs each of the {len(heads)} heads as its own module and "
                                    "concatenates their outputs: equivalent")
        if "einsum" in names:
            self.differences.append("uses einsum for the products: equivalent")
        if any(op.name in ("matmul", "mm", "addmm") for op in project):
            self.differences.append("stores its weights as (in, out) and computes x @ W: "
                                    "equivalent")
        mask_i = self._position_of("mask")
        scale_i = self._position_of("scale")
        if mask_i is not None and scale_i is not None and mask_i < scale_i:
            self.differences.append("masks the scores before scaling them: -inf / sqrt(d_h) is "
                                    "still -inf, equivalent")

    # ------------------------------------------------------------ end to end

    def role_weights(self) -> RoleWeights | None:
        """Each role's weight and bias in nn.Linear's (out, in) layout, found by following
        the tensors the scores and attend ops used back to their projection: a fused
        projection's block by the values of its slice, per-head layers stacked by head."""
        parts: dict[str, list[tuple[int, np.ndarray, np.ndarray | None]]] = {"Q": [], "K": [], "V": []}
        how: list[str] = []
        for role, entries in self.head_operands().items():
            done: set[int] = set()
            for _, ref, _ in entries:
                part, _, product, _ = self._chain_to_projection(ref)
                if part is None or product is None:
                    return None
                if product.index in done:
                    continue
                done.add(product.index)
                _, w, b = _linear_parts(self.flow, product)  # type: ignore[misc]
                out = _f64(product.out.values)
                width = part.shape[-1]
                if out.shape[-1] != width:
                    key = np.sort(_f64(part).reshape(-1))
                    start = next((o for o in range(0, out.shape[-1] - width + 1, width)
                                  if np.array_equal(np.sort(out[..., o:o + width].reshape(-1)), key)),
                                 None)
                    if start is None:
                        return None
                    w = w[start:start + width]
                    b = None if b is None else b[start:start + width]
                    how.append("a fused layer cut by role")
                head = self.head_index(product)
                parts[role].append((head or 0, w, b))
        result: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for role, items in parts.items():
            if not items:
                return None
            items.sort(key=lambda t: t[0])
            weight = np.concatenate([w for _, w, _ in items], axis=0)
            biases = [b for _, _, b in items]
            bias = None if any(b is None for b in biases) else np.concatenate(biases)  # type: ignore[arg-type]
            if weight.shape != (self.C, self.C):
                return None
            if len(items) > 1:
                how.append(f"{role}: {len(items)} heads' layers stacked")
            result[role] = (weight, bias)
        o = None
        for op in self.flow.ops:
            if self.flow.kind(op) == "w_o":
                lin = _linear_parts(self.flow, op)
                if lin is not None and lin[1].shape == (self.C, self.C):
                    o = (lin[1], lin[2])
        return RoleWeights(result["Q"], result["K"], result["V"], o, tuple(dict.fromkeys(how)))

    def end_to_end(self) -> tuple[StageVerdict | None, Diagnosis | None]:
        reference = self.facts.reference
        out_ref = self.flow.rec.output
        if reference is None or out_ref is None:
            return None, None
        weights = self.role_weights()
        if weights is None:
            return None, None
        x = next((snap.values for name, snap in self.flow.rec.inputs if name in self.flow.x_names), None)
        if x is None:
            return None, None
        expected = reference(np.asarray(x), weights, self.h, self.facts.causal)
        got = _f64(self.flow.snap(out_ref).values)
        if got.size != expected.size:
            return None, None
        got = got.reshape(expected.shape)
        good, d = close(got, expected)
        last = self.flow.ops[out_ref.op] if out_ref.op is not None else None
        file, line = self.where(last.source if last is not None else None)
        how = "; ".join(weights.how)
        verdict = StageVerdict("", "end_to_end", good, d, file, line,
                               f"output = {self.facts.reference_name} with these weights copied in "
                               f"by role{f' ({how})' if how else ''}")
        diag = Diagnosis("output_differs", file, line,
                         f"every stage checked out, but the output differs from the reference by "
                         f"up to {d:.3g}", "end_to_end")
        return verdict, diag


def _ratio(after: np.ndarray, before: np.ndarray) -> float | None:
    """after / before where both are finite and before is not tiny; None if not one number."""
    if after.shape != before.shape:
        try:
            after, before = np.broadcast_arrays(after, before)
        except ValueError:
            return None
    usable = np.isfinite(after) & np.isfinite(before) & (np.abs(before) > 1e-6) & \
        (before > LARGE_NEGATIVE)
    if not usable.any():
        return None
    ratios = after[usable] / before[usable]
    r = float(np.median(ratios))
    return r


# ---------------------------------------------------------------------------- entry point


def judge(trace: Trace, facts: Facts, label: str = "") -> Verdict:
    """Judge every stage of a traced forward; see the module docstring."""
    if trace.recording is None:
        raise ValueError("judge() needs a trace that holds its recording")
    label = label or (trace.module.class_name if trace.module else trace.recording.module_class)
    return Judge(trace, facts, label).run()


def failed_to_load(label: str, message: str) -> Verdict:
    """A module that could not be built: not equivalent, with the loader's one line."""
    return Verdict(label, False, (), Diagnosis("load_error", "", 0, message, "load"))
