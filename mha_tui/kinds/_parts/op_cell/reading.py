"""An op's recorded arguments read alike for torch and NumPy (`OpCell`), where its tensor
arguments came from (`tensor_name`), and broadcasting (`read_at`); the op-name families.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np

from ....records import OpRecord, TensorArg
from ..cell import Cell, Term, Why, where
from ..maker import possessive

IDENTITY = {"contiguous", "clone", "detach", "float", "double", "half", "bfloat16", "to",
             "type", "type_as", "astype", "copy", "bool", "int", "long"}
SAME_ORDER = {"view", "reshape", "view_as", "reshape_as", "flatten", "unflatten", "ravel",
               "squeeze", "unsqueeze", "expand_dims"}
UNARY = {
    "neg": ("-a", np.negative), "negative": ("-a", np.negative), "exp": ("exp(a)", np.exp),
    "log": ("log(a)", np.log), "sqrt": ("√a", np.sqrt), "rsqrt": ("1 / √a", lambda a: 1 / np.sqrt(a)),
    "tanh": ("tanh(a)", np.tanh), "sigmoid": ("1 / (1 + exp(-a))", lambda a: 1 / (1 + np.exp(-a))),
    "relu": ("max(a, 0)", lambda a: np.maximum(a, 0)),
    "silu": ("a / (1 + exp(-a))", lambda a: a / (1 + np.exp(-a))),
    "abs": ("|a|", np.abs), "absolute": ("|a|", np.abs), "square": ("a × a", np.square),
    "reciprocal": ("1 / a", lambda a: 1 / a), "sin": ("sin(a)", np.sin), "cos": ("cos(a)", np.cos),
    "erf": ("erf(a)", np.vectorize(math.erf)), "real": ("the real part of a", np.real),
    "imag": ("the imaginary part of a", np.imag), "logical_not": ("not a", np.logical_not),
    "bitwise_not": ("not a", lambda a: np.logical_not(a) if a.dtype == bool else ~a),
}
BINARY = {
    "add": ("a + b", np.add), "sub": ("a - b", np.subtract), "mul": ("a × b", np.multiply),
    "div": ("a / b", np.divide), "true_divide": ("a / b", np.divide), "pow": ("a ^ b", np.power),
    "rsub": ("b - a", lambda a, b: b - a), "rdiv": ("b / a", lambda a, b: b / a),
    "rpow": ("b ^ a", lambda a, b: np.power(b, a)), "maximum": ("max(a, b)", np.maximum),
    "minimum": ("min(a, b)", np.minimum), "eq": ("a == b", np.equal), "ne": ("a != b", np.not_equal),
    "lt": ("a < b", np.less), "le": ("a <= b", np.less_equal), "gt": ("a > b", np.greater),
    "ge": ("a >= b", np.greater_equal), "logical_and": ("a and b", np.logical_and),
    "bitwise_and": ("a and b", np.logical_and), "bitwise_or": ("a or b", np.logical_or),
    "logical_or": ("a or b", np.logical_or),
}
REDUCE = {"sum", "mean", "max", "amax", "min", "amin", "prod", "var", "std", "norm",
           "linalg_vector_norm", "vector_norm", "logsumexp", "argmax", "argmin"}
ALONG = {"softmax", "log_softmax", "cumsum"}
PRODUCTS = {"matmul", "mm", "bmm", "rmatmul", "linear", "addmm", "baddbmm", "einsum"}


SYMBOLS = {"add": "+", "sub": "-", "rsub": "-", "mul": "*", "div": "/", "rdiv": "/",
           "matmul": "@", "rmatmul": "@", "pow": "**", "rpow": "**", "neg": "-", "getitem": "[]",
           "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
           "bitwise_not": "~", "bitwise_and": "&", "bitwise_or": "|", "setitem": "[] ="}
_PUBLIC = {"torch._C._fft": "torch.fft", "torch._C._linalg": "torch.linalg",
           "torch._C._special": "torch.special", "torch._C._nn": "torch.nn.functional"}


class Unknown(Exception):
    """This call is not one mha-tui recomputes (an op it does not know, arguments it cannot
    read): the why says so and recomputes nothing."""


def bracket(index: tuple[int, ...]) -> str:
    return f"[{', '.join(map(str, index))}]"


class OpCell:
    """Output `out` of `op` at `index`: the op's arguments read alike for torch and NumPy."""

    def __init__(self, cell: Cell, op: OpRecord, out: int, index: tuple[int, ...]) -> None:
        self.cell, self.op, self.out, self.index = cell, op, out, index
        recording = cell.trace.recording
        self.numpy = recording is not None and recording.library == "numpy"
        base = op.name[:-1] if op.name.endswith("_") and not op.name.startswith("_") else op.name
        self.base = base.lstrip("_")
        self.shape = op.outputs[out].shape
        self.recorded = op.outputs[out].values[index]
        self.notes: list[str] = []  # what the operands' names need said (tensor_name)

    @property
    def display(self) -> str:
        """The op as the code calls it: `torch.relu`, `Tensor.transpose`, `np.exp`, `/`,
        `torch.fft.fftn` (not torch._C._fft.fft_fftn)."""
        owner, _, method = (self.op.qualname or self.op.name).rpartition(".")
        if method.startswith("__") and method.endswith("__"):
            return f"`{SYMBOLS.get(self.base, method)}`"
        if owner in ("torch._VariableFunctionsClass", "torch._C._VariableFunctions"):
            return f"torch.{method}"
        public = _PUBLIC.get(owner)
        if public:
            return f"{public}.{method.removeprefix(public.rsplit('.', 1)[-1] + '_')}"
        return self.op.qualname or self.op.name

    # ------------------------------------------------------------------ arguments

    def arg(self, pos: int, *names: str, default: object = None) -> object:
        if len(self.op.args) > pos:
            return self.op.args[pos]
        for name in names:
            value = self.op.kwarg(name, self)
            if value is not self:
                return value
        return default

    def array(self, value: object) -> np.ndarray:
        if isinstance(value, TensorArg):
            return np.asarray(self.cell.operand(self.op, value.index))
        if isinstance(value, bool | int | float):
            return np.asarray(value, dtype=np.float64)
        raise Unknown(f"an argument mha-tui cannot read ({value!r})")

    def name(self, value: object) -> str:
        """A tensor argument by where it came from; a number as the call gave it."""
        if not isinstance(value, TensorArg):
            return f"{value:g}" if isinstance(value, float) else repr(value)
        return tensor_name(self.cell, self.op, value.index, self.notes)

    def dims(self, value: object, ndim: int, default: object = None) -> tuple[int, ...] | None:
        if value is None or value == ():
            return None if default is None else self.dims(default, ndim)
        values = value if isinstance(value, tuple | list) else (value,)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise Unknown(f"a dim mha-tui cannot read ({value!r})")
        return tuple(sorted(int(v) % ndim for v in values))

    def why(self, formula: str, terms: list[Term], notes: list[str], computed: float) -> Why:
        c = self.cell
        notes = [*notes, *(n for n in self.notes if n not in notes)]
        return Why(c.stage.id, c.stage.kind, c.record.name, c.index, where(c), formula,
                   tuple(terms), tuple(notes), float(np.real(computed)),
                   float(np.real(c.record.values[c.index])))


def tensor_name(cell: Cell, op: OpRecord, k: int, notes: list[str] | None = None) -> str:
    """Where input k of op came from: the forward's input or a parameter by its name, an
    earlier stage's tensor with equal values by that stage and name (also when the stage
    shows its axes in another order: then a line for `notes` says so), else the op that
    made it."""
    ref = op.inputs[k]
    if ref.kind in ("input", "param", "buffer"):
        return ref.name
    if ref.kind == "const":
        return "a constant"
    values = cell.operand(op, k)
    recording = cell.trace.recording
    assert recording is not None and ref.op is not None
    producer = recording.ops[ref.op]
    for stage in cell.trace.stages:
        if any(o.index == producer.index for o in stage.ops):
            record = next((r for r in reversed(stage.tensors) if _same_tensor(r.values, values)),
                          None)
            if record is not None:
                name = record.name if stage.id == cell.stage.id else \
                    f"{possessive(stage.id)} {record.name}"
                if record.values.shape != values.shape and notes is not None:
                    said = (f"{name} is read as this op received it, {tuple(values.shape)}; the "
                            f"{stage.id} stage shows it as {tuple(record.values.shape)}")
                    if said not in notes:
                        notes.append(said)
                return name
    target = re.match(r"\s*([A-Za-z_]\w*)\s*=(?!=)", producer.source.text)
    made = f"made by {producer.name} at line {producer.source.line}"
    return f"{target.group(1)} ({made})" if target else f"a tensor {made}"


def _same_tensor(shown: np.ndarray, operand: np.ndarray) -> bool:
    """The stage shows this operand: the same values, or the same values with the axes in the
    stage's order (attend shows TransformerLens' z (B, T, h, d_h) as (B, h, T, d_h))."""
    if shown.shape == operand.shape:
        return bool(np.array_equal(shown, operand))
    if sorted(shown.shape) != sorted(operand.shape) or shown.ndim > 5:
        return False
    return any(np.array_equal(np.transpose(operand, order), shown)
               for order in itertools.permutations(range(operand.ndim))
               if tuple(operand.shape[i] for i in order) == shown.shape)


def read_at(values: np.ndarray, out_index: tuple[int, ...]) -> tuple[int, ...]:
    """The index of `values` an output cell reads after broadcasting: axes aligned on the
    right, a size-1 axis read at 0."""
    lead = len(out_index) - values.ndim
    return tuple(0 if n == 1 else out_index[lead + k] for k, n in enumerate(values.shape))


def number(value: np.ndarray | float) -> float:
    return float(np.real(value))


