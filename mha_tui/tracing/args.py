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
    inputs: list[Ref] = []
    seen: dict[int, int] = {}

    def convert(value: object) -> object:
        if is_array(value):
            key = id(value)
            if key not in seen:
                seen[key] = len(inputs)
                inputs.append(ref(value))
            return TensorArg(seen[key])
        if isinstance(value, list | tuple) and any(is_array(v) for v in value):
            return tuple(convert(v) for v in value)
        return plain(value)

    converted = tuple(convert(a) for a in args)
    return inputs, converted, tuple((k, convert(v)) for k, v in kwargs)
