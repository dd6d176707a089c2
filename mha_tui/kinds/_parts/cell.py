"""How one cell of a stage's result was made: the data every kind's `why` returns, the cell
it is asked about, and the helpers they share (mha_tui.why is the entry point).

Each stage kind's module in kinds/ has `why(cell) -> Why`: it recomputes the cell's value
from what the forward recorded (its ops' input snapshots, earlier stages' tensors), in
float64, step by step, and sets the module's own number beside it. Plain data out.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ...ops.numeric import HALF, precision_of
from ...records import OpRecord, Stage, TensorArg, TensorRecord, Trace
from .builder import KEYS

MANY_TERMS = 8
"""More products than this (a large d_h, a long sentence): the largest SHOWN_TERMS by size
are listed and the rest summed on one row, saying so."""
SHOWN_TERMS = 6


class WhyError(ValueError):
    """The cell cannot be explained: no such stage or index, or a stage kind without a why."""


@dataclass(frozen=True)
class Term:
    """One line of a computation: a label, the numbers and operators it combines, its value.

    parts: numbers (the recorded inputs) and operator strings ("×", "-", "/"), in order;
    value None for a line that only states a fact."""

    label: str
    parts: tuple[float | str, ...] = ()
    value: float | None = None


@dataclass(frozen=True)
class Why:
    """How one cell was made: what the module computed, and mha-tui's computation of it."""

    stage: str
    kind: str
    tensor: str  # the main tensor's name, as the stage shows it
    index: tuple[int, ...]
    where: str  # "head 1, query AI (row 2), key love (column 1)"
    formula: str  # "scores[0, 1, 2, 1] = Q[0, 1, 2, :] · K[0, 1, 1, :]"
    terms: tuple[Term, ...]
    notes: tuple[str, ...]
    computed: float  # by mha-tui, in float64, from the recorded inputs
    recorded: float  # the module's own number (or, with `recorded_by`, whose it is)
    basis: str = ""
    """What mha-tui computed from, when not only the recorded tensors (an expansion's); not
    recomputed: what the recorded steps are (default: what the op was given)."""
    recorded_by: str = ""
    """Whose number `recorded` is, when not the module's: "mha-tui's expansion's" for a stage
    mha-tui computed itself from a fused op's inputs (kinds/sdpa.py)."""
    witness: Witness | None = None
    """The module's own number, when `recorded` is not: checked against `computed` too."""
    recomputed: bool = True
    """False: an op mha-tui does not recompute (op_cell.unknown); `computed` is then only the
    recorded number again, and is never called equal."""
    reason: str = ""
    """Why `recomputed` is False, when not an op mha-tui does not know (the verdict line)."""
    dtype: str = "float32"
    """The dtype the module computed the cell in: mha-tui recomputes in float64 from the
    recorded operands (a bfloat16 module's own bfloat16 numbers, exactly) and allows that
    dtype's rounding (`rounding`)."""

    @property
    def difference(self) -> float:
        return difference(self.computed, self.recorded)

    @property
    def agrees(self) -> bool:
        """Equal to the module's number up to its dtype's rounding (the module sums in
        float32, in its own order, and rounds to its dtype; mha-tui in float64)."""
        return self.recomputed and agrees(self.computed, self.recorded, self.dtype)

    def compared(self, number: float) -> tuple[float, bool]:
        """mha-tui's number against another (the witness's): the difference, and whether
        they agree up to the dtype's rounding."""
        return difference(self.computed, number), agrees(self.computed, number, self.dtype)

    @property
    def rounding(self) -> str:
        """What `agrees` allows, in words: `float32 rounding`, or `bfloat16 rounding,
        allowed up to 2^-6 = 0.01562 x max(1, |number|)`."""
        if self.dtype not in HALF:
            return "float32 rounding"
        rtol = precision_of(self.dtype).rtol
        return (f"{self.dtype} rounding, allowed up to 2^{round(math.log2(rtol))} = {rtol:.4g} "
                f"x max(1, |number|)")


@dataclass(frozen=True)
class Witness:
    """A number of the module's own set beside mha-tui's computation: what it is, its value
    (attend of an expansion: the fused op's output at the cell), and anything that explains
    why the two may differ."""

    label: str  # "y[0, 1, 2, 1] (what F.scaled_dot_product_attention returned)"
    value: float
    caveat: str = ""


def difference(computed: float, recorded: float) -> float:
    if math.isnan(computed) and math.isnan(recorded):
        return 0.0
    if math.isinf(computed) and computed == recorded:
        return 0.0
    return abs(computed - recorded)


def agrees(computed: float, recorded: float, dtype: str = "float32") -> bool:
    """Equal up to float32 rounding, or the rounding of dtype (bfloat16, float16): the module
    rounded its result to it (`ops.numeric.Precision`)."""
    if math.isinf(recorded) and math.isfinite(computed) and \
            abs(computed) > _LARGEST.get(dtype, _LARGEST["float32"]) and \
            math.copysign(1.0, computed) == math.copysign(1.0, recorded):
        return True  # the module's dtype overflowed to ±inf where float64 did not
    scale = max(1.0, abs(recorded)) if math.isfinite(recorded) else 1.0
    rtol = precision_of(dtype).rtol if dtype in HALF else 1e-5
    return difference(computed, recorded) <= rtol * scale


_LARGEST = {"float32": 3.4028234663852886e38, "bfloat16": 3.3895313892515355e38,
            "float16": 65504.0}
"""The largest finite number of each dtype (torch.finfo(dtype).max): beyond it, ±inf."""


FUSED_ATTENTION = "scaled_dot_product_attention"


def expanded_from(stage: Stage) -> OpRecord | None:
    """The F.scaled_dot_product_attention op a stage is mha-tui's expansion of (kinds/sdpa.py),
    or None. Such a stage's numbers are computed by mha-tui from that op's q, k and v; the
    module ran the fused op and recorded only its output."""
    return next((op for op in stage.ops if op.name == FUSED_ATTENTION), None)


_POSITIONS = {"attn_mask": 3, "dropout_p": 4, "is_causal": 5, "scale": 6, "enable_gqa": 7}


def fused_argument(op: OpRecord, name: str, default: object = None) -> object:
    """An argument of F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
    is_causal, scale, enable_gqa), given by position or by keyword."""
    position = _POSITIONS[name]
    return op.args[position] if len(op.args) > position else op.kwarg(name, default)


def main_tensor(stage: Stage) -> TensorRecord:
    """The tensor the cursor moves on: the stage's result, its last tensor."""
    if not stage.tensors:
        raise WhyError(f"stage {stage.id} has no tensor to point into")
    return stage.tensors[-1]


@dataclass(frozen=True)
class Cell:
    trace: Trace
    stage: Stage
    record: TensorRecord
    index: tuple[int, ...]

    @property
    def recorded(self) -> float:
        return float(self.record.values[self.index])

    @property
    def name(self) -> str:
        return f"{self.record.name}[{', '.join(map(str, self.index))}]"

    def _row_tokens(self) -> tuple[str, ...] | None:
        """A padded batch's (`--batch`) row of this cell: its own tokens, <pad> included;
        None without a batch (or a cell of no batch axis)."""
        config = self.trace.config
        if not config.batch or self.record.dims[:1] != ("B",) or not self.index:
            return None
        return config.row_tokens(self.index[0]) if self.index[0] < len(config.rows) else None

    def padded_key(self, t: int) -> bool:
        """Key t is padding in this cell's batch row (`--batch`, self-attention)."""
        config = self.trace.config
        if self._row_tokens() is None or config.cross:
            return False
        row = config.padding[self.index[0]]
        return 0 <= t < len(row) and row[t]

    def record_before(self) -> TensorRecord | None:
        """The stage's tensor listed just before the cell's own: where a builder lists
        (before, after) pairs per role (rotary's Q and K, repeated K and V), the one the
        cell's was made from; None when the cell's tensor comes first."""
        at = next((i for i, r in enumerate(self.stage.tensors) if r is self.record), 0)
        return self.stage.tensors[at - 1] if at >= 1 else None

    def token(self, t: int) -> str:
        tokens = self._row_tokens() or self.trace.config.tokens
        return tokens[t] if 0 <= t < len(tokens) else str(t)

    def key_token(self, t: int) -> str:
        """Key t's token: the context's in cross-attention, else the sentence's own (in a
        padded batch, the cell's row's)."""
        config = self.trace.config
        tokens = (self._row_tokens() if not config.cross else None) or config.key_tokens
        return tokens[t] if 0 <= t < len(tokens) else str(t)

    @property
    def head(self) -> int | None:
        dims = self.record.dims
        return self.index[dims.index("h")] if "h" in dims else None

    def ops(self, *names: str) -> list[OpRecord]:
        return [op for op in self.stage.ops if op.name in names]

    def per_head(self, ops: list[OpRecord]) -> tuple[OpRecord, tuple[int, ...]]:
        """The op that made this cell, and the cell's index in that op's output: one op for
        every head (index as it is), or one op per head (a ModuleList: no head axis)."""
        if not ops:
            raise WhyError(f"stage {self.stage.id} holds no op to explain {self.name} by")
        out_ndim = len(ops[-1].out.shape)
        if out_ndim == len(self.index):
            return ops[-1], self.index
        head_axis = self.record.dims.index("h") if "h" in self.record.dims else None
        if head_axis is None or out_ndim != len(self.index) - 1 or len(ops) <= self.index[head_axis]:
            # one op for every head with B and h as one axis (B*h, T, T): the same numbers
            # in the same reading order (nn.MultiheadAttention's bmm and softmax)
            values, out = self.record.values, ops[-1].out.values
            if out.size == values.size and np.array_equal(out.reshape(values.shape), values,
                                                          equal_nan=True):
                return ops[-1], reindex(self.index, values.shape, out.shape)
            raise WhyError(f"cannot tell which op of stage {self.stage.id} made {self.name}")
        head = self.index[head_axis]
        return ops[head], self.index[:head_axis] + self.index[head_axis + 1:]

    def operand(self, op: OpRecord, k: int) -> np.ndarray:
        recording = self.trace.recording
        if recording is None:
            raise WhyError("this trace keeps no recording of its ops")
        return np.asarray(recording.snapshot(op.inputs[k]).values)

    def scalar(self, op: OpRecord) -> float:
        """The op's number argument (`/ math.sqrt(d_h)`), or a one-element tensor argument."""
        for arg in op.args[1:]:
            if isinstance(arg, (int, float)) and not isinstance(arg, bool):
                return float(arg)
            if isinstance(arg, TensorArg):
                values = self.operand(op, arg.index)
                if values.size == 1:
                    return float(values.reshape(()))
        raise WhyError(f"cannot find the number {op.name} uses in stage {self.stage.id}")


def where(cell: Cell, row_axis: str = "query", col_axis: str = "key") -> str:
    dims, index = cell.record.dims, cell.index
    parts = []
    if "h" in dims:
        parts.append(f"head {index[dims.index('h')]}")
    elif "h_kv" in dims:  # K or V before its heads are shared out
        parts.append(f"K/V head {index[dims.index('h_kv')]}")
    t_axes = [k for k, d in enumerate(dims) if d in ("T", KEYS)]
    if len(t_axes) == 2:
        i, j = index[t_axes[0]], index[t_axes[1]]
        # a decode step (--decode): keys before the new tokens' were read back from the cache
        cached = cell.trace.config.cached
        kept = (": a key read back from the cache, made at an earlier step" if j < len(cached)
                else ": the new token's own key, just made" if cached else "")
        parts += [f"{row_axis} {cell.token(i)} (row {i})",
                  f"{col_axis} {cell.key_token(j)} (column {j}{kept})"]
    elif t_axes:
        t = index[t_axes[0]]
        word = cell.key_token(t) if dims[t_axes[0]] == KEYS else cell.token(t)
        parts.append(f"{'context token' if dims[t_axes[0]] == KEYS else 'token'} {word} (row {t})")
        last = dims[-1]
        if last in ("C", "d_h", "h_kv*d_h", "3C", "(h+2*h_kv)*d_h"):
            parts.append(f"{'d' if last == 'd_h' else 'channel'} {index[-1]}")
    return ", ".join(parts)


def head_prefix(cell: Cell) -> str:
    """"1, " for head 1 of a tensor whose first axis is the head (NumPy's (h, T, .), no batch):
    a label Q[2, 0] would read as head 2's first row there. "" where a batch axis comes first
    (torch's (B, h, T, .): the formula line gives the lead indices)."""
    dims = cell.record.dims
    return f"{cell.head}, " if dims[:1] == ("h",) and cell.head is not None else ""


def dot(cell: Cell, row: np.ndarray, col: np.ndarray, labels: list[str], what: str
         ) -> tuple[tuple[Term, ...], tuple[str, ...], float]:
    """Σ row[k] * col[k], in float64: a term per k, or the largest and the rest summed."""
    products = row.astype(np.float64) * col.astype(np.float64)
    total = float(products.sum())
    order = list(range(len(products)))
    notes: list[str] = []
    if len(products) > MANY_TERMS:
        order = sorted(order, key=lambda k: -abs(products[k]))[:SHOWN_TERMS]
        order.sort()
    terms = [Term(labels[k], (float(row[k]), "×", float(col[k])), float(products[k]))
             for k in order]
    rest = [k for k in range(len(products)) if k not in set(order)]
    if rest:
        terms.append(Term(f"the other {len(rest)} {what}", (), float(products[rest].sum())))
        notes.append(f"{len(products)} {what}: the {len(order)} largest in size are shown, "
                     f"the other {len(rest)} summed on one line")
    terms.append(Term("sum", (), total))
    return tuple(terms), tuple(notes), total


def previous(cell: Cell, kind: str) -> Stage:
    stages = cell.trace.stages
    before = stages[:[s.id for s in stages].index(cell.stage.id)]
    for stage in reversed(before):
        if stage.kind == kind:
            return stage
    raise WhyError(f"no {kind} stage before {cell.stage.id}")


def _matmul_linear(cell: Cell, role: str) -> Why:
    """A NumPy projection `x @ W` (no batch axis): the token's row of x dotted with column o
    of W, W as the matmul's recorded second input."""
    matmuls = [o for o in cell.ops("matmul") if len(o.out.shape) == 2]
    if len(cell.index) != 2 or not matmuls:
        raise WhyError(f"stage {cell.stage.id} holds no linear op")
    op = next((o for o in matmuls
               if np.array_equal(o.out.values, cell.record.values, equal_nan=True)), None)
    t, o = cell.index
    own = None  # (head, its channel): one (C, d_h) matrix per head, outputs side by side
    if op is None:
        op, own = _own_layer(cell, matmuls)  # WhyError when no block is one head's
        o = own[1]
    x, weight = cell.operand(op, 0), cell.operand(op, 1)
    name = next((r.name for r in cell.stage.tensors if r.dims == ("C_in", "C_out")
                 and np.array_equal(r.values, weight)), "W")
    if own is not None:
        name = f"head {own[0]}'s W"
    labels = [f"in {k}: x[{t}, {k}] × {name}[{k}, {o}]" for k in range(x.shape[-1])]
    terms, notes, total = dot(cell, x[t], weight[:, o], labels, "products")
    heads = () if own is None else (
        f"one matrix per head: channel {cell.index[-1]} of {cell.record.name} is channel {o} of "
        f"head {own[0]}'s x @ W (d_h = {op.out.shape[-1]} channels each, side by side)",)
    return Why(cell.stage.id, cell.stage.kind, cell.record.name, cell.index, where(cell),
               f"{cell.name} = Σ_k x[{t}, k] × {name}[k, {o}]", terms,
               ("x @ W: x and W are the matmul's recorded inputs; column "
                f"{o} of {name} makes channel {o}", *heads, *notes), total, cell.recorded)


_ADDMM = "addmm"
"""GPT-2's Conv1D: torch.addmm(bias, x, W) = bias + x @ W, W stored (in, out)."""


def _addmm_plain(op: OpRecord) -> bool:
    """addmm(bias, x, W) with beta = alpha = 1: bias + x @ W, nothing scaled."""
    return op.name != _ADDMM or (len(op.inputs) == 3 and op.kwarg("beta", 1) == 1
                                 and op.kwarg("alpha", 1) == 1)


def linear(cell: Cell, role: str) -> Why:
    ops = [op for op in cell.ops("linear", _ADDMM) if _addmm_plain(op)]
    if not ops:
        return _matmul_linear(cell, role)
    values = cell.record.values
    op = next((o for o in ops if np.array_equal(o.out.values, values, equal_nan=True)), None)
    index = cell.index
    if op is None:  # the same numbers in another shape: (T*B, C) viewed as (B, T, C), B = 1
        op = next((o for o in ops if o.out.values.size == values.size and o.out.values.ndim >= 2
                   and np.array_equal(o.out.values.reshape(values.shape), values,
                                      equal_nan=True)), None)
        if op is not None:
            index = reindex(index, values.shape, op.out.shape)
    *lead, t, o = index
    own = None  # (head, its channel): the heads ran as modules of their own (a ModuleList)
    part = None  # (the block's first channel, its width): a part of one fused layer's output
    if op is None:
        part_of = fused_part(cell, ops)
        if part_of is not None:
            op, part = part_of
            o += part[0]
            *lead, t = reindex(index[:-1], values.shape[:-1], op.out.shape[:-1])
        else:
            op, own = _own_layer(cell, ops)
            o = own[1]
    conv1d = op.name == _ADDMM  # (in, out): column o makes channel o
    x, weight = cell.operand(op, 1 if conv1d else 0), cell.operand(op, 2 if conv1d else 1)
    row = x[(*lead, t)]
    col = weight[:, o] if conv1d or weight.shape[0] != op.out.shape[-1] else weight[o]
    d_h = cell.trace.config.head_dim
    name = cell.stage.tensors[0].name if role == "W_O" else "W"
    labels = [f"in {k}" + (f" (head {k // d_h}, d{k % d_h})" if role == "W_O" else "")
              + f": x[{t}, {k}] × {name}[{f'{k}, {o}' if conv1d else f'{o}, {k}'}]"
              for k in range(len(row))]
    terms, notes, total = dot(cell, row, col, labels, "products")
    bias = None
    if len(op.inputs) > 2:
        bias = float(cell.operand(op, 0 if conv1d else 2)[o])
        total += bias
        terms = (*terms[:-1], Term(f"+ bias[{o}]", (), bias), Term("sum", (), total))
    extra = []
    dropouts = cell.ops("dropout", "dropout_")
    if dropouts:
        extra.append(f"then dropout (training={dropouts[0].kwarg('training', None)}): it "
                     "changes nothing in eval mode")
    if part is not None:
        first, width = part
        extra.insert(0, f"{cell.record.name} is channels {first}-{first + width - 1} of one fused "
                        f"layer's output ({op.out.shape[-1]} channels, cut by split or chunk): "
                        f"its channel {cell.index[-1]} is the layer's channel {o}, "
                        f"{'column' if conv1d else 'row'} {o} of its weight")
    if own is not None:
        name = f"head {own[0]}'s W"
        extra.insert(0, f"the heads ran as modules of their own: channel {cell.index[-1]} of "
                        f"{cell.record.name} is channel {o} of head {own[0]}'s layer (d_h = "
                        f"{op.out.shape[-1]} channels each, side by side), its row {o}")
        terms = tuple(replace(term, label=term.label.replace(f"W[{o}, ", f"{name}[{o}, "))
                      for term in terms)
    if conv1d:
        stored = cell.operand(op, 2).shape
        extra.insert(0, f"torch.addmm(bias, x, W) = bias + x @ W (GPT-2's Conv1D): W is stored "
                        f"(in, out) = ({stored[0]}, {stored[1]}), the transpose of nn.Linear's "
                        f"(out, in), so column {o} of W makes channel {o}")
    return Why(cell.stage.id, cell.stage.kind, cell.record.name, cell.index, where(cell),
               f"{cell.name} = x[{t}, :] · {name}[{f':, {o}' if conv1d else f'{o}, :'}]"
               + (" + bias" if bias is not None else ""),
               terms, ((f"every output channel mixes all heads: in-channels of head h are "
                        f"h·{d_h} to h·{d_h}+{d_h - 1}" if role == "W_O" else
                        f"one {'column' if conv1d else 'row'} of the weight, dotted with the "
                        "token's x"), *notes, *extra),
               total, cell.recorded)


def fused_part(cell: Cell, ops: list[OpRecord]) -> tuple[OpRecord, tuple[int, int]] | None:
    """The linear op whose output holds the cell's tensor as one block of its channels (q, k
    and v split from one fused layer), and where that block starts. Found by the values,
    never by the module's names."""
    values = cell.record.values
    width = values.shape[-1] if values.ndim else 0
    for op in ops:
        out = op.out.values
        if not width or out.ndim < 2 or out.shape[-1] <= width or \
                math.prod(out.shape[:-1]) != math.prod(values.shape[:-1]):
            continue  # the leading axes: the same, or flattened ((B*T, out): addmm's)
        out = out.reshape((*values.shape[:-1], out.shape[-1]))
        for first in range(out.shape[-1] - width + 1):
            if np.array_equal(out[..., first:first + width], values, equal_nan=True):
                return op, (first, width)
    return None


def _own_layer(cell: Cell, ops: list[OpRecord]) -> tuple[OpRecord, tuple[int, int]]:
    """The per-head layer whose output is the block of columns holding the cell: heads that
    ran as their own modules are shown side by side, d_h channels each. Found by the values
    (the block equals that layer's output), never by the module's names."""
    values = cell.record.values
    for op in ops:
        width = op.out.shape[-1] if op.out.shape else 0
        if not width or op.out.shape[:-1] != values.shape[:-1] or values.shape[-1] % width:
            continue
        head, channel = divmod(cell.index[-1], width)
        if np.array_equal(op.out.values, values[..., head * width:(head + 1) * width]):
            return op, (head, channel)
    raise WhyError(f"cannot tell which linear op of stage {cell.stage.id} made {cell.name}")


def moved(cell: Cell) -> Why:
    """view / transpose: the same number, found at another index of the input."""
    ops = cell.ops("view", "reshape", "transpose", "permute", "contiguous")
    op = next((o for o in ops if o.name != "contiguous"
               and np.array_equal(o.out.values, cell.record.values)), None)
    if op is None:
        raise WhyError(f"cannot tell which op of stage {cell.stage.id} made {cell.name}")
    source = cell.operand(op, 0)
    if op.name in ("view", "reshape"):
        flat = int(np.ravel_multi_index(cell.index, op.out.shape))
        at = tuple(int(k) for k in np.unravel_index(flat, source.shape))
        how = f"the same memory read as shape {tuple(op.out.shape)}: element {flat} in order"
    else:
        # permute(0, 2, 1, 3) or permute((0, 2, 1, 3)) (einops' rearrange passes a tuple)
        axes = [a for arg in op.args[1:] for a in (arg if isinstance(arg, tuple) else (arg,))
                if isinstance(a, int)]
        order = list(range(len(cell.index)))
        if op.name == "transpose" and len(axes) == 2:
            a, b = (x % len(order) for x in axes)
            order[a], order[b] = order[b], order[a]
        elif op.name == "permute" or (op.name == "transpose" and len(axes) == len(order)):
            order = [int(a) for a in axes]  # NumPy's transpose(1, 0, 2) is a permutation
        at = tuple(cell.index[order.index(k)] for k in range(len(order)))
        how = f"axes {axes} swapped: the index read in the other order"
    computed = float(source[at])
    return Why(cell.stage.id, cell.stage.kind, cell.record.name, cell.index, where(cell),
               f"{cell.name} = input[{', '.join(map(str, at))}]",
               (Term(f"the input at [{', '.join(map(str, at))}]", (), computed),),
               (how, "moved, not computed"), computed, cell.recorded)


def maker(cell: Cell, names: set[str] | None = None) -> tuple[OpRecord, tuple[int, ...]]:
    """The stage's op whose output is the cell's tensor (read in the same order, maybe in
    another shape), and the cell's index in that output. The last such op: a pass-through
    after it (contiguous, a reshape) holds the same numbers."""
    values = cell.record.values
    found = None
    for op in cell.stage.ops:
        out = op.out.values
        if (names is None or op.name in names) and out.size == values.size and \
                out.dtype == values.dtype and np.array_equal(out.reshape(values.shape), values):
            found = op
    if found is None:
        raise WhyError(f"cannot tell which op of stage {cell.stage.id} made {cell.name}")
    return found, reindex(cell.index, values.shape, found.out.shape)


def broadcast_lead(operand: np.ndarray, lead: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The operand's own index for the output's leading index `lead` of a matmul (the last
    two axes are the matrices): torch and NumPy broadcast the leading axes, so an axis of size
    1 is read at 0 (one K/V head shared by every query head) and a missing axis is dropped."""
    n = operand.ndim - 2
    own = list(lead)[len(lead) - n:] if n > 0 else []
    return tuple(0 if size == 1 else k for k, size in zip(own, operand.shape[:n], strict=True))


def shared_note(own: tuple[int, ...], lead: tuple[int, ...] | list[int], what: str) -> tuple[str, ...]:
    """A note when the matmul broadcast an operand (read at another leading index)."""
    if own == tuple(lead):
        return ()
    return (f"{what} has one head, shared by every query head (multi-query): the matmul "
            f"broadcasts it, so it is read at [{', '.join(map(str, own))}]",)


def reindex(index: tuple[int, ...], shape: tuple[int, ...], other: tuple[int, ...]
            ) -> tuple[int, ...]:
    """The same element (the same place in reading order) in a tensor of another shape."""
    flat = int(np.ravel_multi_index(index, shape))
    return tuple(int(k) for k in np.unravel_index(flat, other))


def broadcast(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(values, shape)
