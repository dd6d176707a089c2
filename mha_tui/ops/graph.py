"""The one graph of a recorded forward: each op's producers and consumers, which ops depend
on the forward's input x, and the kind each op was given. Built once per recording; every
rule reads it, and the stage builders after them.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from ..records import OpRecord, Recording, Ref, Snapshot, TensorArg
from .vocab import very_negative

# Ops whose tensors after the first lend only a dtype, device or shape, never values:
# `cache.to(xq)`, `mask.type_as(x)`, `bias.expand_as(scores)`. A tensor made so from a
# constant does not depend on x (Meta's Llama moves its K/V cache with `.to(xq)`).
FIRST_INPUT_ONLY = frozenset({"to", "type_as", "expand_as", "view_as", "reshape_as"})
# Ops that take only a dtype, device or shape from every tensor they are given: a new tensor
# of a value (gpt-oss's `Q.new_full((n, n), -inf)`, timm's `attn.new_full(...)`,
# `torch.zeros_like(scores)`). What they make does not depend on the tensor's values.
NO_VALUE_INPUTS = frozenset({"new_full", "new_zeros", "new_ones", "new_empty", "full_like",
                             "zeros_like", "ones_like", "empty_like"})


def value_inputs(op: OpRecord) -> tuple[Ref, ...]:
    """The inputs whose values the op's output is made from."""
    if op.name in NO_VALUE_INPUTS:
        return ()
    return op.inputs[:1] if op.name in FIRST_INPUT_ONLY else op.inputs


def reaching_output(rec: Recording) -> list[bool]:
    """Per op, whether its output reaches what the forward returned (through the inputs
    whose values make each op's output)."""
    reaches = [False] * len(rec.ops)
    if rec.output is None or rec.output.kind != "op" or rec.output.op is None:
        return reaches
    reaches[rec.output.op] = True
    for op in reversed(rec.ops):  # every consumer comes after what it consumes
        if reaches[op.index]:
            for ref in value_inputs(op):
                if ref.kind == "op" and ref.op is not None:
                    reaches[ref.op] = True
    return reaches


def two_sequences(rec: Recording) -> tuple[frozenset[str], frozenset[str]]:
    """Cross-attention's two sequences among the forward's inputs: the names the queries'
    tensor came in by (x; `query`), and those of a second 3-D float tensor (the context;
    `key` and `value`). Empty sets in self-attention (x alone, or x given three times)."""
    floats = [(name, snap) for name, snap in rec.inputs
              if snap.ndim == 3 and snap.dtype.startswith(("float", "bfloat"))]
    if not floats:
        return frozenset(), frozenset()
    x = floats[0][1]
    other = next((snap for _, snap in floats if snap.storage != x.storage), None)
    if other is None:
        return frozenset(), frozenset()
    return (frozenset(name for name, snap in floats if snap.storage == x.storage),
            frozenset(name for name, snap in floats if snap.storage == other.storage))


def read_only_by_python(rec: Recording) -> frozenset[int]:
    """The ops that only feed values to Python: `print(w.sum().item())`, `if mask.any():`.
    Each one's result was read by Python (`Recording.read`) or goes only to such ops, and
    none reaches the output. They change no tensor the output depends on, so they are no
    stage. A forward that raised returned nothing to reach: every op is kept. (The torch
    tracer leaves them out of its recording already: see `python_only`.)"""
    if not rec.read or rec.error is not None:
        return frozenset()
    return python_only([op.name for op in rec.ops], [op.inputs for op in rec.ops], rec.read,
                       rec.output, {op.index for op in rec.ops if writes(op)})


def writes(op: OpRecord) -> bool:
    """An op that writes into a tensor or draws from a generator of its own: never one that
    only feeds Python, whatever reads it (a write is a change of state)."""
    return op.in_place or op.kwarg("out") is not None or op.kwarg("generator") is not None


def python_only(names: Sequence[str], inputs: Sequence[tuple[Ref, ...]], read: Collection[int],
                output: Ref | None, kept: Collection[int] = ()) -> frozenset[int]:
    """read_only_by_python on the parts of a recording (op i: names[i], inputs[i]), so that a
    tracer can ask it before it builds the ops: the ops Python read, or whose every consumer
    is such an op, that do not reach the output. `kept`: ops never counted so (writes)."""
    if not read:
        return frozenset()
    n = len(names)
    reaches = [False] * n
    if output is not None and output.kind == "op" and output.op is not None:
        reaches[output.op] = True
    consumers: dict[int, list[int]] = {}
    for i in range(n - 1, -1, -1):  # every consumer comes after what it consumes
        refs = inputs[i]
        for ref in refs:
            if ref.kind == "op" and ref.op is not None:
                consumers.setdefault(ref.op, []).append(i)
        if reaches[i]:
            for ref in (refs[:1] if names[i] in FIRST_INPUT_ONLY else refs):
                if ref.kind == "op" and ref.op is not None:
                    reaches[ref.op] = True
    only: set[int] = set()
    for i in range(n - 1, -1, -1):
        used = consumers.get(i, ())
        if not reaches[i] and i not in kept and (i in read or used) and \
                all(c in only for c in used):
            only.add(i)
    return frozenset(only)


class Graph:
    """The recording with the facts the rules read: producers, consumers, ancestry."""

    def __init__(self, rec: Recording, x_names: set[str] | None = None) -> None:
        self.rec = rec
        self.ops = rec.ops
        self.consumers: dict[int, list[int]] = {i: [] for i in range(len(rec.ops))}
        for op in rec.ops:
            for ref in op.inputs:
                if ref.kind == "op" and ref.op is not None:
                    self.consumers[ref.op].append(op.index)
        # x: a 3-D float input (else the first input); the check passes its own (judged_x).
        self.x_names = x_names if x_names is not None else {
            name for name, snap in rec.inputs
            if snap.dtype.startswith(("float", "bfloat")) and snap.ndim == 3}
        if not self.x_names and rec.inputs:
            self.x_names = {rec.inputs[0][0]}
        self.from_x = [False] * len(rec.ops)
        for op in rec.ops:
            self.from_x[op.index] = any(self.is_x(ref) for ref in value_inputs(op))
        # Which of the forward's inputs each op's values come from (cross-attention tells the
        # query's tokens from the context's by it).
        self.reads: list[frozenset[str]] = []
        for op in rec.ops:
            names: set[str] = set()
            for ref in value_inputs(op):
                if ref.kind == "input":
                    names.add(ref.name)
                elif ref.kind == "op" and ref.op is not None:
                    names |= self.reads[ref.op]
            self.reads.append(frozenset(names))
        # Cross-attention: the forward's inputs the queries come from, and those the keys and
        # values come from (empty in self-attention).
        self.query_names, self.key_names = two_sequences(rec)
        self.for_python = read_only_by_python(rec)  # no stage: see read_only_by_python
        self.kind: dict[int, str] = {}
        self.head: dict[int, int] = {}
        self.softmax_parts: set[int] | None = None
        self.fused: set[int] = set()  # ops whose output is a whole fused q|k|v projection

    def is_x(self, ref: Ref) -> bool:
        if ref.kind == "input":
            return ref.name in self.x_names
        return ref.kind == "op" and ref.op is not None and self.from_x[ref.op]

    def key_side(self, op_index: int) -> bool:
        """Cross-attention: the op's values come from the context alone (keys, values), not
        from the query sequence."""
        reads = self.reads[op_index]
        return bool(self.key_names) and bool(reads & self.key_names) and not reads & self.query_names

    def producer(self, ref: Ref) -> OpRecord | None:
        return self.ops[ref.op] if ref.kind == "op" and ref.op is not None else None

    def snap(self, ref: Ref) -> Snapshot:
        return self.rec.snapshot(ref)

    def x_inputs(self, op: OpRecord) -> list[Ref]:
        return [ref for ref in value_inputs(op) if self.is_x(ref)]

    def other_inputs(self, op: OpRecord) -> list[Ref]:
        return [ref for ref in op.inputs if not self.is_x(ref)]

    def tensor_operands(self, op: OpRecord) -> list[Ref]:
        """Tensor arguments in call order (einsum's operands come as a tuple), then those
        given by keyword (`baddbmm(bias, batch1=q, batch2=k)`), in the order given."""
        refs = []
        for arg in (*op.args, *(value for _, value in op.kwargs)):
            if isinstance(arg, TensorArg):
                refs.append(op.inputs[arg.index])
            elif isinstance(arg, tuple):
                refs.extend(op.inputs[a.index] for a in arg if isinstance(a, TensorArg))
        return refs

    def derives(self, ref: Ref, kinds: set[str], through: int = 64) -> bool:
        """Whether the tensor descends (through x-dependent ops) from an op of these kinds."""
        seen: set[int] = set()
        todo = [ref]
        while todo and through:
            through -= 1
            r = todo.pop()
            op = self.producer(r)
            if op is None or op.index in seen:
                continue
            seen.add(op.index)
            if self.kind.get(op.index) in kinds:
                return True
            todo.extend(i for i in op.inputs if self.is_x(i))
        return False

    def op_derives(self, op: OpRecord, kinds: set[str]) -> bool:
        return any(self.derives(ref, kinds) for ref in self.x_inputs(op))


# ---------------------------------------------------------------------- evidence from values


def scalar_operand(g: Graph, op: OpRecord) -> float | None:
    """The number an op multiplies or divides by: a Python scalar or a one-element tensor."""
    scalars = [a for a in op.scalars() if isinstance(a, int | float) and not isinstance(a, bool)]
    if scalars:
        return float(scalars[0])
    other = g.other_inputs(op)
    if len(other) == 1 and g.snap(other[0]).values.size == 1:
        return float(g.snap(other[0]).values.reshape(-1)[0])
    return None


def masks_somewhere(g: Graph, ref: Ref, sign: float = 1.0) -> bool:
    """The tensor, or the buffer it was sliced from, holds a mask value (a one-token slice of
    a causal mask is a single 0, but it is still the mask); sign -1: its negative does (a
    mask subtracted, `scores - 10000.0 * (1 - tril)`)."""
    for _ in range(8):
        values = g.snap(ref).values
        if very_negative(-values if sign < 0 and values.dtype.kind == "f" else values):
            return True
        op = g.producer(ref)
        if op is None or not op.inputs:
            return False
        ref = op.inputs[0]
    return False


@dataclass(frozen=True)
class HandWrittenSoftmax:
    """One softmax written out by hand: e = exp(s) (or exp(s - m)), then e / sum(e)."""

    divide: OpRecord
    exp: OpRecord
    total: OpRecord
    shifted: OpRecord | None
    """The sub whose result exp reads, when there is one."""
    peak: OpRecord | None
    """The max the sub takes away, when it is the maximum of the same scores (the
    numerically stable form)."""

    @property
    def parts(self) -> list[int]:
        """Its ops' indices, each one the recogniser gives the softmax kind."""
        found = [self.exp.index, self.total.index, self.divide.index]
        if self.shifted is not None and self.peak is not None:
            found += [self.shifted.index, self.peak.index]
        return found

    @property
    def scores(self) -> Ref:
        """The tensor the chain started from: the sub's first input, else exp's."""
        return self.shifted.inputs[0] if self.shifted is not None else self.exp.inputs[0]


def hand_written_softmaxes(g: Graph, ops: Iterable[OpRecord] | None = None) -> list[HandWrittenSoftmax]:
    """Every softmax written out by hand among `ops` (all the graph's by default), found at its
    division: e / sum(e) where e = exp(...). The one matcher: the recogniser's rule and the
    judge both read it."""
    found = []
    for op in g.ops if ops is None else ops:
        if op.name not in {"div", "true_divide"} or len(op.inputs) != 2:
            continue
        e, total = g.producer(op.inputs[0]), g.producer(op.inputs[1])
        if e is None or total is None or e.name != "exp" or total.name != "sum":
            continue
        if not total.inputs or total.inputs[0].op != e.index or not e.inputs:
            continue
        shifted = g.producer(e.inputs[0])
        if shifted is None or shifted.name != "sub" or not shifted.inputs:
            shifted = None
        peak = None
        if shifted is not None and len(shifted.inputs) == 2:
            candidate = g.producer(shifted.inputs[1])
            if candidate is not None and candidate.name in {"max", "amax"} and candidate.inputs and \
                    _same(candidate.inputs[0], shifted.inputs[0]):
                peak = candidate
        found.append(HandWrittenSoftmax(op, e, total, shifted, peak))
    return found


def _same(a: Ref, b: Ref) -> bool:
    return a.kind == b.kind and a.op == b.op and a.output == b.output and a.name == b.name
