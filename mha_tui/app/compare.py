"""`explain --against` in the app: the rows of a comparison on the rail, each row's two
sides and mha-tui's differences in the stage view.

The app itself is `app.ExplainApp`: this subclass only changes what a "stage" is (a row of
the comparison: the learner's stage, the reference's, or both) and what is drawn for it
(`render/compare.py`). The comparison is computed once, in the loading thread, and handed in;
keys only choose which row is shown. The drill-down and the re-runs (s, H, c) do not apply.
Never import typer or the CLI here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from textual.binding import Binding
from textual.strip import Strip
from textual.widgets.option_list import Option

from ..config import Config
from ..judge.compare import Comparison
from ..records import Trace
from ..render.compare import compare_screen, rail_label
from .explain import ExplainApp
from .run import prepare_terminal, wants_ascii
from .stage_view import StageView

__all__ = ["CompareApp", "prepare_terminal", "run_compare_app"]

NOT_HERE = frozenset({"drill", "leave", "sentence", "heads", "causal", "wrong_view", "layer"})
"""Keys of the walk-through that have nothing to act on in a comparison."""


def row_ids(c: Comparison) -> list[str]:
    """Unique ids for the rows: the kind, numbered from its second occurrence (op, op-2)."""
    seen: dict[str, int] = {}
    ids = []
    for row in c.rows:
        seen[row.kind] = seen.get(row.kind, 0) + 1
        ids.append(row.kind if seen[row.kind] == 1 else f"{row.kind}-{seen[row.kind]}")
    return ids


class CompareApp(ExplainApp):
    """The walk-through of a comparison: one row per stage kind of either module."""

    def __init__(self, config: Config, *, comparison: Comparison | None = None,
                 compare: Callable[[Config], Comparison] | None = None,
                 start: str | None = None, **options: Any) -> None:
        self.comparison = comparison
        self._compare = compare
        self._pending: Comparison | None = None
        if comparison is not None and start is None and comparison.parting is not None:
            start = row_ids(comparison)[comparison.parting]  # open where they part
        super().__init__(config, trace=comparison.mine if comparison else None, start=start,
                         loader=self._load_comparison, **options)

    def _load_comparison(self, config: Config) -> Trace:
        """In the loading thread: both modules, run and compared."""
        assert self._compare is not None
        comparison = self._compare(config)
        self._pending = comparison
        return comparison.mine

    @property
    def stage_ids(self) -> list[str]:
        if self.comparison is not None:
            return row_ids(self.comparison)
        return super().stage_ids

    def _loaded(self, trace: Trace) -> None:
        self.comparison = self._pending
        assert self.comparison is not None
        if self._start_id is None and self.comparison.parting is not None:
            self._start_id = row_ids(self.comparison)[self.comparison.parting]
        super()._loaded(trace)

    def _rail_options(self) -> list[Option]:
        if self.comparison is None:
            return super()._rail_options()
        from rich.text import Text

        return [Option(Text.assemble((f"{k + 1:>2} ", "dim"),
                                     rail_label(self.comparison, k, self._ascii)), id=row_id)
                for k, row_id in enumerate(self.stage_ids)]

    def _has_aside(self, index: int) -> bool:
        return False

    def _drillable(self) -> bool:
        return False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in NOT_HERE:
            return False
        return super().check_action(action, parameters)

    def _in_help(self, bindings: list[Binding]) -> bool:
        """The walk-through's help without the keys that do nothing here."""
        return super()._in_help(bindings) and any(b.action not in NOT_HERE for b in bindings)

    def _lines(self, index: int, width: int, trace: Trace | None = None,
               layer: int | None = None) -> list[Strip]:
        if self.comparison is None:
            return super()._lines(index, width, trace, layer)
        opts = replace(self._window_options(width), explain=False)
        key = ("compare", index, opts)
        with self._cache.lock:
            lines = self._cache.get(key)
            if lines is None:
                lines = self._strips(compare_screen(self.comparison, index, opts), width)
                self._cache.put(key, lines)
        return lines

    def _warm_all(self) -> None:
        if self.comparison is None:
            return
        width = self.query_one(StageView).text_width
        for index in sorted(range(len(self.comparison.rows)), key=lambda i: abs(i - self.stage_index)):
            self._lines(index, width)


def run_compare_app(config: Config, *, compare: Callable[[Config], Comparison],
                    start: str | None = None, ascii_only: bool = False,
                    **options: Any) -> str | None:
    """Run the comparison app in this terminal (call prepare_terminal first); returns a
    refusal of the input (one line, for exit code 2), or None."""
    app = CompareApp(config, compare=compare, start=start,
                     ascii_only=ascii_only or wants_ascii(), **options)
    app.run()
    return app.refusal
