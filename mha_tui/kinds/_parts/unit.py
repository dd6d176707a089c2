"""A Unit: the ops of one kind grouped into a future stage, as recognise.grouping makes them
and a kind's build() reads them. Plain data; never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Unit:
    """Ops of one kind grouped into a future stage (recognise.grouping makes them)."""

    kind: str
    ops: list[int] = field(default_factory=list)
    helpers: list[int] = field(default_factory=list)
    folded: list[int] = field(default_factory=list)  # identity dropouts shown with it
    runs: int = 1  # how many times a Python loop ran its line (an `op` unit; grouping._fold_loops)
