"""Which mechanism, of those a kind's rules found again (a soft-cap, a sink, a difference of
two softmax maps), a stage holds: the lookup every such kind's judge and mechanism make.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

from ...records import Stage
from .unit import Unit


class _HoldsOps(Protocol):
    @property
    def ops(self) -> frozenset[int]: ...


H = TypeVar("H", bound=_HoldsOps)


def held(found: Iterable[H], by: Stage | Unit) -> H | None:
    """The mechanism found whose ops the stage (or the unit a build() makes it from) holds,
    or None."""
    ops = set(by.ops) if isinstance(by, Unit) else {op.index for op in by.ops}
    return next((x for x in found if x.ops & ops), None)
