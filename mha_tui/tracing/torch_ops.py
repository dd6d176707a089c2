"""The PyTorch adapter: record every torch op a module's forward performs, with its line.

How it works (and what it must never do):

* A `torch.overrides.TorchFunctionMode` sees every torch function, Tensor method and
  operator (`@`, `/`, `+=`, `t[:T]`) called while it is active. Each call runs unchanged
  (the module computes its own numbers; nothing is recomputed here), then its outputs are
  snapshot as NumPy copies, so an in-place op later (`masked_fill_`, `+=`) cannot rewrite
  what was recorded. Inside the handler the mode is off, so the ops that one op makes
  internally (F.linear inside nn.Linear) are not recorded twice.
* Forward pre/post hooks on every submodule of the roots give the submodule path
  (`heads.1.query`) and the module calls; hooks on the roots capture the forward's own
  arguments and result, and decide what is recorded: only ops that run inside a root's
  forward, whatever outer callable (a whole GPT-2) calls it.
* Each op is attributed to the innermost frame of "own code": a file outside torch, the
  root's own forward, or torch's `F.multi_head_attention_forward` (so nn.MultiheadAttention
  is shown step by step with torch's lines). Ops inside a library module such as nn.Linear
  therefore point at the line that called the module.
* Tensor identity (`id`, kept alive for the recording) links every argument to the op that
  made it, or to the forward's input, a parameter, a buffer, or a constant.

No module is edited and no mha-tui code runs inside a forward except these hooks. This
adapter is imported only when a torch module is traced. Never import rich, textual or typer.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import CodeType, FrameType, TracebackType

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..ops.graph import python_only
from ..records import (
    ModuleCall,
    OpRecord,
    RecordedError,
    Recording,
    Ref,
    Snapshot,
    Statement,
)
from .args import recorded_arguments
from .snapshots import Pending, Snapshots, snapshot, tensors_in
from .source import source_at  # the module's own line: shared with the NumPy adapter

__all__ = ["RecordResult", "Recorder", "op_name", "record", "snapshot", "source_at"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_THIS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _package_dir(name: str) -> str | None:
    """Where an installed package lives, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return os.path.dirname(origin) + os.sep if origin else None


# Libraries that only spell tensor ops for the module (einops' rearrange runs as reshape and
# permute inside einops/_backends.py): an op they run is placed at the module's line that
# called them, never at theirs.
_SPELLING_DIRS = tuple(d for d in (_package_dir("einops"),) if d)
_NOT_THE_MODULE = (_TORCH_DIR, _THIS_DIR, *_SPELLING_DIRS)
_MHA_FORWARD = F.multi_head_attention_forward

# Operators by their dunder name, as a learner would call them.
_DUNDER = {
    "__add__": "add", "__radd__": "add", "__iadd__": "add_",
    "__sub__": "sub", "__rsub__": "rsub", "__isub__": "sub_",
    "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_",
    "__truediv__": "div", "__rtruediv__": "rdiv", "__itruediv__": "div_",
    "__matmul__": "matmul", "__rmatmul__": "rmatmul", "__imatmul__": "matmul_",
    "__pow__": "pow", "__rpow__": "rpow", "__neg__": "neg",
    "__getitem__": "getitem", "__setitem__": "setitem",
    "__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le", "__gt__": "gt",
    "__ge__": "ge", "__invert__": "bitwise_not", "__and__": "bitwise_and",
    "__or__": "bitwise_or", "__xor__": "bitwise_xor", "__floordiv__": "floor_divide",
    "__mod__": "remainder",
}

# Tensor methods that hand a tensor's values to Python and make no tensor: `.item()` in a
# print, `.tolist()`, `if (w < 0).any():`, an f-string.
PYTHON_READS = frozenset({"item", "tolist", "numpy", "__repr__", "__str__", "__format__",
                          "__float__", "__int__", "__bool__", "__index__", "__complex__",
                          "__array__"})


@functools.lru_cache(maxsize=4096)
def op_name(func: Callable[..., object]) -> tuple[str, str]:
    """(canonical name, qualified name) of a torch function, method or operator."""
    name = getattr(func, "__name__", type(func).__name__)
    owner = getattr(func, "__self__", None)
    if name == "__get__" and owner is not None:  # a property such as Tensor.T or Tensor.mT
        name = getattr(owner, "__name__", "get")
        return name, f"Tensor.{name}"
    qual = getattr(func, "__qualname__", name)
    module = getattr(func, "__module__", None) or ""
    qualname = qual if qual.startswith("Tensor.") or qual.startswith("_TensorBase.") else (
        f"{module}.{qual}" if module else qual)
    for prefix, plain in (("_TensorBase.", "Tensor."), ("TensorBase.", "Tensor."),
                          ("torch._C._nn.", "torch.nn.functional.")):
        qualname = qualname.replace(prefix, plain)
    return _DUNDER.get(name, name), qualname


# ----------------------------------------------------------------------- snapshots


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor)


# An op as the recorder first keeps it: name, qualname, module path, module class, inputs,
# args, kwargs, outputs (maybe Pending), source, in place. A tuple: building an OpRecord
# costs as much as the op itself, and a print loop's ops are never built (_Session.build).
_Draft = tuple[str, str, str, str, tuple[Ref, ...], tuple[object, ...],
               tuple[tuple[str, object], ...], tuple[object, ...], Statement, bool]


def _built(index: int, d: _Draft, inputs: tuple[Ref, ...]) -> OpRecord:
    outputs = tuple(o.resolve() if isinstance(o, Pending) else o for o in d[7])
    return OpRecord(index=index, name=d[0], qualname=d[1], module=d[2], module_class=d[3],
                    inputs=inputs, args=d[5], kwargs=d[6], outputs=outputs,  # type: ignore[arg-type]
                    source=d[8], in_place=d[9])


def _writes(kwargs: tuple[tuple[str, object], ...]) -> bool:
    """`out=` or `generator=`: the op changes a state (see ops.graph.writes)."""
    return any(key in ("out", "generator") and value is not None for key, value in kwargs)


def _plain(value: object) -> object:
    """A non-tensor argument as a plain Python value the recogniser can read."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.Size):
        return tuple(int(v) for v in value)
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, slice):
        return ("slice", _plain(value.start), _plain(value.stop), _plain(value.step))
    if value is Ellipsis:
        return "..."
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)


# ----------------------------------------------------------------------- the recorder


@dataclass
class _Session:
    """One root module's forward being recorded."""

    name: str
    module: nn.Module
    names: dict[int, tuple[str, str]]  # id(param or buffer) -> ("param"|"buffer", name)
    codes: frozenset[CodeType]
    inputs: list[tuple[str, Snapshot]] = field(default_factory=list)
    # Each op as recorded (its OpRecord's fields but the index, outputs maybe Pending); the
    # OpRecords are built once, by Recorder.finish, for the ops the recording keeps.
    drafts: list[_Draft] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    calls: list[ModuleCall] = field(default_factory=list)
    producers: dict[int, Ref] = field(default_factory=dict)  # id(tensor) -> the op output it is
    input_refs: dict[int, Ref] = field(default_factory=dict)
    const_refs: dict[int, Ref] = field(default_factory=dict)
    alive: list[object] = field(default_factory=list)
    stack: list[tuple[str, str, int, Statement | None, tuple[tuple[str, Ref], ...]]] = field(
        default_factory=list)
    output: Ref | None = None
    error: RecordedError | None = None
    failed_at: Statement | None = None
    done: bool = False
    read: set[int] = field(default_factory=set)  # ops whose value Python read (PYTHON_READS)
    # id(code) -> (code, is it the forward's, is it outside torch and mha-tui, is it own):
    # a code object hashes its whole body, an id does not; the code is kept, so is its id.
    seen: dict[int, tuple[CodeType, bool, bool, bool]] = field(default_factory=dict)
    # (id(code), line, callers' ids and lines) -> the Statement there (Recorder.where)
    sources: dict[tuple[object, ...], Statement] = field(default_factory=dict)

    def _facts(self, code: CodeType) -> tuple[CodeType, bool, bool, bool]:
        facts = self.seen.get(id(code))
        if facts is None:
            forward = code in self.codes
            mine = not code.co_filename.startswith(_NOT_THE_MODULE)
            facts = self.seen[id(code)] = (code, forward, mine,
                                           forward or mine or code is _MHA_FORWARD.__code__)
        return facts

    def is_own(self, code: CodeType) -> bool:
        """Code an op is placed at: the root's forward, a file outside torch and mha-tui,
        or torch's F.multi_head_attention_forward."""
        return self._facts(code)[3]

    def is_forward(self, code: CodeType) -> bool:
        return self._facts(code)[1]

    def is_mine(self, code: CodeType) -> bool:
        """A file outside torch, mha-tui and the libraries that only spell ops (einops)."""
        return self._facts(code)[2]

    def known(self, ids_and_lines: tuple[int, ...]) -> list[CodeType]:
        """The code objects of `_callers`' ids (every one was seen)."""
        return [self.seen[i][0] for i in ids_and_lines[0::2]]

    def ref(self, t: torch.Tensor) -> Ref:
        key = id(t)
        made = self.producers.get(key)
        if made is not None:
            return made
        if key in self.input_refs:
            return self.input_refs[key]
        if key in self.names:
            kind, name = self.names[key]
            ref = Ref(kind, name=name, snapshot=snapshot(t))  # type: ignore[arg-type]
            self.const_refs[key] = ref
            self.names.pop(key, None)  # snapshot a parameter once (snapshot() may have re-entered)
            self.input_refs[key] = ref
            self.alive.append(t)
            return ref
        if key not in self.const_refs:
            self.const_refs[key] = Ref("const", snapshot=snapshot(t))
            self.alive.append(t)
        return self.const_refs[key]

    def build(self) -> None:
        """The OpRecords, from the drafts, without the ops that only fed Python
        (`print(w.sum().item())` in a loop: `ops.graph.python_only`): they change no tensor
        the output depends on and are never a stage, so a loop of prints costs the recording
        nothing after it ran. The ops kept are numbered again, and every reference with them.
        A forward that raised keeps every op (it returned nothing to reach)."""
        drafts, self.drafts = self.drafts, []
        dropped = frozenset() if self.error is not None or not self.read else python_only(
            [d[0] for d in drafts], [d[4] for d in drafts], self.read, self.output,
            {i for i, d in enumerate(drafts) if d[9] or _writes(d[6])})
        if dropped and any(ref.kind == "op" and ref.op in dropped
                           for call in self.calls for _, ref in call.inputs):
            dropped = frozenset()  # a module called on one and kept: keep them all
        if not dropped:
            self.ops = [_built(i, d, d[4]) for i, d in enumerate(drafts)]
            return
        new: dict[int, int] = {}
        refs: dict[tuple[int, int], Ref] = {}

        def moved(ref: Ref) -> Ref:
            if ref.kind != "op" or ref.op is None:
                return ref
            key = (ref.op, ref.output)
            if key not in refs:
                refs[key] = Ref("op", op=new[ref.op], output=ref.output)
            return refs[key]

        kept_before = [0] * (len(drafts) + 1)  # how many ops are kept before op i
        for i, d in enumerate(drafts):
            kept_before[i + 1] = kept_before[i] + (i not in dropped)
            if i not in dropped:
                new[i] = kept_before[i]
                self.ops.append(_built(new[i], d, tuple(moved(r) for r in d[4])))
        self.calls = [replace(call, first=kept_before[call.first], end=kept_before[call.end],
                              inputs=tuple((n, moved(r)) for n, r in call.inputs))
                      for call in self.calls
                      if call.first == call.end or any(i not in dropped
                                                       for i in range(call.first, call.end))]
        self.output = moved(self.output) if self.output is not None else None
        self.read = {new[i] for i in self.read if i in new}

    def recording(self) -> Recording:
        cls = type(self.module)
        try:
            file = inspect.getsourcefile(cls) or ""
        except (TypeError, OSError):  # a class defined in a notebook cell has no file
            file = ""
        return Recording(
            module_class=cls.__name__, module_file=file, inputs=tuple(self.inputs),
            ops=tuple(self.ops), calls=tuple(self.calls), output=self.output, error=self.error,
            read=frozenset(self.read),
        )


class _Mode(TorchFunctionMode):
    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        session = self.recorder.active
        snaps = self.recorder.snaps
        if snaps.pending:  # a snapshot not copied yet: copy it before this op may write it
            snaps.before(_name_of(func), args, kwargs)
        if session is None:
            result = func(*args, **kwargs)
            if snaps.pending:
                snaps.outside(tensors_in(result))
            return result
        if func is _MHA_FORWARD:
            return self.recorder.expand(self, func, args, kwargs)
        try:
            result = func(*args, **kwargs)
        except Exception:
            session.failed_at = self.recorder.where(session)
            raise
        self.recorder.op(session, func, args, kwargs, result)
        return result


def _name_of(func: Callable[..., object]) -> str:
    try:
        return op_name(func)[0]
    except TypeError:  # not hashable: no cache
        return op_name.__wrapped__(func)[0]


class Recorder:
    """Records the roots' forwards while `run()` executes (see `record`)."""

    def __init__(self, roots: Mapping[str, nn.Module], lazy: bool = True) -> None:
        self.roots = dict(roots)
        self.sessions: dict[str, _Session] = {}
        self.active_stack: list[_Session] = []
        self.snaps = Snapshots(lazy)

    @property
    def active(self) -> _Session | None:
        return self.active_stack[-1] if self.active_stack else None

    # -------------------------------------------------------------- hooks

    def install(self) -> list[torch.utils.hooks.RemovableHandle]:
        handles = []
        for root_name, root in self.roots.items():
            handles.append(root.register_forward_pre_hook(
                self._root_pre(root_name), with_kwargs=True, prepend=True))
            # Not always_call: a forward that raises stays active until `fail` records it.
            handles.append(root.register_forward_hook(self._root_post(root_name)))
            for path, sub in root.named_modules():
                if sub is root:
                    continue
                handles.append(sub.register_forward_pre_hook(self._sub_pre(path), prepend=True,
                                                             with_kwargs=True))
                handles.append(sub.register_forward_hook(self._sub_post(path), always_call=True))
        return handles

    def _root_pre(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
            if name in self.sessions:  # a second call of the same root is not recorded
                return
            names: dict[int, tuple[str, str]] = {}
            for pname, p in module.named_parameters():
                names[id(p)] = ("param", pname)
            for bname, b in module.named_buffers():
                names[id(b)] = ("buffer", bname)
            codes = {type(module).forward.__code__} if hasattr(type(module).forward, "__code__") else set()
            session = _Session(name=name, module=module, names=names, codes=frozenset(codes))
            try:
                bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
                named = list(bound.arguments.items())
            except (TypeError, ValueError):
                named = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
            for arg_name, value in named:
                for i, t in enumerate(tensors_in(value)):
                    # a tuple argument's tensors by their index (`past_kv[0]`, as the
                    # module's line reads it); a tensor argument by its name
                    label = arg_name if isinstance(value, torch.Tensor) else f"{arg_name}[{i}]"
                    if id(t) in session.input_refs:  # the same x passed as query, key, value
                        continue
                    snap = snapshot(t)
                    session.inputs.append((label, snap))
                    session.input_refs[id(t)] = Ref("input", name=label, snapshot=snap)
                    session.alive.append(t)
            self.sessions[name] = session
            self.active_stack.append(session)

        return hook

    def _root_post(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[object, ...], output: object) -> None:
            session = self.sessions.get(name)
            if session is None or session.done or self.active is not session:
                return
            session.done = True
            self.active_stack.pop()
            out = tensors_in(output)
            if out:
                session.output = session.ref(out[0])

        return hook

    def _sub_pre(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
            session = self.active
            if session is None:
                return
            source = self.where(session)
            inputs: tuple[tuple[str, Ref], ...] = ()
            if type(module).__module__.startswith("torch."):  # a library module's arguments
                try:
                    bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
                    named = list(bound.arguments.items())
                except (TypeError, ValueError):
                    named = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
                inputs = tuple((name, session.ref(value)) for name, value in named
                               if isinstance(value, torch.Tensor))
            session.stack.append((path, type(module).__name__, len(session.drafts), source,
                                  inputs))

        return hook

    def _sub_post(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[object, ...], output: object) -> None:
            session = self.active
            if session is None or not session.stack or session.stack[-1][0] != path:
                return
            _, cls, first, source, inputs = session.stack.pop()
            library = type(module).__module__.startswith("torch.")
            session.calls.append(ModuleCall(path, cls, library, first, len(session.drafts), source,
                                            inputs))

        return hook

    # -------------------------------------------------------------- ops

    def where(self, session: _Session, frame: FrameType | None = None) -> Statement:
        """The innermost frame of the module's own code, as a Statement.

        Every op asks this, so the answer is kept per place: the frame's code and line and
        those of its callers (a loop's line is read and parsed once, not once a pass)."""
        frame = frame or sys._getframe(1)
        fallback = None
        while frame is not None:
            code = frame.f_code
            if session.is_own(code):
                callers = self._callers(session, frame)
                key = (id(code), frame.f_lineno, callers)
                source = session.sources.get(key)
                if source is None:
                    source = source_at(code.co_filename, frame.f_lineno, code.co_name, code)
                    if callers:
                        source = replace(source, callers=tuple(
                            source_at(c.co_filename, line, c.co_name, c)
                            for c, line in zip(session.known(callers), callers[1::2], strict=True)))
                    session.sources[key] = source
                return source
            fallback = fallback or frame
            frame = frame.f_back
        if fallback is not None:
            return source_at(fallback.f_code.co_filename, fallback.f_lineno, fallback.f_code.co_name)
        return Statement(file="", line=0, text="")

    def _callers(self, session: _Session, frame: FrameType) -> tuple[int, ...]:
        """The module's own statements that called the helper `frame` runs in, innermost
        first (at most 3), up to the first frame that is not the module's code (torch's
        module call machinery above a forward): id(code), line, id(code), line, ..."""
        if session.is_forward(frame.f_code):
            return ()
        callers: list[int] = []
        up = frame.f_back
        while up is not None and len(callers) < 6:
            code = up.f_code
            forward = session.is_forward(code)
            if not (forward or session.is_mine(code)):
                break
            callers += (id(code), up.f_lineno)
            if forward:
                break
            up = up.f_back
        return tuple(callers)

    def op(self, session: _Session, func: Callable[..., object], args: tuple[object, ...],
           kwargs: dict[str, object], result: object) -> None:
        name, qualname = op_name(func)
        in_place = (name.endswith("_") and not name.startswith("_")) or name == "setitem"
        outputs = tensors_in(result)
        if name == "setitem" and args and isinstance(args[0], torch.Tensor):
            outputs = [args[0]]
        if not outputs:  # shape, size, dim, item, ...: no tensor made
            if name in PYTHON_READS and args and isinstance(args[0], torch.Tensor):
                made = session.producers.get(id(args[0]))
                if made is not None:
                    session.read.add(made.op)  # type: ignore[arg-type]
            return
        inputs, plain_args, plain_kwargs = recorded_arguments(
            args, kwargs.items(), _is_tensor, session.ref, _plain)
        path, cls = (session.stack[-1][0], session.stack[-1][1]) if session.stack else ("", "")
        index = len(session.drafts)
        session.drafts.append((  # outputs may hold Pending snapshots until finish()
            name, qualname, path, cls, tuple(inputs), plain_args, plain_kwargs,
            tuple([self.snaps.take(t) for t in outputs]), self.where(session), in_place))
        for i, t in enumerate(outputs):
            session.producers[id(t)] = Ref("op", op=index, output=i)
            session.alive.append(t)

    def expand(self, mode: _Mode, func: Callable[..., object], args: tuple[object, ...],
               kwargs: dict[str, object]) -> object:
        """Run F.multi_head_attention_forward with the mode on, so its steps are recorded.

        There is no public way to re-enter a function's own body under the mode that
        dispatched it (its `has_torch_function` check would dispatch again, forever), so
        that one check is answered False for the duration of the call; F.linear, softmax
        and every op inside still go through the mode.
        """
        original = F.has_torch_function
        F.has_torch_function = lambda ops: False  # only multi_head_attention_forward uses it
        try:
            with mode:
                return func(*args, **kwargs)
        finally:
            F.has_torch_function = original

    def finish(self) -> bool:
        """Resolve every pending snapshot (see snapshots.py) and build each session's ops;
        False if a snapshot was written without an op saying so, and the recording must be
        made again with copies."""
        alive = [t for session in self.sessions.values() for t in session.alive]
        for session in self.sessions.values():
            session.alive.clear()  # `alive` is now the recorder's one reference to each
        ok = self.snaps.finish(alive)
        del alive
        for session in self.sessions.values():
            session.build()
        return ok

    def fail(self, error: BaseException, tb: TracebackType | None) -> None:
        """The forward raised: record torch's message and the failing line."""
        for session in self.active_stack:
            source = session.failed_at
            if source is None:
                frame = None
                while tb is not None:
                    frame = tb.tb_frame
                    tb = tb.tb_next
                source = self.where(session, frame) if frame is not None else None
            message = str(error).strip() or type(error).__name__
            session.error = RecordedError(type(error).__name__, message, source)
        self.active_stack.clear()


@dataclass(frozen=True, eq=False)
class RecordResult:
    """What `record` returns: run()'s result, every root's recording, and the exception."""

    value: object
    recordings: dict[str, Recording]
    error: BaseException | None = None


def record(run: Callable[[], object], roots: Mapping[str, nn.Module]) -> RecordResult:
    """Call `run()` and record every op executed inside each root module's forward.

    `roots` names the modules to watch (`{"": module}` for one; `{"h.0.attn": ..., ...}`
    for every layer of a model); `run` is any callable that ends up calling them (the
    module itself, or a whole model's forward, which passes its own arguments). Each root's
    first call is recorded: its arguments and result (through hooks), and every torch op
    inside it. If `run` raises, the exception is returned, not raised, and the recording
    of the root that was running ends with the error.

    What the module prints goes to stderr, whoever asked for the forward (explain, check's
    second run, --against, the notebook): stdout is a transcript's or a script's JSON.
    """
    with contextlib.redirect_stdout(sys.stderr):
        return _record(run, roots, lazy=True)


def _record(run: Callable[[], object], roots: Mapping[str, nn.Module], lazy: bool) -> RecordResult:
    rng = torch.random.get_rng_state() if lazy else None
    recorder = Recorder(roots, lazy)
    handles = recorder.install()
    value: object = None
    error: BaseException | None = None
    try:
        # The mode is not kept on the recorder: no reference cycle, so the recording is
        # freed as soon as the last reference to it goes, without the garbage collector.
        with _Mode(recorder):
            value = run()
    except Exception as exc:
        error = exc
        recorder.fail(exc, exc.__traceback__)
    finally:
        for handle in handles:
            handle.remove()
    if not recorder.finish() and rng is not None:
        # Something wrote into a recorded tensor without an op saying so: record the
        # forward again (same random draws) with every snapshot copied when taken.
        del value, error, recorder
        torch.random.set_rng_state(rng)
        return _record(run, roots, lazy=False)
    return RecordResult(value, {name: s.recording() for name, s in recorder.sessions.items()},
                        error)
