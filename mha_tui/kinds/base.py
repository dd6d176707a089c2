"""What a stage kind is: the contract every module in `mha_tui/kinds/` keeps, stated once.

A stage kind (scores, mask, rotary ...) is one module, or one package for a big kind, that
holds everything mha-tui knows about it. The recogniser, the judge, `--why` and the quiz
all read the kind through the one table `registry.KINDS`, never by importing the module by
name, so a new mechanism is one module here and one row in the registry.

- `KIND: str`: the kind its stages carry (and `--why`'s STAGE prefix for them).
- `RULES: tuple[Rule, ...]`: small functions `rule(graph, op, sizes) -> str | None`, each
  named after what it recognises, that claim an op for the kind from the op's name, its
  shapes, its values and where its inputs came from (`graph.op_derives`): never from a
  variable name or a display string. A kind with no rule (`op`, `embed`, `error`) is placed
  by the recogniser itself.
- `build(maker, unit, stage_id) -> Stage | list[Stage]`: the stage(s) of a `Unit` of ops
  claimed by the kind: its tensors, their axes, its checks, its words.
- `judge(j) -> list[Row]` (optional): how `mha-tui check` decides whether the stage computes
  what it claims, against mha-tui's own computation; `j` is the `_parts.judging.Judge` that
  holds the trace, its graph and its sizes.
- `why(cell) -> Why` (optional): how one cell of the stage's result was made, recomputed
  from the recorded numbers (`explain --why`).
- `quiz(stage, trace) -> tuple[Question, ...]` (optional): questions whose answers are read
  from this trace's records.
- `mechanism(j, stage) -> str | None` (optional): for a mechanism plain attention lacks
  (rotary, a norm, soft-capping, sinks, a residual add), what `check` says when the module
  leaves plain attention at this stage: the mechanism with its parameters, read from the
  same recognition `explain` shows, and the option that makes it the exercise.
- `EXPECTED: str` and `reference(j) -> Part | None` (optional, together): the name
  `check --expect NAME` takes for the kind's mechanism (records.request.MECHANISMS), and the
  kind's share of the grown reference (`_parts.grown.Part`): its parameters read from the
  module's own stage of this kind (a cap, a learned scale, a norm's weight, sink logits, a
  bias) and its words; None when the module has none (its judge then names what is missing,
  misplaced or wrong, at its line).
- its title: in `mha_tui.stages`, the one home of every kind's title, read before NumPy is
  imported: the catalogue entry (`StageInfo`) for the eleven stages of the textbook
  forward, `TITLES` for a mechanism beyond them (`title_of(KIND)`); a kind whose title
  says what its stage found (a mask's shape, the number of K/V heads) makes it as it
  builds the stage.
- its place: the registry row says why its rules are asked where they are.

Helpers several kinds share and that are not kinds (`mask_why`, `product_cell`, `op_cell`,
the stage maker, the cell arithmetic) live in `_parts/`. A kind imports records, ops and
`_parts`; never recognise, judge, render or anything above (an import-linter contract).
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..ops.graph import Graph
    from ..ops.sizes import Sizes
    from ..records import OpRecord, Stage, Trace
    from ._parts.cell import Cell, Why
    from ._parts.grown import Part
    from ._parts.judging import Judge, Row
    from ._parts.maker import StageMaker
    from ._parts.quizzing import Question
    from ._parts.unit import Unit

Rule = Callable[["Graph", "OpRecord", "Sizes"], "str | None"]
"""A rule: (the graph, the op offered, the sizes) -> the kind it claims the op for, or None."""


class KindModule(Protocol):
    """A stage kind's module, as the registry, the recogniser and the judge read it. The
    optional functions (judge, why, quiz) are looked up once, by the registry's `Kind` row,
    which holds None for a kind that lacks one."""

    KIND: str
    RULES: tuple[Rule, ...]

    def build(self, maker: StageMaker, unit: Unit, stage_id: str) -> Stage | list[Stage]: ...


Judging = Callable[["Judge"], "list[Row]"]
Explaining = Callable[["Cell"], "Why"]
Quizzing = Callable[["Stage", "Trace"], "tuple[Question, ...]"]
Naming = Callable[["Judge", "Stage"], "str | None"]
Growing = Callable[["Judge"], "Part | None"]
