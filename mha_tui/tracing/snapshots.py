"""Snapshots of torch tensors, copied only when a copy is needed (copy-on-write).

An op's output is recorded as it is when the op returns. Copying every output at once
(`snapshot`) was the largest cost of tracing after the forward itself: at C 768, T 512 the
(B, h, T, T) scores, scaled, masked and weights tensors alone are 50 MB of copies. Most are
never changed again, so `Snapshots` keeps the tensor and its version counter instead, and
copies it only when that copy is needed:

* before an op that may write into its storage (an in-place method `masked_fill_`, `+=`,
  `t[...] = v`, `out=`, `inplace=True`) or hand it to code torch cannot see (`.numpy()`,
  `np.asarray`, `data_ptr`): every pending snapshot in that storage is copied first, and a
  storage handed out is copied eagerly from then on;
* at the end of the recording, for every storage something outside the recording can still
  reach (the output the caller gets back, the forward's input, a parameter or buffer, a
  tensor the module kept on itself, a tensor made outside the recorded forward): the caller
  may change it later, so the snapshot is a copy;
* every other snapshot becomes a read-only NumPy view of the tensor itself (nothing else
  holds it, so nothing can change it; the view keeps it alive).

A write that none of these saw (a library op that writes into an argument in place without
saying so) still bumps the tensor's version counter: `finish()` then reports it, and the
recorder records the forward again with every snapshot copied at once. Never import rich,
textual or typer here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

from ..records import Snapshot

# Below this many elements a copy costs less than keeping track of the tensor.
_SMALL = 4096

# Functional forms that write into their first argument when told to (inplace=True, also
# positionally), and ops that hand the memory to code torch cannot see.
_INPLACE_FLAG = frozenset({
    "relu", "relu6", "elu", "selu", "celu", "leaky_relu", "hardtanh", "threshold", "rrelu",
    "silu", "mish", "hardswish", "hardsigmoid", "dropout", "alpha_dropout",
    "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d",
})
_EXPOSING = frozenset({
    "numpy", "__array__", "__dlpack__", "data_ptr", "untyped_storage", "storage",
    "_typed_storage", "__array_wrap__", "set_", "resize_", "as_strided_",
})


def storage_key(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, sparse)
        return id(t)


# torch.dtype -> its name in a Snapshot ("float32"): str() of a dtype costs as much as a copy
# of a small tensor, and a forward's loop snapshots thousands.
_DTYPE_NAMES: dict[torch.dtype, str] = {}
# The dtypes NumPy holds as they are (bfloat16 and float16 are recorded as float32).
_AS_IS = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.int16,
                    torch.int8, torch.uint8, torch.bool})


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _small_copy(data: torch.Tensor) -> Snapshot:
    """snapshot() of a small CPU tensor in a dtype NumPy holds: NumPy copies it (a torch clone
    costs more than the copy at this size), and the storage is read from the data pointer
    without making a storage object. Same Snapshot as the general path."""
    offset = data.storage_offset()
    return Snapshot(values=np.array(data.numpy(), order="C"), shape=tuple(data.shape),
                    strides=data.stride(), contiguous=data.is_contiguous(),
                    storage=data.data_ptr() - offset * data.element_size(),
                    storage_offset=offset, dtype=dtype_name(data.dtype))


def snapshot(t: torch.Tensor) -> Snapshot:
    """A copy of the tensor's values now, with its layout (strides, storage) as it is."""
    data = t.detach()
    if 0 < data.numel() < _SMALL and data.dtype in _AS_IS and data.layout == torch.strided \
            and data.is_cpu and not data.is_conj() and not data.is_neg():
        return _small_copy(data)
    if data.dtype in (torch.bfloat16, torch.float16):
        copy = data.to(torch.float32)
    elif data.is_contiguous():
        copy = data.clone()
    else:
        copy = data.contiguous()  # copies already
    if copy.device.type != "cpu":
        copy = copy.cpu()
    return _snapshot_of(data, copy.resolve_conj().resolve_neg().numpy())


def _snapshot_of(data: torch.Tensor, values: object) -> Snapshot:
    strided = data.layout == torch.strided
    return Snapshot(
        values=values,  # type: ignore[arg-type]
        shape=tuple(data.shape),
        strides=tuple(data.stride()) if strided else (),
        contiguous=bool(data.is_contiguous()),
        storage=storage_key(data),
        storage_offset=int(data.storage_offset()) if strided else 0,
        dtype=dtype_name(data.dtype),
    )


@dataclass(eq=False)
class Pending:
    """A tensor recorded but not copied yet; `snap` is set once it is (or is viewed)."""

    tensor: torch.Tensor
    version: int
    storage: int
    snap: Snapshot | None = None

    def resolve(self) -> Snapshot:
        assert self.snap is not None, "Snapshots.finish() resolves every pending snapshot"
        return self.snap


def writes(name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> bool:
    """Whether an op may write into one of its tensor arguments."""
    if (name.endswith("_") and not name.startswith("_")) or name == "setitem":
        return True
    if kwargs.get("out") is not None or kwargs.get("inplace") is True:
        return True
    return name in _INPLACE_FLAG and any(a is True for a in args[1:])


class Snapshots:
    """The recording's snapshots, copy-on-write (see the module docstring)."""

    def __init__(self, lazy: bool = True) -> None:
        self.lazy = lazy
        self.pending: dict[int, list[Pending]] = {}  # storage -> snapshots not copied yet
        self.exposed: set[int] = set()  # storages handed to code torch cannot see
        self.shared: set[int] = set()  # storages reached by tensors the recording never saw
        self.all: list[Pending] = []

    def take(self, t: torch.Tensor) -> Snapshot | Pending:
        """The tensor as it is now: a copy, or a pending snapshot of it."""
        if not self.lazy or t.numel() < _SMALL or t.layout != torch.strided \
                or t.device.type != "cpu" or t.dtype in (torch.bfloat16, torch.float16) \
                or not t.is_contiguous() or t.is_conj() or t.is_neg() or t.is_inference() \
                or t.requires_grad:
            return snapshot(t)
        key = storage_key(t)
        if key in self.exposed:
            return snapshot(t)
        # `_version` is the counter autograd checks saved tensors with; torch offers no
        # public reader (only torch.autograd.graph.increment_version, the writer).
        pending = Pending(t, t._version, key)
        self.pending.setdefault(key, []).append(pending)
        self.all.append(pending)
        return pending

    def before(self, name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        """Called before every op while recording: copy what it may write or expose."""
        if not self.pending:
            return
        exposing = name in _EXPOSING
        if not exposing and not writes(name, args, kwargs):
            return
        for t in tensors_in((args, tuple(kwargs.values()))):
            key = storage_key(t)
            if exposing:
                self.exposed.add(key)
            for pending in self.pending.pop(key, ()):
                pending.snap = snapshot(pending.tensor)

    def outside(self, outputs: list[torch.Tensor]) -> None:
        """An op the recording does not keep (outside every root's forward) made these: a
        view among them can reach a recorded storage after the recording ends."""
        if self.pending:
            self.shared.update(storage_key(t) for t in outputs)

    def finish(self, alive: list[object]) -> bool:
        """Resolve every pending snapshot: a copy where something outside the recording can
        reach its storage, else a read-only view. `alive`: every tensor the recorder holds
        (each once per reference it keeps). False if a pending tensor was written without
        an op saying so (its version moved): its snapshot would be wrong."""
        pendings, self.all = self.all, []
        self.pending.clear()
        unsaid = any(p.snap is None and p.tensor._version != p.version for p in pendings)
        if unsaid:
            for p in pendings:
                p.snap = p.snap or snapshot(p.tensor)
            return False
        reached = set(self.shared) | self.exposed
        held: dict[int, int] = {}  # id -> references the recorder itself holds
        tensors: dict[int, torch.Tensor] = {}
        for t in alive:
            held[id(t)] = held.get(id(t), 0) + 1
            tensors[id(t)] = t  # type: ignore[assignment]
        for p in pendings:
            held[id(p.tensor)] = held.get(id(p.tensor), 0) + 1
            tensors[id(p.tensor)] = p.tensor
        # A view keeps its base's Python object alive from C++: one reference more, however
        # many views there are (`_base`, the documented way to find a view's base).
        bases = {id(t._base) for t in tensors.values() if t._base is not None}
        baseline = _baseline()
        for key, t in tensors.items():
            if sys.getrefcount(t) - baseline > held[key] + (key in bases):  # held elsewhere
                reached.add(storage_key(t))
        for p in pendings:
            if p.snap is not None:
                continue
            if p.storage in reached:
                p.snap = snapshot(p.tensor)
            else:
                values = p.tensor.detach().numpy()
                values.flags.writeable = False  # the recording's view: nothing writes into it
                p.snap = _snapshot_of(p.tensor, values)
        return True


def _baseline() -> int:
    """sys.getrefcount of a tensor that only `finish`'s own dict and loop variable hold."""
    probe = {0: torch.empty(0)}
    for _, t in probe.items():
        return sys.getrefcount(t)
    return 0


def tensors_in(value: object) -> list[torch.Tensor]:
    """Every tensor in value, through nested lists and tuples, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v)]
    return []
