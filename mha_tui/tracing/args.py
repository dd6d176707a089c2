"""An op's arguments as the records keep them: arrays replaced by `TensorArg`, the rest plain.

Shared by the torch and NumPy adapters; each says what an array is, how to refer to one, and
how to make any other value plain. Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..records import Ref, TensorArg


def recorded_arguments(args: Iterable[object], kwargs: Iterable[tuple[str, object]],
                       is_array: Callable[[object], bool], ref: Callable[[object], Ref],
                       plain: Callable[[object], object]
                       ) -> tuple[list[Ref], tuple[object, ...], tuple[tuple[str, object], ...]]:
    """(inputs, args, kwargs): every array argument once, in order, and where it came from."""
    found = _Found(is_array, ref, plain)
    converted = tuple([found.convert(a) for a in args])  # a list: no generator per op
    return found.inputs, converted, tuple([(k, found.convert(v)) for k, v in kwargs])


# TensorArg(0), TensorArg(1), ...: frozen and equal by value, so one of each serves every op.
_ARGS = tuple(TensorArg(i) for i in range(8))


class _Found:
    """The arrays among one op's arguments. A class, not a closure that calls itself: that
    would be a reference cycle holding the recording until the garbage collector ran."""

    def __init__(self, is_array: Callable[[object], bool], ref: Callable[[object], Ref],
                 plain: Callable[[object], object]) -> None:
        self.is_array, self.ref, self.plain = is_array, ref, plain
        self.inputs: list[Ref] = []
        self.seen: dict[int, int] = {}

    def convert(self, value: object) -> object:
        if self.is_array(value):
            key = id(value)
            if key not in self.seen:
                self.seen[key] = len(self.inputs)
                self.inputs.append(self.ref(value))
            index = self.seen[key]
            return _ARGS[index] if index < len(_ARGS) else TensorArg(index)
        if isinstance(value, list | tuple) and any(self.is_array(v) for v in value):
            return tuple(self.convert(v) for v in value)
        return self.plain(value)
