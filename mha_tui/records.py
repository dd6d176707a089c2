"""What a recorded forward pass is made of: stages holding tensors, as plain frozen data.

Produced by `mha_tui.trace` (which knows torch), read by `mha_tui.render` and
`mha_tui.dump` (which must not need torch). Values are NumPy arrays that share memory
with the module's own tensors: nothing here is recomputed.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .config import Config

if TYPE_CHECKING:  # only an annotation here; the app paints before NumPy is imported
    import numpy as np

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
    kind: Kind = "signed"
    # Axis whose entries go to heads in blocks of d_h (Q's channels, W_Q's rows, ...).
    head_split: int | None = None
    caption: str = ""
    # For a tensor whose rows are not tokens (the wrong view): what each row holds.
    row_tags: tuple[tuple[str, ...], ...] | None = None
    row_tag_heads: tuple[tuple[int, ...], ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


@dataclass(frozen=True)
class Check:
    """A fact about the stage, computed from its tensors.

    ok is what the computation said about an invariant; None marks a plain measurement.
    """

    label: str
    ok: bool | None


@dataclass(frozen=True, eq=False)
class Stage:
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

    @property
    def transition(self) -> str:
        """`(1, 4, 4) -> (1, 4, 2, 2)`, shapes as torch prints them."""
        return f"{_shape(self.shape_in)} -> {_shape(self.shape_out)}"

    @property
    def dims_transition(self) -> str:
        return f"({', '.join(self.dims_in)}) -> ({', '.join(self.dims_out)})"

    def tensor(self, name: str) -> TensorRecord:
        for record in self.tensors:
            if record.name == name:
                return record
        raise KeyError(name)


@dataclass(frozen=True, eq=False)
class Trace:
    config: Config
    stages: tuple[Stage, ...]

    def stage(self, stage_id: str) -> Stage:
        for stage in self.stages:
            if stage.id == stage_id:
                return stage
        raise KeyError(stage_id)

    def index(self, stage_id: str) -> int:
        return [stage.id for stage in self.stages].index(stage_id)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
