"""Run a module's forward once and record what it did.

`record_forward(module, x, tokens)` records every torch op the forward performs
(`torch_ops.record`; one adapter per array library lives in this folder and is imported only
when used) and returns a `Recorded`: the plain recording and the facts only torch could
compute. It neither loads nor recognises: `mha_tui.pipeline` hands the recording on to
`mha_tui.recognise`. `record(run, roots)` is the lower level: watch one or several
submodules while any outer callable (a whole model's forward) runs.

The module runs unchanged: no tap, no edit, nothing of mha-tui inside its forward.
This package knows torch and the record types: never import rich, textual or typer here.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..config import Config, config_for
from ..records import Embedded, Recorded, Recording

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .torch_ops import RecordResult


def _first_tensor(value: object) -> torch.Tensor | None:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def record_forward(module: nn.Module, x: torch.Tensor | None, tokens: Sequence[str] | None = None, *,
                   call: Callable[[nn.Module, torch.Tensor], object] | None = None,
                   embedding: nn.Embedding | None = None, ids: torch.Tensor | None = None,
                   config: Config | None = None) -> Recorded:
    """Run `module` on `x` (B, T, C) once and return what its forward did (see `mha_tui.trace`).

    tokens: labels for the T axis (default t0, t1, ...). call: how to call the module
    (default `module(x)`; the loader passes e.g. `lambda m, x: m(x, x, x, attn_mask=mask)`);
    a tuple result's first element is the output. embedding and ids: when given, x is
    `embedding(ids)` and the first stage shows that lookup (x may then be None). config:
    the run's configuration when the CLI built it (sizes, seed, sentence); otherwise one is
    made from x and tokens. The module runs unchanged, in whatever mode it is in, under
    torch.no_grad(). If its forward raises, the trace ends with an `error` stage (and
    `Trace.failed` is true) instead of raising: the recording holds the error.
    """
    import torch

    call = call or (lambda m, inp: m(inp))
    # nn.MultiheadAttention has a fused fast path that skips F.multi_head_attention_forward
    # (and rounds differently); the traced run never takes it, so neither does the check.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:  # its prints go to stderr (torch_ops.record): the second call's too
        with contextlib.redirect_stdout(sys.stderr):
            return _trace(module, x, tokens, call, embedding, ids, config)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def _trace(module: nn.Module, x: torch.Tensor | None, tokens: Sequence[str] | None,
           call: Callable[[nn.Module, torch.Tensor], object], embedding: nn.Embedding | None,
           ids: torch.Tensor | None, config: Config | None) -> Recorded:
    import torch

    from .torch_ops import record as _record
    from .torch_ops import snapshot, source_at

    with warnings.catch_warnings(), torch.no_grad():
        # torch warns about NumPy interop on some platforms; a transcript must stay clean.
        warnings.simplefilter("ignore")
        embedded = None
        if embedding is not None and ids is not None:
            x = embedding(ids)  # (B, T, C)
            line = source_at(__file__, sys._getframe().f_lineno - 1)  # the line above
            embedded = Embedded(ids=snapshot(ids), table=snapshot(embedding.weight), x=snapshot(x),
                                source=line, looked_up=bool(torch.equal(x[0], embedding.weight[ids[0]])))
        if x is None:
            raise ValueError("trace() needs x, or an embedding and ids to make it")
        if config is None:
            config = config_for(module, tuple(x.shape), tokens)
        state = _State.now(module, x)  # the check re-runs dropout with the same draws
        result = _record(lambda: call(module, x), {"": module})
        recording = result.recordings.get("")
        if recording is None:
            raise ValueError(f"{type(module).__name__}'s forward never ran")
        forward_equal = None
        if result.error is None:
            out = _first_tensor(result.value)
            if state.changed(module, x) or _draws_or_writes(recording):
                # Randomness or state: only a second call tells whether the output is the
                # module's own (dropout in training mode differs; the same draws do not).
                after = torch.random.get_rng_state()
                torch.random.set_rng_state(state.rng)
                again = _first_tensor(call(module, x))
                torch.random.set_rng_state(after)
            else:
                # Nothing random and nothing kept: the traced call *is* the module's own
                # forward (every op ran unchanged), so its return value is compared with
                # the output as recorded, without running the forward a second time.
                snap = recording.snapshot(recording.output) if recording.output else None
                again = None if snap is None else torch.from_numpy(snap.values)
                if out is not None:  # recorded on the CPU, half precision as float32 (exact)
                    out = out.detach().cpu()
                    out = out.float() if out.dtype in (torch.bfloat16, torch.float16) else out
            forward_equal = out is not None and again is not None and _same(out, again)
        n_params = sum(p.numel() for p in module.parameters())
    return Recorded(recording, config, embedded=embedded, forward_equal=forward_equal,
                    n_params=n_params)


def _same(out: torch.Tensor, again: torch.Tensor) -> bool:
    """torch.equal, with NaN where the other has NaN counted equal (torch.equal says NaN !=
    NaN)."""
    import torch

    return tuple(out.shape) == tuple(again.shape) and bool(
        torch.equal(out, again) or (torch.equal(out.isnan(), again.isnan())
                                    and torch.equal(out.nan_to_num(0.0), again.nan_to_num(0.0))))


def _draws_or_writes(recording: Recording) -> bool:
    """Whether the recording shows an op that draws from a generator of its own
    (`generator=`; draws from torch's default one show in its state), or one that writes
    into a tensor that outlives the call (the forward's input, a parameter, a buffer, a
    constant: a second call would start from another state)."""
    kept: set[int] = set()
    for op in recording.ops:
        for ref in op.inputs:
            if ref.kind != "op" and ref.snapshot is not None:
                kept.add(ref.snapshot.storage)
    for _name, snap in recording.inputs:
        kept.add(snap.storage)
    for op in recording.ops:
        if op.kwarg("generator") is not None:
            return True
        writes = op.in_place or op.kwarg("out") is not None
        if writes and any(out.storage in kept for out in op.outputs):
            return True
    return False


def _numpy_state() -> tuple[object, ...]:
    import numpy as np

    return tuple(np.random.get_state())  # (name, keys, position, has_gauss, cached)


def _same_numpy_state(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    import numpy as np

    return len(a) == len(b) and all(
        np.array_equal(u, v) if isinstance(u, np.ndarray) else u == v for u, v in zip(a, b, strict=True))


class _State:
    """What a forward could change without it showing in its ops: torch's, Python's and
    NumPy's random generators, and the version counters of the module's parameters and
    buffers and of x (an in-place write inside a library op, such as batch norm's running
    statistics, bumps them)."""

    def __init__(self, rng: torch.Tensor, python: object, numpy: object,
                 versions: list[int]) -> None:
        self.rng, self.python, self.numpy, self.versions = rng, python, numpy, versions

    @staticmethod
    def _versions(module: nn.Module, x: torch.Tensor) -> list[int]:
        # `_version` is the counter autograd checks saved tensors with; torch offers no
        # public reader (only torch.autograd.graph.increment_version, the writer).
        tensors = [*module.parameters(), *module.buffers(), x]
        return [-1 if t.is_inference() else t._version for t in tensors]

    @classmethod
    def now(cls, module: nn.Module, x: torch.Tensor) -> _State:
        import random

        import torch

        return cls(torch.random.get_rng_state(), random.getstate(), _numpy_state(),
                   cls._versions(module, x))

    def changed(self, module: nn.Module, x: torch.Tensor) -> bool:
        import random

        import torch

        return (not torch.equal(torch.random.get_rng_state(), self.rng)
                or random.getstate() != self.python
                or not _same_numpy_state(_numpy_state(), self.numpy)
                or self._versions(module, x) != self.versions)


def record(run: Callable[[], object], roots: Mapping[str, nn.Module]) -> RecordResult:
    """Call `run()` and record every op inside each root's forward (see torch_ops.record)."""
    from .torch_ops import record as _record

    return _record(run, roots)
