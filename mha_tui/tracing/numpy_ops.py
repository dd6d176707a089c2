"""The NumPy adapter: record every NumPy operation a forward performs, with its line.

The same `Recording` the PyTorch adapter writes, from NumPy's own dispatch protocols, so the
recogniser (which never imports torch) gives the same stages:

* The forward receives each input array as a `Traced`, a thin `np.ndarray` subclass. NumPy
  hands every ufunc on it (`@`, `+`, `-`, `*`, `/`, `np.exp`, the reductions behind
  `.sum()` and `.max()`) to its `__array_ufunc__`, and every public function
  (`np.einsum`, `np.max`, `np.stack`, `np.triu`, ...) to its `__array_function__`; the
  array methods a forward calls (`reshape`, `transpose`, `.T`, `astype`, indexing, `sum`,
  `max`, `mean`, ...) are overridden one by one. Each call runs unchanged on plain arrays
  (the module computes its own numbers; nothing is recomputed here), its outputs are
  copied into `Snapshot`s at once (a later in-place `+=` or `[...] =` cannot rewrite
  what was recorded) and handed back to the forward as `Traced` views of the same memory.
* Because the call runs on plain arrays, whatever NumPy does inside it (`np.max` calling
  `ndarray.max` calling `maximum.reduce`) is not recorded a second time.
* Each op is attributed to the innermost frame outside NumPy and outside this package: the
  module's own line, or the line of a helper it calls (the blueprint's `softmax`).
* Array identity links every argument to the op that made it, to the forward's input, to
  one of the module's arrays (`W_Q`, found by attribute name: a "param"), or to a constant.
  Strides are NumPy's own, in bytes (`Snapshot.stride_unit`).

No module is edited and no mha-tui code runs inside its forward except these dispatch
methods. Imported only when a NumPy module is traced; never import torch, rich, textual or
typer here (a subprocess test checks that a NumPy run leaves torch out of sys.modules).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import CodeType, FrameType, TracebackType
from typing import TYPE_CHECKING

import numpy as np

from ..config import config_for
from ..load.learner import forward_of
from ..records import Embedded, OpRecord, Recorded, RecordedError, Recording, Ref, Snapshot, Statement
from .args import recorded_arguments
from .source import source_at

if TYPE_CHECKING:
    from ..config import Config

_NUMPY_DIR = os.path.dirname(np.__file__) + os.sep
_THIS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NOT_THE_MODULE = (_NUMPY_DIR, _THIS_DIR)

# NumPy's names, as the recogniser reads them (torch's spelling where the meaning is the same).
_UFUNC_NAMES = {
    "add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "div", "divide": "div",
    "matmul": "matmul", "power": "pow", "negative": "neg", "equal": "eq", "not_equal": "ne",
    "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge",
    "invert": "bitwise_not", "floor_divide": "floor_divide", "remainder": "remainder",
}
_REDUCE_NAMES = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "prod",
                 "logical_and": "all", "logical_or": "any"}
_FUNCTION_NAMES = {"amax": "max", "amin": "min", "dot": "matmul", "moveaxis": "movedim"}
_METHOD_NAMES = {"dot": "matmul"}


# ----------------------------------------------------------------------- snapshots


def _owner(a: np.ndarray) -> np.ndarray:
    """The array that owns the memory a view looks at."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def snapshot(a: np.ndarray) -> Snapshot:
    """A copy of the array's values now, with its layout as NumPy reports it (bytes)."""
    plain = a.view(np.ndarray) if isinstance(a, Traced) else a
    owner = _owner(plain)
    start = _address(owner)
    offset = (_address(plain) - start) // plain.itemsize if plain.itemsize else 0
    return Snapshot(
        values=np.array(plain, copy=True, order="C"),
        shape=tuple(int(n) for n in plain.shape),
        strides=tuple(int(s) for s in plain.strides),
        contiguous=bool(plain.flags.c_contiguous),
        storage=start,
        storage_offset=int(offset),
        dtype=str(plain.dtype),
        stride_unit="bytes",
    )


def _plain(value: object) -> object:
    """A non-array argument as a plain Python value the recogniser can read."""
    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, slice):
        return ("slice", _plain(value.start), _plain(value.stop), _plain(value.step))
    if value is Ellipsis:
        return "..."
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    return repr(value)


def _unwrap(value: object) -> object:
    """Traced arrays as plain ndarrays (same memory), through lists, tuples and dicts."""
    if isinstance(value, Traced):
        return value.view(np.ndarray)
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


def _arrays(value: object) -> list[np.ndarray]:
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, list | tuple):
        return [a for v in value for a in _arrays(v)]
    return []


# ----------------------------------------------------------------------- the array type

_ACTIVE: list[_Session] = []


def _run(name: str, qualname: str, fn: Callable[..., object], args: tuple[object, ...],
         kwargs: dict[str, object], *, target: Traced | None = None) -> object:
    """Run one NumPy call on plain arrays; record it when a forward is being recorded.

    target: the array an in-place call writes into (`out=`, `x[...] = v`).
    """
    session = _ACTIVE[-1] if _ACTIVE else None
    plain_args, plain_kwargs = _unwrap(args), _unwrap(kwargs)
    if session is None:
        return fn(*plain_args, **plain_kwargs)  # type: ignore[operator]
    return session.call(name, qualname, fn, args, kwargs, plain_args, plain_kwargs, target)


class Traced(np.ndarray):
    """An ndarray whose every operation is recorded while its forward runs.

    A view of the same memory as the array it wraps: values, shape, strides and dtype are
    NumPy's own. Outside a recording it behaves as a plain ndarray.
    """

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: object, **kwargs: object) -> object:
        out = kwargs.get("out")
        target = None
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)
            target = next((o for o in outs if isinstance(o, Traced)), None)
        base = ufunc.__name__
        if method == "__call__":
            name, qualname = _UFUNC_NAMES.get(base, base), f"np.{base}"
        elif method == "reduce":
            name, qualname = _REDUCE_NAMES.get(base, f"{base}.reduce"), f"np.{base}.reduce"
        else:
            name = qualname = f"np.{base}.{method}"
        if target is not None:
            name += "_"
        return _run(name, qualname, getattr(ufunc, method), inputs, kwargs, target=target)

    def __array_function__(self, func: Callable[..., object], types: object,
                           args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        base = getattr(func, "__name__", "function")
        module = getattr(func, "__module__", "numpy") or "numpy"
        qualname = "np." + (base if module.startswith("numpy") and module.count(".") <= 1
                            else f"{module.removeprefix('numpy.')}.{base}")
        return _run(_FUNCTION_NAMES.get(base, base), qualname, func, args, kwargs)

    # The array methods a forward calls: recorded as one op each, under their own name.

    def __getitem__(self, key: object) -> object:
        return _run("getitem", "ndarray.__getitem__", np.ndarray.__getitem__, (self, key), {})

    def __setitem__(self, key: object, value: object) -> None:
        _run("setitem", "ndarray.__setitem__", np.ndarray.__setitem__, (self, key, value), {},
             target=self)

    @property
    def T(self) -> object:
        return _run("T", "ndarray.T", lambda a: a.T, (self,), {})

    @property
    def mT(self) -> object:
        return _run("mT", "ndarray.mT", lambda a: a.mT, (self,), {})


def _method(method: str) -> Callable[..., object]:
    impl = getattr(np.ndarray, method)

    def call(self: Traced, *args: object, **kwargs: object) -> object:
        return _run(_METHOD_NAMES.get(method, method), f"ndarray.{method}", impl, (self, *args), kwargs)

    call.__name__ = call.__qualname__ = method
    call.__doc__ = impl.__doc__
    return call


for _name in ("reshape", "transpose", "swapaxes", "astype", "copy", "flatten", "ravel", "squeeze",
              "max", "min", "sum", "mean", "std", "var", "prod", "argmax", "argmin", "cumsum",
              "clip", "dot", "round", "repeat", "take", "all", "any"):
    setattr(Traced, _name, _method(_name))


def traced(a: np.ndarray) -> Traced:
    """The array as the forward receives it while it is recorded: a view, same memory."""
    return a.view(Traced)


# ----------------------------------------------------------------------- the recorder


def module_arrays(obj: object, prefix: str = "", depth: int = 0,
                  seen: set[int] | None = None) -> dict[str, np.ndarray]:
    """The module's own arrays by attribute path (`W_Q`, `heads.0.W_q`): its "parameters"."""
    seen = seen if seen is not None else set()
    found: dict[str, np.ndarray] = {}
    if id(obj) in seen or depth > 3:
        return found
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list | tuple):
        items = [(str(i), v) for i, v in enumerate(obj)]
    else:
        try:
            items = list(vars(obj).items())
        except TypeError:
            return found
    for key, value in items:
        if isinstance(value, np.ndarray):
            if id(value) not in seen:
                seen.add(id(value))
                found[f"{prefix}{key}"] = value
        elif isinstance(value, list | tuple | dict) or (
                hasattr(value, "__dict__") and not isinstance(value, type)
                and not inspect.isroutine(value) and not inspect.ismodule(value)):
            found.update(module_arrays(value, f"{prefix}{key}.", depth + 1, seen))
    return found


@dataclass
class _Session:
    """One forward being recorded."""

    module: object
    names: dict[int, str]
    inputs: list[tuple[str, Snapshot]] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    producers: dict[int, tuple[int, int]] = field(default_factory=dict)
    refs: dict[int, Ref] = field(default_factory=dict)
    alive: list[object] = field(default_factory=list)
    failed_at: Statement | None = None
    codes: frozenset[CodeType] = frozenset()  # the forward's own code: where callers stop

    def ref(self, a: np.ndarray) -> Ref:
        key = id(a)
        if key in self.producers:
            op, out = self.producers[key]
            return Ref("op", op=op, output=out)
        if key not in self.refs:
            if key in self.names:
                self.refs[key] = Ref("param", name=self.names[key], snapshot=snapshot(a))
            else:
                self.refs[key] = Ref("const", snapshot=snapshot(a))
            self.alive.append(a)
        return self.refs[key]

    def call(self, name: str, qualname: str, fn: Callable[..., object], args: tuple[object, ...],
             kwargs: dict[str, object], plain_args: object, plain_kwargs: object,
             target: Traced | None) -> object:
        # Where every array came from, before the call: an in-place call rewrites its target.
        inputs, recorded_args, recorded_kwargs = recorded_arguments(
            args, ((k, v) for k, v in kwargs.items() if k != "out"),
            lambda v: isinstance(v, np.ndarray), self.ref, _plain)
        try:
            result = fn(*plain_args, **plain_kwargs)  # type: ignore[arg-type, operator]
        except Exception:
            self.failed_at = self.where()
            raise
        if target is not None:
            outputs: list[np.ndarray] = [target]
            result = target if result is not None else None
        else:
            result = _wrap(result)
            outputs = [a for a in _arrays(result) if isinstance(a, Traced)]
        if not outputs:
            return result  # a shape, a Python number, a 0-d scalar: no array made
        index = len(self.ops)
        self.ops.append(OpRecord(
            index=index, name=name, qualname=qualname, module="", module_class="",
            inputs=tuple(inputs), args=recorded_args, kwargs=recorded_kwargs,
            outputs=tuple(snapshot(a) for a in outputs), source=self.where(),
            in_place=target is not None,
        ))
        for i, a in enumerate(outputs):
            self.producers[id(a)] = (index, i)
            self.alive.append(a)
        return result

    def where(self, frame: FrameType | None = None) -> Statement:
        """The innermost frame of the module's own code (outside NumPy and this package),
        with the statements that called it when it is a helper (as the torch adapter does:
        a helper's returned array is named by the caller's assignment)."""
        frame = frame or sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if not code.co_filename.startswith(_NOT_THE_MODULE):
                source = source_at(code.co_filename, frame.f_lineno, code.co_name, code)
                callers = self._callers(frame)
                return replace(source, callers=callers) if callers else source
            frame = frame.f_back
        return Statement(file="", line=0, text="")

    def _callers(self, frame: FrameType) -> tuple[Statement, ...]:
        """The module's own statements that called the helper `frame` runs in, innermost
        first (at most 3), up to the forward (or the first frame that is not the module's)."""
        if frame.f_code in self.codes or not self.codes:
            return ()
        callers: list[Statement] = []
        up = frame.f_back
        while up is not None and len(callers) < 3:
            code = up.f_code
            if code.co_filename.startswith(_NOT_THE_MODULE):
                break
            callers.append(source_at(code.co_filename, up.f_lineno, code.co_name, code))
            if code in self.codes:
                break
            up = up.f_back
        return tuple(callers)

    def error(self, error: BaseException, tb: TracebackType | None) -> RecordedError:
        source = self.failed_at
        if source is None:
            frame = None
            while tb is not None:
                if not tb.tb_frame.f_code.co_filename.startswith(_NOT_THE_MODULE):
                    frame = tb.tb_frame
                tb = tb.tb_next
            source = self.where(frame) if frame is not None else None
        message = str(error).strip() or type(error).__name__
        return RecordedError(type(error).__name__, message, source)


def _codes_of(forward: Callable[..., object]) -> frozenset[CodeType]:
    """The code the forward runs: a method's function, or a callable object's __call__."""
    func = getattr(forward, "__func__", forward)
    code = getattr(func, "__code__", None)
    if code is None:  # a callable object: its class's __call__
        code = getattr(inspect.getattr_static(type(forward), "__call__", None), "__code__", None)
    return frozenset({code}) if isinstance(code, CodeType) else frozenset()


def _wrap(value: object) -> object:
    """Every array a call returned, as a Traced view (a tuple result stays a tuple)."""
    if isinstance(value, np.ndarray) and not isinstance(value, Traced):
        return value.view(Traced)
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _plain_result(value: object) -> object:
    if isinstance(value, Traced):
        return value.view(np.ndarray)
    if isinstance(value, tuple):
        return tuple(_plain_result(v) for v in value)
    if isinstance(value, list):
        return [_plain_result(v) for v in value]
    return value


@dataclass(frozen=True, eq=False)
class RecordResult:
    """What `record` returns: the forward's result (plain arrays), its recording, the exception."""

    value: object
    recordings: dict[str, Recording]
    error: BaseException | None = None


def record(module: object, args: tuple[object, ...] = (),
           kwargs: Mapping[str, object] | None = None) -> RecordResult:
    """Call the module's forward once with every ndarray argument traced, recording each op.

    The forward's own arguments are named by its signature; ndarrays among the module's
    attributes are its parameters. If the forward raises, the exception is returned, not
    raised, and the recording ends with the error (torch_ops.record does the same).
    """
    kwargs = dict(kwargs or {})
    forward = forward_of(module)
    session = _Session(module=module, names={id(a): n for n, a in module_arrays(module).items()},
                       codes=_codes_of(forward))
    try:
        bound = inspect.signature(forward).bind_partial(*args, **kwargs)
        named = list(bound.arguments.items())
    except (TypeError, ValueError):
        named = [(f"arg{i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    wrapped: dict[int, Traced] = {}

    def wrap(value: object, label: str) -> object:
        if isinstance(value, np.ndarray):
            if id(value) not in wrapped:  # the same x passed twice is one input
                t = traced(value)
                wrapped[id(value)] = t
                snap = snapshot(value)
                session.inputs.append((label, snap))
                session.refs[id(t)] = Ref("input", name=label, snapshot=snap)
                session.alive.append(t)
            return wrapped[id(value)]
        return value

    # Inputs are labelled by the forward's parameter names (x, mask).
    labels = {id(v): k for k, v in named}
    call_args = [wrap(a, labels.get(id(a), f"arg{i}")) for i, a in enumerate(args)]
    call_kwargs = {k: wrap(v, k) for k, v in kwargs.items()}
    value: object = None
    error: BaseException | None = None
    recorded_error: RecordedError | None = None
    _ACTIVE.append(session)
    try:  # what the module prints goes to stderr: stdout is a transcript's (torch_ops.record)
        with contextlib.redirect_stdout(sys.stderr):
            value = forward(*call_args, **call_kwargs)
    except Exception as exc:
        error = exc
        recorded_error = session.error(exc, exc.__traceback__)
    finally:
        _ACTIVE.remove(session)
    output: Ref | None = None
    if error is None:
        first = _arrays(value)[:1]
        if first:
            output = session.ref(first[0])
    cls = type(module)
    try:
        file = inspect.getsourcefile(cls) or ""
    except (TypeError, OSError):  # a class defined in a notebook cell has no file
        file = ""
    recording = Recording(
        module_class=cls.__name__, module_file=file, inputs=tuple(session.inputs),
        ops=tuple(session.ops), output=output, error=recorded_error, library="numpy",
    )
    return RecordResult(_plain_result(value), {"": recording}, error)


# ----------------------------------------------------------------------- the whole trace


def record_forward(module: object, x: np.ndarray, tokens: Sequence[str] | None = None, *,
                   args: tuple[object, ...] | None = None, kwargs: Mapping[str, object] | None = None,
                   table: np.ndarray | None = None, ids: np.ndarray | None = None,
                   config: Config | None = None, lookup: Statement | None = None) -> Recorded:
    """Run a NumPy module's forward on x (T, C) once and return what it did (see `mha_tui.trace`).

    args/kwargs: what forward gets (default `forward(x)`); table and ids: when given, x is
    `table[ids]` and `lookup` is the line that looked it up (the embed stage shows it). A
    forward that raises is recorded with its error.
    """
    args = (x,) if args is None else args
    kwargs = dict(kwargs or {})
    embedded = None
    if table is not None and ids is not None and lookup is not None:
        embedded = Embedded(ids=snapshot(ids), table=snapshot(table), x=snapshot(x), source=lookup,
                            looked_up=bool(np.array_equal(x, table[ids])), table_name="table")
    if config is None:
        config = config_for(module, tuple(x.shape), tokens)
    with np.errstate(all="ignore"):  # a learner's overflow is shown in the values, not warned
        result = record(module, args, kwargs)
        recording = result.recordings[""]
        forward_equal = None
        if result.error is None:
            out = _arrays(result.value)[:1]
            with contextlib.redirect_stdout(sys.stderr):
                again = _arrays(forward_of(module)(*args, **kwargs))[:1]
            forward_equal = bool(out and again and np.array_equal(out[0], again[0], equal_nan=True))
    n_params = sum(int(a.size) for a in module_arrays(module).values())
    return Recorded(recording, config, embedded=embedded, forward_equal=forward_equal,
                    n_params=n_params)
