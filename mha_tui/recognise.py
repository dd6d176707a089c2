"""Turn a recorded forward (ops) into the stages a learner reads.

The one place that knows what "scores" or "mask" look like. Each rule is a small function
named after what it recognises, and its evidence is the op, the shapes, the values and
where each tensor came from -- never a variable name. The rules label every op that
depends on the forward's input x with a kind; ops that do not depend on x (a mask buffer
sliced, `torch.ones(T, T).triu()`) join the stage of the op that consumes them; an op no
rule claims becomes an `op` stage with its line and tensors: nothing is dropped.

Stages keep the module's own order (the order of each kind's first op). Ops of one kind
(the three projections; the per-head modules' scores) make one stage, their tensors side by
side; a per-head module's results are stacked along a head axis exactly as a fused module
holds them. `F.scaled_dot_product_attention` is expanded into scores, scale, mask, softmax
and attend, computed here from its recorded inputs as PyTorch documents its reference, and
labelled as mha-tui's own computation with an allclose check against the fused output.

Reads only records (NumPy arrays and plain values): never import torch, rich, textual or
typer here (an import-linter contract checks it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from .config import Config
from .records import (
    Check,
    ModuleCall,
    OpRecord,
    Recording,
    Ref,
    Snapshot,
    Source,
    Stage,
    TensorArg,
    TensorRecord,
)
from .stages import stage_info

MATMULS = {"matmul", "bmm", "mm", "einsum", "baddbmm", "rmatmul"}
PROJECTIONS = {"linear", "addmm", "matmul", "mm", "einsum", "rmatmul"}
SHAPE_OPS = {"view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze",
             "expand", "expand_as", "flatten", "unflatten", "swapaxes", "swapdims", "movedim",
             "t", "T", "mT", "float", "to", "type", "type_as", "clone", "detach", "getitem",
             "split", "chunk", "unbind", "tensor_split", "half", "double", "bool",
             "astype", "copy", "ravel"}  # NumPy's spellings
SPLITS = {"split", "chunk", "unbind", "tensor_split"}
SOFTMAXES = {"softmax", "_softmax", "softmax_"}
DROPOUTS = {"dropout", "dropout_", "feature_dropout", "alpha_dropout"}
LARGE_NEGATIVE = -1e4  # a "mask value": -inf, finfo.min, -1e9, -10000 ...


@dataclass(frozen=True)
class Embedded:
    """The embed stage's facts, gathered by the tracer: ids -> table rows -> x."""

    ids: Snapshot
    table: Snapshot
    x: Snapshot
    source: Source
    looked_up: bool
    table_name: str = "embedding.weight"


@dataclass(frozen=True)
class Sizes:
    """B, T, C of x and the head split the ops showed (h, d_h)."""

    B: int
    T: int
    C: int
    h: int
    d_h: int
    # False when x has no batch axis (NumPy's (T, C)): every dims label drops its B.
    batched: bool = True


@dataclass
class _Unit:
    """Ops of one kind grouped into a future stage."""

    kind: str
    ops: list[int] = field(default_factory=list)
    helpers: list[int] = field(default_factory=list)
    folded: list[int] = field(default_factory=list)  # identity dropouts shown with it


class Graph:
    """The recording with the facts the rules read: producers, consumers, ancestry."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self.ops = rec.ops
        self.consumers: dict[int, list[int]] = {i: [] for i in range(len(rec.ops))}
        for op in rec.ops:
            for ref in op.inputs:
                if ref.kind == "op" and ref.op is not None:
                    self.consumers[ref.op].append(op.index)
        self.x_names = {name for name, snap in rec.inputs
                        if snap.dtype.startswith("float") and snap.ndim == 3}
        if not self.x_names and rec.inputs:
            self.x_names = {rec.inputs[0][0]}
        self.from_x = [False] * len(rec.ops)
        for op in rec.ops:
            self.from_x[op.index] = any(self.is_x(ref) for ref in op.inputs)
        self.kind: dict[int, str] = {}
        self.head: dict[int, int] = {}
        self.softmax_parts: set[int] | None = None
        self.fused: set[int] = set()  # ops whose output is a whole fused q|k|v projection

    def is_x(self, ref: Ref) -> bool:
        if ref.kind == "input":
            return ref.name in self.x_names
        return ref.kind == "op" and ref.op is not None and self.from_x[ref.op]

    def producer(self, ref: Ref) -> OpRecord | None:
        return self.ops[ref.op] if ref.kind == "op" and ref.op is not None else None

    def snap(self, ref: Ref) -> Snapshot:
        return self.rec.snapshot(ref)

    def x_inputs(self, op: OpRecord) -> list[Ref]:
        return [ref for ref in op.inputs if self.is_x(ref)]

    def other_inputs(self, op: OpRecord) -> list[Ref]:
        return [ref for ref in op.inputs if not self.is_x(ref)]

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


# ---------------------------------------------------------------------- value helpers


def _scalar_operand(g: Graph, op: OpRecord) -> float | None:
    """The number an op multiplies or divides by: a Python scalar or a one-element tensor."""
    scalars = [a for a in op.scalars() if isinstance(a, int | float) and not isinstance(a, bool)]
    if scalars:
        return float(scalars[0])
    other = g.other_inputs(op)
    if len(other) == 1 and g.snap(other[0]).values.size == 1:
        return float(g.snap(other[0]).values.reshape(-1)[0])
    return None


def _very_negative(values: np.ndarray) -> bool:
    return values.dtype.kind == "f" and bool((values <= LARGE_NEGATIVE).any())


def _masks_somewhere(g: Graph, ref: Ref) -> bool:
    """The tensor, or the buffer it was sliced from, holds a mask value (a one-token slice of
    a causal mask is a single 0, but it is still the mask)."""
    for _ in range(8):
        if _very_negative(g.snap(ref).values):
            return True
        op = g.producer(ref)
        if op is None or not op.inputs:
            return False
        ref = op.inputs[0]
    return False


def _fill_value(op: OpRecord) -> float | None:
    value = op.kwarg("value")
    if value is None:
        numbers = [a for a in op.scalars() if isinstance(a, int | float) and not isinstance(a, bool)]
        value = numbers[0] if numbers else None
    return float(value) if isinstance(value, int | float) else None


# ---------------------------------------------------------------------- rules


def projection(g: Graph, op: OpRecord) -> str | None:
    """x times a weight parameter (nn.Linear, x @ W, addmm, einsum with W): project or w_o."""
    if op.name not in PROJECTIONS or len(g.x_inputs(op)) != 1:
        return None
    weights = [r for r in g.other_inputs(op) if r.kind in ("param", "const", "buffer")
               and g.snap(r).ndim == 2]
    if not weights:
        return None
    return "w_o" if g.op_derives(op, {"attend", "concat", "sdpa"}) else "project"


def fused_split(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """What happens to a fused (C, 3C) projection until it is cut into q, k, v: split,
    chunk, unbind, or torch's own unflatten/transpose/getitem. Still the projection."""
    if op.name not in SHAPE_OPS or not g.x_inputs(op):
        return None
    ref = g.x_inputs(op)[0]
    source = g.producer(ref)
    if source is None or source.index not in g.fused:
        return None
    if op.name not in SPLITS | {"getitem"}:
        g.fused.add(op.index)  # still the whole fused tensor, reshaped
    return "project"


def head_split(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """view/reshape/unflatten cutting the channel axis into (h, d_h) before attention."""
    if op.name not in {"view", "reshape", "unflatten"} or not g.x_inputs(op):
        return None
    if g.op_derives(op, {"scores", "attend"}):
        return None
    before, after = g.snap(g.x_inputs(op)[0]).shape, op.out.shape
    if after[-1] == sizes.d_h and before[-1] == sizes.h * sizes.d_h and sizes.h * sizes.d_h != sizes.d_h \
            and math.prod(after) == math.prod(before) and len(after) >= len(before):
        return "view"
    if len(after) == len(before) + 1 and after[-1] == sizes.d_h and before[-1] == sizes.h * sizes.d_h:
        return "view"  # one head: the new axis has size 1
    return None


def head_move(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """transpose/permute bringing the head axis in front of the token axis."""
    if op.name not in {"transpose", "permute", "swapaxes", "movedim"} or not g.x_inputs(op):
        return None
    if g.op_derives(op, {"scores", "attend"}) or not g.op_derives(op, {"view"}):
        return None
    shape = op.out.shape
    if _swaps_last_two(op, len(shape)):
        return None  # k.transpose(-2, -1): part of q @ k^T, not a move of the head axis
    if len(shape) >= 3 and shape[-1] == sizes.d_h and shape[-2] == sizes.T:
        return "transpose"
    return None


def _swaps_last_two(op: OpRecord, ndim: int) -> bool:
    numbers = [a for a in op.scalars() if isinstance(a, int) and not isinstance(a, bool)]
    if op.name in {"transpose", "swapaxes", "swapdims"} and len(numbers) >= 2:
        return {n % ndim for n in numbers[:2]} == {ndim - 2, ndim - 1}
    if op.name == "permute":
        perm = next((a for a in op.scalars() if isinstance(a, tuple)), tuple(numbers))
        return len(perm) == ndim and perm[-1] % ndim != ndim - 1
    return op.name in {"t", "mT"}


def sdpa(g: Graph, op: OpRecord) -> str | None:
    """F.scaled_dot_product_attention: expanded later into its five steps."""
    return "sdpa" if op.name == "scaled_dot_product_attention" else None


def softmax(g: Graph, op: OpRecord) -> str | None:
    return "softmax" if op.name in SOFTMAXES and g.x_inputs(op) else None


def handwritten_softmax(g: Graph, op: OpRecord) -> str | None:
    """exp(s - max(s)) / sum(exp(...)) written out over several ops or lines: one softmax."""
    if g.softmax_parts is None:
        g.softmax_parts = _softmax_parts(g)
    return "softmax" if op.index in g.softmax_parts else None


def _softmax_parts(g: Graph) -> set[int]:
    """Every op of each hand-written softmax: the division e / sum(e) where e = exp(...),
    with the row maximum subtracted first when it is (the numerically stable form)."""
    parts: set[int] = set()
    for op in g.ops:
        if op.name not in {"div", "true_divide"} or len(op.inputs) != 2:
            continue
        e, total = g.producer(op.inputs[0]), g.producer(op.inputs[1])
        if e is None or total is None or e.name != "exp" or total.name != "sum":
            continue
        if not total.inputs or total.inputs[0].op != e.index or not e.inputs:
            continue
        found = [e.index, total.index, op.index]
        shifted = g.producer(e.inputs[0])
        if shifted is not None and shifted.name == "sub" and len(shifted.inputs) == 2:
            peak = g.producer(shifted.inputs[1])
            if peak is not None and peak.name in {"max", "amax"} and peak.inputs and \
                    _same(peak.inputs[0], shifted.inputs[0]):
                found += [shifted.index, peak.index]
        parts.update(found)
    return parts


def _same(a: Ref, b: Ref) -> bool:
    return a.kind == b.kind and a.op == b.op and a.output == b.output and a.name == b.name


def dropout(g: Graph, op: OpRecord) -> str | None:
    return "dropout" if op.name in DROPOUTS and g.x_inputs(op) else None


def scores_or_attend(g: Graph, op: OpRecord) -> str | None:
    """A product of two x-derived tensors: the weights times V is attend, else scores."""
    if op.name not in MATMULS or len(g.x_inputs(op)) < 2:
        return None
    if g.op_derives(op, {"softmax", "dropout"}):
        return "attend"
    if g.op_derives(op, {"scores", "attend"}):
        return None
    return "scores"


def scale(g: Graph, op: OpRecord) -> str | None:
    """Multiplying or dividing the scores (or q, k before them) by one number."""
    if op.name not in {"div", "mul", "div_", "mul_", "true_divide"} or len(g.x_inputs(op)) != 1:
        return None
    if _scalar_operand(g, op) is None or g.op_derives(op, {"softmax", "attend"}):
        return None
    if g.op_derives(op, {"scores"}):
        return "scale"
    if g.op_derives(op, {"transpose", "view"}):  # q scaled before q @ k^T (torch's own MHA)
        return "scale"
    return None


def mask(g: Graph, op: OpRecord) -> str | None:
    """Blocking score entries: add a -inf buffer, masked_fill, or where with a big negative."""
    if not g.x_inputs(op) or not g.op_derives(op, {"scores"}) or g.op_derives(op, {"softmax"}):
        return None
    others = g.other_inputs(op)
    if op.name in {"add", "add_", "sub", "sub_"}:
        return "mask" if others and _masks_somewhere(g, others[0]) else None
    if op.name in {"masked_fill", "masked_fill_"}:
        value = _fill_value(op)
        if value is not None and value <= LARGE_NEGATIVE:
            return "mask"
        fills = [r for r in others if g.snap(r).values.size == 1]
        return "mask" if fills and _very_negative(g.snap(fills[0]).values) else None
    if op.name == "where":
        numbers = [a for a in op.scalars() if isinstance(a, int | float)]
        if any(float(n) <= LARGE_NEGATIVE for n in numbers):
            return "mask"
        return "mask" if any(_very_negative(g.snap(r).values) for r in others
                             if g.snap(r).dtype != "bool") else None
    return None


def concat(g: Graph, op: OpRecord) -> str | None:
    """After attend: moving heads back beside each other (transpose, view, cat)."""
    if not g.x_inputs(op) or not g.op_derives(op, {"attend", "sdpa"}) or g.op_derives(op, {"w_o"}):
        return None
    if op.name in {"cat", "stack", "concat", "concatenate"} or op.name in SHAPE_OPS:
        return "concat"
    return None


def cache_append(g: Graph, op: OpRecord) -> str | None:
    """torch.cat onto an empty tensor (a key/value cache filled for the first time): the
    tensor passes through unchanged, so it is plumbing, not a step."""
    if op.name not in {"cat", "concat", "concatenate"} or len(g.x_inputs(op)) != 1:
        return None
    others = g.other_inputs(op)
    return "aux" if others and all(g.snap(r).values.size == 0 for r in others) else None


def plumbing(g: Graph, op: OpRecord) -> str | None:
    """Shape-only ops no rule claimed (k.transpose(-2, -1), contiguous, float): helpers."""
    return "aux" if op.name in SHAPE_OPS and g.x_inputs(op) else None


Rule = Callable[[Graph, OpRecord], str | None]


# ---------------------------------------------------------------------- sizes and heads


def _head_calls(rec: Recording) -> list[ModuleCall]:
    """Non-library submodules `<list>.<i>` of one class that each compute attention."""
    groups: dict[tuple[str, str], list[ModuleCall]] = {}
    for call in rec.calls:
        match = re.fullmatch(r"(.+)\.(\d+)", call.path)
        if match and not call.library:
            groups.setdefault((match.group(1), call.class_name), []).append(call)
    for calls in groups.values():
        has_scores = all(
            sum(1 for op in rec.ops[c.first:c.end] if op.name in MATMULS) >= 2 for c in calls)
        if has_scores and len(calls) >= 1:
            return sorted(calls, key=lambda c: int(c.path.rsplit(".", 1)[1]))
    return []


def infer_sizes(rec: Recording, x: Snapshot, hint_heads: int, head_calls: list[ModuleCall]) -> Sizes:
    """B, T, C from x, h and d_h from the ops; no batch axis when x is (T, C)."""
    return replace(_infer_sizes(rec, x, hint_heads, head_calls), batched=x.ndim >= 3)


def _infer_sizes(rec: Recording, x: Snapshot, hint_heads: int, head_calls: list[ModuleCall]) -> Sizes:
    B, T, C = x.shape[:3] if x.ndim >= 3 else (1, x.shape[0], x.shape[-1])
    if head_calls:
        h = len(head_calls)
        widths = [op.out.shape[-1] for op in rec.ops[head_calls[0].first:head_calls[0].end]
                  if op.name in PROJECTIONS]
        return Sizes(B, T, C, h, widths[0] if widths else max(1, C // h))
    for op in rec.ops:
        if op.name in {"view", "reshape", "unflatten"} and op.inputs:
            before, after = rec.snapshot(op.inputs[0]).shape, op.out.shape
            if (len(after) == len(before) + 1 and before and before[-1] in (C, 3 * C)
                    and len(after) >= 2 and after[-2] * after[-1] == C and before[-1] == C):
                return Sizes(B, T, C, after[-2], after[-1])
            if (op.name == "view" and len(after) == 3 and len(before) == 3
                    and before[-1] == C and after[0] == T and after[-1] * after[1] == C * B):
                return Sizes(B, T, C, after[1] // B, after[-1])  # (T, B*h, d_h): torch's MHA
    for op in rec.ops:
        if op.name == "scaled_dot_product_attention" and op.inputs and rec.snapshot(op.inputs[0]).ndim == 4:
            q = rec.snapshot(op.inputs[0]).shape
            return Sizes(B, T, C, q[1], q[3])
    h = hint_heads if hint_heads and C % hint_heads == 0 else 1
    return Sizes(B, T, C, h, C // h)


# ---------------------------------------------------------------------- classification


def classify(g: Graph, sizes: Sizes) -> None:
    """Give every x-dependent op a kind; rules in order, the first that answers wins."""
    rules: list[Rule] = [
        sdpa,
        cache_append,
        projection,
        lambda g, op: fused_split(g, op, sizes),
        lambda g, op: head_split(g, op, sizes),
        lambda g, op: head_move(g, op, sizes),
        softmax,
        handwritten_softmax,
        dropout,
        scores_or_attend,
        mask,
        scale,
        concat,
        plumbing,
    ]
    for op in g.ops:
        if not g.from_x[op.index]:
            continue
        kind = "op"
        for rule in rules:
            found = rule(g, op)
            if found:
                kind = found
                break
        g.kind[op.index] = kind
        if kind == "project" and op.name in PROJECTIONS and op.out.shape[-1] == 3 * sizes.C:
            g.fused.add(op.index)
    _fold_library_calls(g)


def _fold_library_calls(g: Graph) -> None:
    """Every x-dependent op inside a leaf module call that projects (GPT-2's Conv1D:
    view, addmm, view) belongs to that projection."""
    children = {c.path for c in g.rec.calls}
    for call in g.rec.calls:
        if any(p != call.path and p.startswith(call.path + ".") for p in children):
            continue
        inside = [i for i in range(call.first, call.end) if g.from_x[i]]
        kinds = {g.kind[i] for i in inside}
        for kind in ("project", "w_o"):
            if kind in kinds:
                for i in inside:
                    g.kind[i] = kind


def _assign_heads(g: Graph, head_calls: list[ModuleCall]) -> None:
    for h, call in enumerate(head_calls):
        for i in range(call.first, call.end):
            g.head[i] = h


def _assign_loop_heads(g: Graph, sizes: Sizes) -> None:
    """A per-head loop (`Q[h]`, `K[h]`, `V[h]` taken from the (h, T, d_h) heads one index at
    a time): each op that follows from head i's slices belongs to head i, up to the op that
    joins the heads again (np.stack, torch.cat)."""
    if g.head or sizes.h < 2:
        return
    lead = () if not sizes.batched else (sizes.B,)
    heads_shape = (*lead, sizes.h, sizes.T, sizes.d_h)
    own = _own_head_weights(g, sizes.h)
    for op in g.ops:
        if not g.from_x[op.index]:
            continue
        if op.index in own:
            g.head[op.index] = own[op.index]
            continue
        if op.name == "getitem" and op.inputs and g.snap(op.inputs[0]).shape == heads_shape:
            index = op.args[1] if len(op.args) > 1 else None
            if isinstance(index, tuple) and len(index) == len(lead) + 1 and \
                    all(part == ("slice", None, None, None) for part in index[:-1]):
                index = index[-1]
            if isinstance(index, int) and not isinstance(index, bool) and -sizes.h <= index < sizes.h:
                g.head[op.index] = index % sizes.h
                continue
        heads = {g.head.get(ref.op) for ref in g.x_inputs(op) if ref.kind == "op"}
        if len(heads) == 1 and None not in heads:
            g.head[op.index] = heads.pop()  # type: ignore[assignment]


def _own_head_weights(g: Graph, h: int) -> dict[int, int]:
    """Ops that use head i's own weight (`W_q[i]`, `heads.i.W_q`: a list of h per-head
    arrays, as plain NumPy code keeps them): op index -> i."""
    found: dict[int, int] = {}
    for op in g.ops:
        for ref in g.other_inputs(op):
            match = re.search(r"(?:^|\.)(\d+)(?:\.|$)", ref.name) if ref.kind == "param" else None
            if match and g.snap(ref).ndim == 2:
                found[op.index] = int(match.group(1))
    return found if sorted(set(found.values())) == list(range(h)) else {}


def group(g: Graph) -> list[_Unit]:
    """Ops into units: one per kind (dropout and op may repeat), helpers attached."""
    units: list[_Unit] = []
    by_kind: dict[str, _Unit] = {}
    owner: dict[int, _Unit] = {}
    for op in g.ops:
        kind = g.kind.get(op.index)
        if kind is None or kind == "aux":
            continue
        if kind == "dropout":
            source = g.producer(g.x_inputs(op)[0])
            while source is not None and source.index not in owner and g.x_inputs(source):
                source = g.producer(g.x_inputs(source)[0])  # back through plumbing (.type())
            same = np.array_equal(op.out.values, g.snap(g.x_inputs(op)[0]).values, equal_nan=True)
            if same and source is not None and source.index in owner:
                owner[source.index].folded.append(op.index)
                owner[op.index] = owner[source.index]
                continue
        repeatable = kind in ("op", "dropout")
        unit = None if repeatable else by_kind.get(kind)
        if repeatable and units and units[-1].kind == kind and kind == "op" and \
                g.ops[units[-1].ops[-1]].source == op.source:
            unit = units[-1]
        if unit is None:
            unit = _Unit(kind)
            units.append(unit)
            if not repeatable:
                by_kind[kind] = unit
        unit.ops.append(op.index)
        owner[op.index] = unit
    # helpers: shape plumbing and ops that do not depend on x join their consumer's unit
    for op in reversed(g.ops):
        if op.index in owner:
            continue
        consumer_units = [owner[c] for c in g.consumers[op.index] if c in owner]
        if consumer_units:
            owner[op.index] = consumer_units[0]
            consumer_units[0].helpers.append(op.index)
    for op in g.ops:  # plumbing nobody consumed (the forward's last reshape): its producer's
        if op.index in owner:
            continue
        producers = [owner[r.op] for r in op.inputs if r.kind == "op" and r.op in owner]
        if producers:
            owner[op.index] = producers[0]
            producers[0].helpers.append(op.index)
        else:
            unit = _Unit("op", [op.index])
            units.append(unit)
            owner[op.index] = unit
    units.sort(key=lambda u: min(u.ops or u.helpers))
    return units


# ---------------------------------------------------------------------- building stages


BTC = ("B", "T", "C")
BTHD = ("B", "T", "h", "d_h")
BHTD = ("B", "h", "T", "d_h")
BHTT = ("B", "h", "T", "T")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


class Builder:
    """Builds each stage's tensors and checks from its ops."""

    def __init__(self, g: Graph, sizes: Sizes, config: Config, head_calls: list[ModuleCall]) -> None:
        self.g, self.sizes, self.config = g, sizes, config
        # Heads computed one at a time: as separate modules, or in a loop over Q[h], K[h], V[h].
        self.per_head = bool(head_calls) or bool(g.head)
        self.head_modules = bool(head_calls)
        self.names: dict[int, str] = {}
        self.stage_of: dict[int, str] = {}

    # ------------------------------------------------------------ naming

    def name(self, op: OpRecord) -> str:
        """What the module calls this tensor: the assignment target of its statement."""
        if op.index in self.names:
            return self.names[op.index]
        text = op.source.text
        match = re.match(r"\s*([A-Za-z_][A-Za-z_0-9]*)\s*(?:\[[^\]]*\])?\s*[+\-*/@]?=(?!=)", text)
        if match and match.group(1) != "return":
            return match.group(1)
        if text.lstrip().startswith("return"):
            return "out"
        return {"project": "projection", "w_o": "out"}.get(self.g.kind.get(op.index, ""), op.name)

    def role(self, op: OpRecord) -> str:
        """Q, K or V for a projection, from where its output goes (never from its name)."""
        g = self.g
        todo, seen = [op.index], set()
        while todo:
            i = todo.pop(0)
            if i in seen:
                continue
            seen.add(i)
            for c in g.consumers[i]:
                consumer = g.ops[c]
                kind = g.kind.get(c)
                if kind in ("scores", "sdpa"):
                    position = next(n for n, r in enumerate(consumer.inputs) if r.op == i)
                    if kind == "sdpa":
                        return "QKV"[min(position, 2)]
                    if consumer.name == "einsum":
                        return "Q" if position == 0 else "K"
                    # q @ k^T: k arrives through a transpose of its last two axes
                    return "K" if position == 1 else "Q"
                if kind == "attend":
                    return "V"
                if kind == "scale" and c not in seen and g.op_derives(consumer, {"scores"}):
                    continue
                todo.append(c)
        return "?"

    # ------------------------------------------------------------ records

    def dims(self, shape: tuple[int, ...], prefer: Sequence[tuple[str, ...]] = ()) -> tuple[str, ...]:
        s = self.sizes
        table = {
            BTC: (s.B, s.T, s.C), BTHD: (s.B, s.T, s.h, s.d_h), BHTD: (s.B, s.h, s.T, s.d_h),
            BHTT: (s.B, s.h, s.T, s.T), ("T", "T"): (s.T, s.T), ("B", "T"): (s.B, s.T),
            ("T", "d_h"): (s.T, s.d_h),  # one head's slice in a per-head loop
        }
        for dims in [*prefer, BTC, BHTD, BTHD, BHTT, ("T", "T")]:
            if dims in table and tuple(shape) == self.unbatched(table[dims], dims):
                return self.unbatched(dims, dims)
        return tuple(f"d{i}" for i in range(len(shape)))

    def unbatched(self, values: tuple, dims: tuple[str, ...]) -> tuple:
        """Without a batch axis (NumPy's (T, C)), every label and size loses its B."""
        if self.sizes.batched or "B" not in dims:
            return values
        return tuple(v for v, d in zip(values, dims, strict=True) if d != "B")

    def record(self, name: str, snap: Snapshot, dims: tuple[str, ...] | None = None, *,
               values: np.ndarray | None = None, share: tuple[str, Snapshot] | None = None,
               **extra: object) -> TensorRecord:
        values = snap.values if values is None else values
        caption = str(extra.pop("caption", ""))
        if dims is None or dims[0].startswith("d0"):
            dims = self.dims(values.shape)
        if len(dims) == values.ndim + 1:
            dims = self.unbatched(dims, dims)
        if dims and dims[0] == "d0":
            regrouped = self.regroup(values)
            if regrouped is not None:
                values, dims, held = regrouped
                note = f"torch holds it as {held}; shown as ({', '.join(dims)})"
                caption = f"{caption}; {note}" if caption else note
        if len(dims) != values.ndim:
            dims = tuple(f"d{i}" for i in range(values.ndim))
        if self.per_head and snap.strides and len(snap.strides) == values.ndim - 1 and \
                "h" in dims and not self.head_modules:
            # A loop over heads made h separate arrays; the strides are each head's own.
            note = f"the {self.sizes.h} heads' separate {snap.shape} results stacked; strides: one head's"
            caption = f"{caption}; {note}" if caption else note
        extra["caption"] = caption
        return TensorRecord(
            name=name, dims=dims, values=values, strides=snap.strides, contiguous=snap.contiguous,
            stride_unit=snap.stride_unit,
            shares_storage=None if share is None else snap.storage == share[1].storage,
            shares_with=share[0] if share else "", **extra,  # type: ignore[arg-type]
        )

    def regroup(self, values: np.ndarray) -> tuple[np.ndarray, tuple[str, ...], str] | None:
        """torch's own MHA keeps tokens first and batch and heads merged: (T, B, C),
        (T * B, C), (T, B * h, d_h), (B * h, T, .). Regroup those for display only."""
        s = self.sizes
        shape = tuple(values.shape)
        if s.h * s.d_h != s.C or not s.batched:
            return None
        if shape == (s.T, s.B, s.C) and s.T != s.B:
            return np.swapaxes(values, 0, 1), BTC, "(T, B, C)"
        if shape == (s.T * s.B, s.C) and len(shape) == 2:
            return np.swapaxes(values.reshape(s.T, s.B, s.C), 0, 1), BTC, "(T * B, C)"
        if shape == (s.T, s.B * s.h, s.d_h):
            return np.swapaxes(values.reshape(s.T, s.B, s.h, s.d_h), 0, 1), BTHD, "(T, B * h, d_h)"
        if shape == (s.B * s.h, s.T, s.d_h):
            return values.reshape(s.B, s.h, s.T, s.d_h), BHTD, "(B * h, T, d_h)"
        if shape == (s.B * s.h, s.T, s.T):
            return values.reshape(s.B, s.h, s.T, s.T), BHTT, "(B * h, T, T)"
        return None

    @property
    def head_axis(self) -> int:
        """Where per-head results stack: after B, or first when there is no batch axis."""
        return 1 if self.sizes.batched else 0

    def stacked(self, ops: list[OpRecord], axis: int | None = None) -> np.ndarray:
        """Per-head results side by side on a head axis, as a fused module holds them."""
        return np.stack([op.out.values for op in ops], axis=self.head_axis if axis is None else axis)

    def heads_of(self, ops: list[int]) -> list[list[OpRecord]]:
        by_head: dict[int, list[OpRecord]] = {}
        for i in ops:
            by_head.setdefault(self.g.head.get(i, -1), []).append(self.g.ops[i])
        return [by_head[h] for h in sorted(by_head)]

    def out_4d(self, ops: list[int], dims4: tuple[str, ...]) -> tuple[np.ndarray, Snapshot]:
        """The stage's tensor as (B, h, T, .): stacked per head, or torch's (B*h, T, .) regrouped."""
        g, s = self.g, self.sizes
        if self.per_head and len(ops) > 1:
            last = [group[-1] for group in self.heads_of(ops)]
            return self.stacked(last), last[0].out
        snap = g.ops[ops[-1]].out
        values = snap.values
        last = g.ops[ops[-1]]
        if last.name == "einsum" and values.ndim == 4:
            values = _einsum_heads_first(last, values)
        if not s.batched:  # NumPy: (h, T, .) already, or one head's (T, .)
            return (values[None] if values.ndim == 2 else values), snap
        if values.ndim == 3 and values.shape[0] == s.B * s.h and s.h > 1:
            values = values.reshape(s.B, s.h, *values.shape[1:])
        elif values.ndim == 3 and s.h == 1:
            values = values[:, None]
        return values, snap


def _einsum_heads_first(op: OpRecord, values: np.ndarray) -> np.ndarray:
    """An einsum whose output keeps tokens before heads ("...->bqhd") shown as (B, h, T, .)."""
    equation = next((a for a in op.args if isinstance(a, str)), "")
    if "->" not in equation:
        return values
    inputs, output = equation.replace(" ", "").split("->")
    first = inputs.split(",")[0]
    if len(first) != 4 or len(output) != 4:
        return values
    head, query = first[1], first[2]  # scores and weights are (b, h, q, k)
    if head in output and query in output and output.index(head) > output.index(query):
        return np.swapaxes(values, output.index(head), output.index(query))
    return values


# ---------------------------------------------------------------------- the entry point


def recognise(rec: Recording, config: Config, *, embedded: Embedded | None = None,
              forward_equal: bool | None = None, n_params: int | None = None) -> tuple[Stage, ...]:
    """The stages of one recorded forward, in the module's own order."""
    from .recognise_stages import build_stages  # the per-kind builders

    x = next((snap for name, snap in rec.inputs if snap.dtype.startswith("float") and snap.ndim == 3),
             rec.inputs[0][1] if rec.inputs else None)
    head_calls = _head_calls(rec)
    if x is None:
        sizes = Sizes(1, config.seq_len, config.embed_dim, config.num_heads, config.head_dim)
    else:
        sizes = infer_sizes(rec, x, config.num_heads, head_calls)
    g = Graph(rec)
    _assign_heads(g, head_calls)
    _assign_loop_heads(g, sizes)
    classify(g, sizes)
    units = group(g)
    builder = Builder(g, sizes, config, head_calls)
    return build_stages(builder, units, rec, embedded=embedded, forward_equal=forward_equal,
                        n_params=n_params)


def _info(kind: str) -> tuple[str, str]:
    try:
        info = stage_info(kind)
        return info.title, info.explanation
    except KeyError:
        return kind, ""


__all__ = ["Builder", "Check", "Embedded", "Graph", "Sizes", "TensorArg", "_info", "math", "recognise"]
