"""What every kind's judge() shares: the trace and its graph, the sizes, each op's stage, a
row of the verdict, and the walks that several kinds need (the head-form operands of the
products, back to the projection they were cut from).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import numpy as np

from ...ops.graph import Graph, hand_written_softmaxes
from ...ops.numeric import (
    einsum_spec,
    f64,
    head_axis_product,
    linear_parts,
    max_diff,
    ratio,
    token_axes,
)
from ...ops.sizes import Sizes
from ...ops.vocab import SCALE_OPS, SHAPE_OPS, SOFTMAXES
from ...records import OpRecord, Recording, Ref, Stage, Statement, TensorArg, Trace
from ...records.verdict import Diagnosis, Facts, Reference, StageVerdict

F = TypeVar("F", bound="Found")

# The parameters the loader passes a mask by (load.learner.MASK_NAMES, load.signature's
# padding names): a float mask there (Hugging Face's additive (B, 1, T, T) attention_mask)
# is never x. Spelled here because kinds sit below load.
_MASK_INPUTS = frozenset({"mask", "attn_mask", "src_mask", "tgt_mask", "memory_mask",
                          "attention_mask", "key_padding_mask", "padding_mask",
                          "src_key_padding_mask", "pad_mask", "tgt_key_padding_mask",
                          "encoder_padding_mask", "self_attn_padding_mask"})


def judged_x(rec: Recording) -> set[str]:
    """The forward's inputs the check follows as x: every float input (q, k and v when given
    apart), never a mask the loader passes by name (NumPy's additive mask is a float array
    too, and so is Hugging Face's 4-D attention_mask). The recogniser follows only a 3-D x
    (or the first input)."""
    float_inputs = {name for name, snap in rec.inputs if snap.dtype.startswith(("float", "bfloat"))
                    and name not in _MASK_INPUTS}
    return float_inputs or {name for name, _ in rec.inputs[:1]}


class Found(Protocol):
    """A mechanism found again from a stage's ops (a rotation, a repeat of K/V heads): its
    ops, and the tensor it made (whose role, Q, K or V, the judge reads)."""

    after: Ref


def judge_found(j: Judge, kind: str, find: Callable[[Graph, Stage], Sequence[F]],
                judged: Callable[[Judge, Graph, Stage, list[tuple[str, F]]], Row],
                what: str) -> list[Row]:
    """Each stage of a kind whose judge finds its mechanism again with the recogniser's own
    functions (rotary's rotations, kv_repeat's repeats) on the classified graph: `find`
    gives those of one stage, `judged` judges them with the role each one's result became;
    a stage where none is found again is said not judged."""
    stages = [s for s in j.trace.stages if s.kind == kind]
    if not stages:
        return []
    g = j.classified()
    roles = j.roles_on_path()
    rows = []
    for stage in stages:
        found = find(g, stage)
        if not found:
            rows.append(j.row(stage, kind, None, None,
                              f"not judged: {what} could not be found again from the ops"))
            continue
        rows.append(judged(j, g, stage, [(roles.get(x.after.op or -1, "?"), x) for x in found]))
    return rows


@dataclass
class Row:
    verdict: StageVerdict
    diagnosis: Diagnosis | None = None
    position: float = 0.0


@dataclass
class Judge:
    """One module's trace being judged; each kind module's judge(j) reads and adds to it."""

    trace: Trace
    facts: Facts
    label: str
    g: Graph = field(init=False)
    stage_of: dict[int, Stage] = field(init=False, default_factory=dict)
    sizes: Sizes = field(init=False)
    """B, T_q (`sizes.T`), C of x, the head split (h = the heads asked for), and T_k, the
    keys' length: the context's in cross-attention (`sizes.T_k`), else T_q."""
    differences: list[str] = field(default_factory=list)
    # What the reference grew into, in words (verdict._reference); "" for plain attention.
    grown: str = ""
    # The same, with each mechanism's parameters, for the JSON verdict; None until computed.
    compared_with: Reference | None = None
    _classified: Graph | None = field(default=None, repr=False)
    _second: tuple[Recording | None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        assert self.trace.recording is not None
        self.g = Graph(self.trace.recording, x_names=judged_x(self.trace.recording))
        for stage in self.trace.stages:
            for op in stage.ops:
                self.stage_of.setdefault(op.index, stage)
        x = next((snap for name, snap in self.g.rec.inputs if name in self.g.x_names), None)
        shape = x.shape if x is not None else (1, self.trace.config.T_q, self.trace.config.embed_dim)
        B, T_q, C = (1, *shape)[-3:] if len(shape) == 2 else shape[:3]
        # Cross-attention: the context's length (the keys'), else T_q.
        context = dict(self.g.rec.inputs).get(min(self.g.key_names)) if self.g.key_names else None
        h = max(1, self.facts.heads)
        self.sizes = Sizes(B, T_q, C, h, max(1, C // h),
                           T_k=context.shape[-2] if context is not None else None)

    @property
    def B(self) -> int:
        return self.sizes.B

    @property
    def T_q(self) -> int:
        """The queries' length: x's tokens."""
        return self.sizes.T

    @property
    def T_k(self) -> int:
        """The keys' length: the context's in cross-attention, else T_q."""
        return self.sizes.keys

    @property
    def C(self) -> int:
        return self.sizes.C

    @property
    def h(self) -> int:
        return self.sizes.h

    @property
    def d_h(self) -> int:
        return self.sizes.d_h

    # ------------------------------------------------------------ helpers

    def where(self, source: Statement | None) -> tuple[str, int]:
        return (source.file, source.line) if source is not None else ("", 0)

    def row(self, stage: Stage | None, kind: str, ok: bool | None, diff: float | None,
            checked: str, *, source: Statement | None = None, note: str = "",
            diagnosis: tuple[str, str] | None = None, position: float = 0.0) -> Row:
        src = source or (stage.source if stage is not None else None)
        file, line = self.where(src)
        verdict = StageVerdict(stage.id if stage is not None else "", kind, ok, diff, file, line,
                               checked, note)
        diag = Diagnosis(diagnosis[0], file, line, diagnosis[1], kind) if diagnosis else None
        return Row(verdict, diag, position)

    def main_ops(self, stage: Stage, names: set[str]) -> list[OpRecord]:
        found = [op for op in stage.ops if op.name in names and self.g.from_x[op.index]]
        if not found and names is SOFTMAXES:
            return self._hand_written_softmax(stage)
        return found

    def _hand_written_softmax(self, stage: Stage) -> list[OpRecord]:
        """A softmax written out (exp(s - max) / sum(exp)) as one softmax op per division, as
        the recogniser's rule found it (ops.graph.hand_written_softmaxes): its input the scores
        the chain started from, its output the division's."""
        return [replace(found.divide, name="softmax", qualname="(written by hand)",
                        inputs=(found.scores,), args=(TensorArg(0),), kwargs=(("dim", -1),))
                for found in hand_written_softmaxes(self.g, stage.ops)]

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

    def tokens_last(self, values: np.ndarray) -> np.ndarray:
        """A tensor laid out as the scores product's output with its query and key token axes
        last, (..., T_q, T_k): labml's sequence-first einsum 'ibhd,jbhd->ijbh' keeps them
        first and the heads last, and every later step (scale, mask, softmax) keeps that
        layout. Any other tensor is returned as it is."""
        values = np.asarray(values)
        for stage in self.trace.stages:
            if stage.kind != "scores" or self.is_sdpa(stage):
                continue
            for op in self.main_ops(stage, {"einsum"}):
                q, k = token_axes(op)
                n = len(op.out.shape)
                if values.shape == op.out.shape and (q % n, k % n) != (n - 2, n - 1):
                    return np.moveaxis(values, (q, k), (-2, -1))
        return values

    def head_index(self, op: OpRecord) -> int | None:
        match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", op.module)
        return int(match.group(1)) if match else None

    # ------------------------------------------------------------ project / w_o

    def chain_to_projection(self, ref: Ref, *, through: bool = False, over_rotary: bool = False
                            ) -> tuple[np.ndarray | None, float, OpRecord | None, list[OpRecord]]:
        """Walk back from a head-form operand to the projection output it was cut from.

        Returns (the projection's part that became this operand -- for a fused projection
        the slice after its split --, the scale factor applied on the way, the projection's
        product op, the ops passed through, nearest first). The walk stops at an op that
        changes values (a roll, a relu) unless `through`: finding a role's weights for the
        reference goes on through it, the reference then shows what it changed.
        """
        factor = 1.0
        passed: list[OpRecord] = []
        values: list[np.ndarray] = []  # what each passed op made, on this path
        want = self.g.snap(ref).values.size
        for _ in range(48):
            op = self.g.producer(ref)
            if op is None:
                return None, factor, None, passed
            xs = self.g.x_inputs(op)
            if (self.kind(op) == "project" or head_axis_product(self.g, op)) \
                    and linear_parts(self.g, op) is not None:
                # the part: the tensor nearest the projection that has the operand's size
                chain = [op.outputs[ref.output].values, *reversed(values)]
                part = next((c for c in chain if c.size == want), None)
                return part, factor, op, passed
            if not xs:
                return None, factor, None, passed
            if self.kind(op) == "norm" and not through:  # a norm is no scale: stop
                return None, factor, None, passed
            if over_rotary and self.kind(op) == "rotary":
                # a turn keeps every pair's length: on to the tensor it turned (ESM's
                # `q *= scaling` before its rotary still scales the scores)
                ref = self._before_kind(ref, "rotary")
                continue
            if op.name in SCALE_OPS and op.out.values.dtype.kind != "c":  # complex: rotary
                r = ratio(f64(op.out.values), f64(self.g.snap(xs[0]).values))
                if r is not None:
                    factor *= r
            elif op.name not in SHAPE_OPS and not through:
                return None, factor, None, passed
            passed.append(op)
            values.append(op.outputs[ref.output].values)
            ref = xs[0]
        return None, factor, None, passed

    def _before_kind(self, ref: Ref, kind: str) -> Ref:
        """Back from a tensor made by ops of one kind to the tensor they started from."""
        for _ in range(64):
            op = self.g.producer(ref)
            if op is None or self.kind(op) != kind:
                return ref
            xs = self.g.x_inputs(op)
            if not xs:
                return ref
            ref = xs[0]
        return ref

    def canonical_projection(self, values: np.ndarray) -> np.ndarray:
        """A projection output as (B, T, width): torch's MHA works on (T, B, width)."""
        if values.ndim == 3 and values.shape[:2] == (self.T_q, self.B) and self.B != self.T_q:
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
            if self.is_sdpa(stage) and stage.kind == "attend":
                op = next(op for op in stage.ops if op.name == "scaled_dot_product_attention")
                for role, ref in zip("QKV", self.g.tensor_operands(op)[:3], strict=False):
                    found[role].append((self.g.snap(ref).values, ref, op))
                continue
            if stage.kind not in ("scores", "attend") or self.is_sdpa(stage):
                continue
            for op in self.main_ops(stage, {"matmul", "bmm", "baddbmm", "einsum"}):
                operands = self.g.tensor_operands(op)
                if op.name == "baddbmm":
                    operands = operands[1:]
                if len(operands) != 2:
                    continue
                a, b = operands
                if op.name == "einsum" and stage.kind == "attend" and self._weights_last(a, b):
                    a, b = b, a  # einsum(v, pattern, ...): ARENA's order
                if op.name == "einsum":
                    laid = self._einsum_layout(op, stage.kind, swapped=a is not operands[0])
                    if laid is None:
                        continue
                    (a_vals, b_vals) = laid
                else:
                    a_vals = self.g.snap(a).values
                    b_vals = np.swapaxes(self.g.snap(b).values, -1, -2) if stage.kind == "scores" \
                        else self.g.snap(b).values
                if stage.kind == "scores":
                    found["Q"].append((a_vals, a, op))
                    found["K"].append((b_vals, b, op))
                else:
                    found["V"].append((b_vals, b, op))
        return found

    def _weights_last(self, a: Ref, b: Ref) -> bool:
        """An attend product given (v, weights): b comes from the softmax, a does not."""
        g = self.classified()
        return g.derives(b, {"softmax"}) and not g.derives(a, {"softmax"})

    def _einsum_layout(self, op: OpRecord, kind: str, swapped: bool = False
                       ) -> tuple[np.ndarray, np.ndarray] | None:
        """einsum operands transposed to (batch..., token, channel) for Q/K, V."""
        spec = einsum_spec(op)
        operands = self.g.tensor_operands(op)
        if spec is None or len(operands) != 2:
            return None
        (la, lb), out = spec
        if swapped:
            la, lb, operands = lb, la, operands[::-1]
        if len(out) < 2:
            return None
        if kind == "scores":
            # the query's letter is the one only q has, the key's the one only k has (labml's
            # sequence-first 'ibhd,jbhd->ijbh' puts them first, heads last)
            q_only = [c for c in out if c in la and c not in lb]
            k_only = [c for c in out if c in lb and c not in la]
            if len(q_only) != 1 or len(k_only) != 1:
                return None
            q_letter, k_letter = q_only[0], k_only[0]
            contracted = [c for c in la if c in lb and c not in out]
            if len(contracted) != 1:
                return None
            d = contracted[0]
            batch = [c for c in out if c not in (q_letter, k_letter)]
            try:
                a = np.einsum(f"{la}->{''.join(batch)}{q_letter}{d}", self.g.snap(operands[0]).values)
                b = np.einsum(f"{lb}->{''.join(batch)}{k_letter}{d}", self.g.snap(operands[1]).values)
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
                          self.g.snap(operands[1]).values)
        except ValueError:
            return None
        return self.g.snap(operands[0]).values, b

    def softmax_ops(self) -> list[OpRecord]:
        ops = []
        for stage in self.trace.stages:
            if stage.kind == "softmax" and not self.is_sdpa(stage):
                ops.extend(self.main_ops(stage, SOFTMAXES))
        return ops

    def runs_differ(self) -> str:
        if self._second is None:  # the forward once more, made on the first question only
            self._second = (self.facts.second() if self.facts.second is not None else None,)
        second = self._second[0]
        if second is None:
            return "a second run was not made"
        for a, b in zip(self.g.ops, second.ops, strict=False):
            if a.name != b.name or any(
                    x.shape != y.shape or max_diff(x.values, y.values) > 0
                    for x, y in zip(a.outputs, b.outputs, strict=False)):
                return (f"two runs of the forward on the same input differ, first at line "
                        f"{a.source.line}")
        return "two runs of the forward gave the same numbers"

    def is_sdpa(self, stage: Stage) -> bool:
        return any(op.name == "scaled_dot_product_attention" for op in stage.ops)

    def position_of(self, kind: str) -> int | None:
        for i, stage in enumerate(self.trace.stages):
            if stage.kind == kind:
                return i
        return None

    def position_after(self, kind: str) -> float:
        i = self.position_of(kind)
        return (i if i is not None else len(self.trace.stages)) + 0.5

    def position_before(self, kind: str) -> float:
        i = self.position_of(kind)
        return (i if i is not None else len(self.trace.stages)) - 0.5


    def classified(self) -> Graph:
        """A graph of the same recording whose ops carry their stage's kind, as the
        recogniser's did: for the kinds whose judge finds its mechanism again with the
        recogniser's own functions (rotary's rotations, kv_repeat's repeats)."""
        if self._classified is None:
            graph = Graph(self.g.rec, x_names=self.g.x_names)
            graph.kind.update({i: stage.kind for i, stage in self.stage_of.items()})
            self._classified = graph
        return self._classified

    def roles_on_path(self) -> dict[int, str]:
        """Op index -> "Q", "K" or "V" for every op on the way from a projection to the
        operands of the scores and attend products: which role a tensor became."""
        found: dict[int, str] = {}
        for role, entries in self.head_operands().items():
            for _, ref, _ in entries:
                for op in self.chain_to_projection(ref, through=True)[3]:
                    found.setdefault(op.index, role)
        return found

    def kind(self, op: OpRecord | int) -> str:
        """The kind of the stage an op was shown in ("" for none)."""
        index = op if isinstance(op, int) else op.index
        stage = self.stage_of.get(index)
        return stage.kind if stage is not None else ""
