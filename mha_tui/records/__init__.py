"""What a recorded forward pass is made of, as plain frozen data.

Two layers, one way:

* **ops** -- what the tracer saw. `mha_tui.tracing` (one adapter per array library:
  `tracing/torch_ops.py` for PyTorch, `tracing/numpy_ops.py` for NumPy) runs a module's forward and
  writes one `OpRecord` per operation it performed: the op's name, the submodule whose
  forward was running (`heads.1.query`), where every tensor argument came from (`Ref`: an
  earlier op, the forward's own input, a parameter, a buffer, a constant), the non-tensor
  arguments (`dim=-1`, the scalar divisor), a `Snapshot` of each output taken when the op
  ran (so a later in-place `masked_fill_` cannot rewrite history), and the `Statement` of
  the module's own code that called it. A `Recording` holds them, in the order they ran,
  with the forward's arguments, its result, and the error if it raised. A `Recorded` is
  what the tracer hands on: the recording and the facts only the array library could
  compute (the embedding lookup, `Embedded`; whether a second call gave the same output).
* **stages** -- what a learner reads. `mha_tui.recognise` (which never imports torch) groups
  the ops into `Stage`s: a `kind` (embed, project, view, transpose, scores, scale, mask,
  softmax, dropout, attend, concat, w_o, op, error), the `Statement` shown, the ops it
  holds, the tensors to draw (`TensorRecord`) and the checks computed from them. A `Trace`
  is the stages of one forward, with the module it came from.

Everything here is NumPy arrays and plain Python values: a record can be rendered, dumped,
checked or recognised in a process that never imported torch. Values are copies taken at
record time (or windows onto them), never recomputed.
Never import torch, rich, textual or typer here (NumPy only under TYPE_CHECKING: the app
paints its first frame before NumPy is imported).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import TYPE_CHECKING, Literal

from ..config import Config

if TYPE_CHECKING:
    import numpy as np

# ---------------------------------------------------------------------------- ops layer


@dataclass(frozen=True)
class Statement:
    """A place in the code that ran: the statement of the module's own code behind an op.

    `line` is the line Python was executing; `text` is the whole statement around it, as
    read from `file` (the file that ran, not a copy), dedented; `end_line` its last line.
    Ops inside a library module (nn.Linear, nn.Dropout) point at the line that called the
    module; ops inside torch's own attention function (for nn.MultiheadAttention) point at
    torch's lines.
    """

    file: str
    line: int
    text: str
    end_line: int = 0
    function: str = ""
    callers: tuple[Statement, ...] = field(default=(), compare=False)
    """When the statement is inside a helper of the module's own (`def split_heads(t)`,
    `def attention(q, k, v)`): the statements that called it, innermost first, up to the
    module's forward (a tensor the helper returns is named by its caller's assignment)."""

    @property
    def lines(self) -> tuple[int, int]:
        return self.line, max(self.line, self.end_line)


@dataclass(frozen=True, eq=False)
class Snapshot:
    """One tensor as it was at the moment it was recorded.

    `values` is a copy (later in-place ops do not change it). `storage` identifies the
    memory the tensor lived in (equal numbers: the same storage; a view shares it), so
    "is this a view?" can be answered without the tensor.
    """

    values: np.ndarray
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    contiguous: bool
    storage: int
    storage_offset: int = 0
    dtype: str = "float32"
    # torch counts strides in elements, NumPy in bytes: shown with the unit they are in.
    stride_unit: str = "elements"

    @property
    def ndim(self) -> int:
        return len(self.shape)


RefKind = Literal["op", "input", "param", "buffer", "const"]


@dataclass(frozen=True, eq=False)
class Ref:
    """Where a tensor argument of an op came from.

    kind "op": output `output` of op number `op`; "input": the forward's argument called
    `name`; "param"/"buffer": the root module's parameter or buffer `name` (`W_Q.weight`,
    `causal_mask`); "const": a tensor made outside the forward (or by an unrecorded
    call). Anything but "op" carries its own snapshot.
    """

    kind: RefKind
    name: str = ""
    op: int | None = None
    output: int = 0
    snapshot: Snapshot | None = None


@dataclass(frozen=True)
class TensorArg:
    """Stands in an op's `args`/`kwargs` for its tensor argument number `index` (see inputs)."""

    index: int


@dataclass(frozen=True, eq=False)
class OpRecord:
    """One operation the forward performed.

    name: canonical (`matmul` for `@`, `div` for `/`, `add_` for `+=`, `getitem` for
    `t[:T, :T]`, `linear`, `softmax`, ...); qualname: how torch called it
    (`Tensor.__truediv__`). module: the submodule path whose forward was running ("" for
    the root; `heads.1.query`), module_class its class name. inputs: every tensor
    argument in order; args/kwargs: the call's arguments with tensors replaced by
    `TensorArg`, everything else as plain Python values (ints, floats, tuples, str).
    outputs: a snapshot of every tensor it returned (a tuple result gives several).
    """

    index: int
    name: str
    qualname: str
    module: str
    module_class: str
    inputs: tuple[Ref, ...]
    args: tuple[object, ...]
    kwargs: tuple[tuple[str, object], ...]
    outputs: tuple[Snapshot, ...]
    source: Statement
    in_place: bool = False

    @property
    def out(self) -> Snapshot:
        return self.outputs[0]

    def kwarg(self, name: str, default: object = None) -> object:
        for key, value in self.kwargs:
            if key == name:
                return value
        return default

    def scalars(self) -> tuple[object, ...]:
        """The non-tensor positional arguments, in order."""
        return tuple(a for a in self.args if not isinstance(a, TensorArg))


@dataclass(frozen=True)
class ModuleCall:
    """A submodule's forward running inside the root's, from op `first` to op `end` - 1.

    library: the class is defined by torch (nn.Linear, nn.Dropout, nn.MultiheadAttention).
    inputs: a library module's tensor arguments by its forward's parameter names, where each
    came from (nn.MultiheadAttention's query, key and value: which sequence each one is,
    even when its forward fails before any op reads them).
    """

    path: str
    class_name: str
    library: bool
    first: int
    end: int
    source: Statement | None = None
    inputs: tuple[tuple[str, Ref], ...] = ()


@dataclass(frozen=True)
class RecordedError:
    """The forward raised: torch's own message and the line that failed."""

    type: str
    message: str
    source: Statement | None


@dataclass(frozen=True, eq=False)
class Recording:
    """Everything one call of a module's forward did, in order.

    inputs: the forward's own arguments by parameter name (tensors only), as snapshots;
    output: where its result (the first tensor of a tuple) came from, None when it raised.
    """

    module_class: str
    module_file: str
    inputs: tuple[tuple[str, Snapshot], ...]
    ops: tuple[OpRecord, ...]
    calls: tuple[ModuleCall, ...] = ()
    output: Ref | None = None
    error: RecordedError | None = None
    # The array library the forward ran in: "torch" or "numpy".
    library: str = "torch"
    # The ops whose result the forward read into Python (`.item()`, `.tolist()`, a print,
    # an `if`): such a value changes no tensor unless it comes back as one.
    read: frozenset[int] = frozenset()

    def snapshot(self, ref: Ref) -> Snapshot:
        """The tensor a reference points at, as it was recorded."""
        if ref.kind == "op":
            assert ref.op is not None
            return self.ops[ref.op].outputs[ref.output]
        assert ref.snapshot is not None
        return ref.snapshot


@dataclass(frozen=True)
class Embedded:
    """The embed stage's facts, gathered by the tracer: ids -> table rows -> x."""

    ids: Snapshot
    table: Snapshot
    x: Snapshot
    source: Statement
    looked_up: bool
    table_name: str = "embedding.weight"


@dataclass(frozen=True, eq=False)
class Recorded:
    """What the tracer hands to the recogniser: one recording, the run's configuration, and
    what only the array library could compute -- the embedding lookup (None when x was given),
    whether a second call returned the same output (None when the forward raised), how many
    numbers the module's parameters hold."""

    recording: Recording
    config: Config
    embedded: Embedded | None = None
    forward_equal: bool | None = None
    n_params: int | None = None


# ---------------------------------------------------------------------------- stages layer

Kind = Literal["signed", "prob", "int"]

@dataclass(frozen=True, eq=False)
class TensorRecord:
    """One tensor as the module made it, with what a learner needs to read it."""

    name: str
    dims: tuple[str, ...]
    values: np.ndarray
    strides: tuple[int, ...]
    contiguous: bool
    # Whether it is a window onto the stage input's memory (None: nothing to compare).
    shares_storage: bool | None = None
    shares_with: str = ""
    # "elements" (torch) or "bytes" (NumPy): strides are shown in the unit the library uses.
    stride_unit: str = "elements"
    kind: Kind = "signed"
    # Axis whose entries go to heads in blocks of d_h (Q's channels, W_Q's rows, ...).
    head_split: int | None = None
    caption: str = ""
    # For a tensor whose rows are not tokens (the wrong view): what each row holds.
    row_tags: tuple[tuple[str, ...], ...] | None = None
    row_tag_heads: tuple[tuple[int, ...], ...] | None = None
    # The tensor's own dtype when `values` holds it in a wider one: a bfloat16 tensor is kept
    # as float32 (NumPy has no bfloat16; float32 holds every bfloat16 number exactly).
    # "": the values' own dtype.
    dtype: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def own_dtype(self) -> str:
        """The dtype the module computed this tensor in (`bfloat16`, `float32` ...)."""
        return self.dtype or str(self.values.dtype)

    def complex_parts(self) -> tuple[TensorRecord, ...]:
        """A complex tensor (Meta's Llama keeps its rotary angles as complex `freqs_cis`) as
        the two real tensors torch gives for it, `t.real` and `t.imag`: the module's own
        numbers, each a view of every other float of the complex storage (strides doubled
        in elements). A real tensor is itself."""
        values = self.values
        if values.dtype.kind != "c":
            return (self,)
        strides = tuple(2 * s for s in self.strides) if self.stride_unit == "elements" else self.strides
        code = all(piece.isidentifier() for piece in self.name.split("."))  # `mixed`, `self.freqs`
        return tuple(replace(
            self, name=f"{self.name}.{part}" if code else f"{self.name} ({word} part)",
            values=getattr(values, part).copy(), strides=strides, contiguous=False,
            caption=f"{values.dtype} numbers: their {word} parts (torch's .{part}, every other "
                    f"float of the storage)" + (f"; {self.caption}" if self.caption else ""))
            for part, word in (("real", "real"), ("imag", "imaginary")))


@dataclass(frozen=True)
class Check:
    """A fact about the stage, computed from its tensors.

    ok is what the computation said about an invariant; None marks a plain measurement.
    """

    label: str
    ok: bool | None


@dataclass(frozen=True, eq=False)
class Stage:
    """One step a learner reads: a kind, the code that ran, its tensors and checks.

    id: unique in the trace (the kind, or `op-3` when a kind repeats); kind: a stage kind
    (`mha_tui.kinds.registry`, embed and error besides); source: the module's line shown
    (the first op's; `code` holds every distinct statement of the stage's ops); ops: the
    recorded ops it holds, in order; raised: on the `error` stage, the exception's type
    (`RuntimeError`), set where the stage is made.
    """

    id: str
    title: str
    code: str
    explanation: str
    shape_in: tuple[int, ...]
    shape_out: tuple[int, ...]
    dims_in: tuple[str, ...]
    dims_out: tuple[str, ...]
    tensors: tuple[TensorRecord, ...]
    checks: tuple[Check, ...] = ()
    note: str = ""
    # Shown on request: the tempting wrong alternative (a single view at `transpose`).
    aside: tuple[TensorRecord, ...] = field(default=())
    kind: str = ""
    source: Statement | None = None
    ops: tuple[OpRecord, ...] = ()
    raised: str = ""
    blocks: str = ""
    """On a stage that masks (mask, sdpa's mask, a mask inside baddbmm): what its blocked
    entries are, read from what the mask op wrote (kinds/_parts/mask_shape.MaskShape.kind:
    causal, window, padding, causal+padding, none, other; "window 3" with its w)."""

    @property
    def transition(self) -> str:
        """`(1, 4, 4) -> (1, 4, 2, 2)`, shapes as torch prints them; an error stage made
        nothing: `(3, 3) -> raised`."""
        if self.kind == "error":
            return f"{_shape(self.shape_in)} -> raised"
        return f"{_shape(self.shape_in)} -> {_shape(self.shape_out)}"

    @property
    def dims_transition(self) -> str:
        if self.kind == "error":
            return f"({', '.join(self.dims_in)}) -> raised"
        return f"({', '.join(self.dims_in)}) -> ({', '.join(self.dims_out)})"

    def tensor(self, name: str) -> TensorRecord:
        for record in self.tensors:
            if record.name == name:
                return record
        raise KeyError(name)


@dataclass(frozen=True)
class ModuleInfo:
    """The module that was explained: its class and the file its forward came from.

    per_head_modules: the heads ran as separate modules (a ModuleList of heads) and their
    results are shown side by side, as for a fused module.
    """

    class_name: str
    file: str
    per_head_modules: bool = False
    weights: str = ""  # --weights: the file its parameters and buffers were replaced from


@dataclass(frozen=True, eq=False)
class DecodeStep:
    """One token generated against a KV cache (`--decode N`): the step's place in the run
    and how its output compares with the full, uncached forward's row for the same token.

    index: 0 .. steps - 1; position: the new token's position t (prefill + index); style:
    how the module keeps its cache, in words ("passed in as layer_past and returned");
    full_row: the uncached forward's output at position t, (B, C) as computed by the module;
    max_diff: the largest |step output - full_row|; equal: within float32 rounding.
    cache_bytes / cache_tokens: what the cache held after the step (its tensors as the
    module keeps them), None when it could not be read."""

    index: int
    steps: int
    position: int
    prefill: int
    style: str
    full_row: np.ndarray | None = None
    max_diff: float | None = None
    equal: bool | None = None
    cache_bytes: int | None = None
    cache_tokens: int | None = None
    cache_shapes: tuple[tuple[int, ...], ...] = ()
    cache_dtype: str = ""

    @property
    def bytes_per_token(self) -> int | None:
        if self.cache_bytes is None or not self.cache_tokens:
            return None
        return self.cache_bytes // self.cache_tokens


@dataclass(frozen=True, eq=False)
class Trace:
    config: Config
    stages: tuple[Stage, ...]
    module: ModuleInfo | None = None
    recording: Recording | None = None
    # `--decode N`: this trace is one decode step (its place and its comparison with the
    # full forward); the first step's trace also holds every step's, in order (itself first).
    step: DecodeStep | None = None
    steps: tuple[Trace, ...] = ()

    def stage(self, stage_id: str) -> Stage:
        for stage in self.stages:
            if stage.id == stage_id:
                return stage
        raise KeyError(stage_id)

    def index(self, stage_id: str) -> int:
        return [stage.id for stage in self.stages].index(stage_id)

    @property
    def batched(self) -> bool:
        """Whether x has a batch axis: (B, T, C) for torch modules, (T, C) for NumPy's."""
        return self.recording is None or self.recording.library != "numpy"

    @property
    def failed(self) -> bool:
        """The forward raised: the last stage is the `error` stage."""
        return bool(self.stages) and self.stages[-1].kind == "error"

    @property
    def error_type(self) -> str:
        """The exception the forward raised (`RuntimeError`), "" when it did not raise."""
        return self.stages[-1].raised if self.failed else ""

    @property
    def raised(self) -> str:
        """What the forward raised, where, and torch's words: `RuntimeError at crash_attn.py
        line 23: view size is ...` ("" when it did not raise)."""
        if not self.failed:
            return ""
        error = self.stages[-1]
        where = ""
        if error.source is not None:
            where = f" at {PurePath(error.source.file).name} line {error.source.line}"
        return f"{self.error_type}{where}: {error.explanation}"


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
