"""The drill-down: a cursor on the stage's result (`enter`), moved by the arrows and `tab`,
and the panel that says how the number under it was made (`mha_tui.why`, drawn by
`render.why.why_view`).

`DrillDown` is mixed into `ExplainApp` (explain.py); the cursor is its `cursor` reactive.
Never import typer, torch or the CLI here.
"""

from __future__ import annotations

from rich import box
from rich.console import RenderableType
from rich.text import Text
from textual.widgets import Static

from ..render.tensor import heads_in_columns, matrix_bounds, matrix_cell, tensor_index
from .stage_view import StageView
from .widgets import AsciiOnly


class DrillDown:
    """The cell cursor on the stage's result and the why panel."""

    def _drillable(self) -> bool:
        """Whether the current stage's result can take the cursor (a why for its kind); not
        while quiz mode hides its numbers."""
        if self.trace is None or self._hidden(self.stage_ids[self.stage_index]):
            return False
        from ..why import KINDS

        stage = self.trace.stages[self.stage_index]
        return (stage.kind in KINDS and bool(stage.tensors)
                and matrix_cell(stage.tensors[-1], (0,) * stage.tensors[-1].values.ndim) is not None)

    def _bounds(self) -> tuple[int, int, int]:
        """Heads, rows and columns of the current stage's result as drawn."""
        assert self.trace is not None
        return matrix_bounds(self.trace.stages[self.stage_index].tensors[-1])

    def _heads_in_columns(self) -> bool:
        assert self.trace is not None
        return heads_in_columns(self.trace.stages[self.stage_index].tensors[-1])

    def _clamped(self, cell: tuple[int, int, int]) -> tuple[int, int, int] | None:
        if not self._drillable():
            return None
        bounds = self._bounds()
        return tuple(min(max(0, k), n - 1) for k, n in zip(cell, bounds, strict=True))  # type: ignore[return-value]

    def watch_cursor(self) -> None:
        self.set_class(self.cursor is not None, "-drilling")
        self._show()

    def _show_why(self) -> None:
        """The panel: how the number under the cursor was made (computed by mha_tui.why)."""
        if self.cursor is None or self.trace is None:
            return
        from ..render.why import why_view
        from ..why import WhyError, why

        stage = self.trace.stages[self.stage_index]
        record = stage.tensors[-1]
        try:
            body: RenderableType = why_view(why(self.trace, stage.id,
                                                tensor_index(record, *self.cursor,
                                                             batch=self.view.row or 0)), self.view)
        except WhyError as error:
            body = Text(str(error), style="yellow")
        self._why_panel(body)

    def _why_panel(self, body: RenderableType, title: str = "why this number",
                   subtitle: str = "computed by mha-tui · esc leaves") -> None:
        from rich.panel import Panel

        panel = Panel(body, title=title, title_align="left", subtitle=subtitle, subtitle_align="right",
                      box=box.ASCII if self._ascii else box.ROUNDED)
        self.query_one("#why-body", Static).update(AsciiOnly(panel) if self._ascii else panel)

    def _cursor_in_view(self, view: StageView) -> None:
        """Scroll the stage so that the cursor's line is on screen."""
        for y, strip in enumerate(view.lines):
            if any(seg.style is not None and seg.style.reverse and seg.style.meta
                   for seg in strip):
                height = view.scrollable_content_region.height
                if not view.scroll_y <= y < view.scroll_y + height:
                    view.scroll_to(y=max(0, y - height // 2), animate=False, immediate=True)
                return

    def _no_cursor(self) -> str | None:
        """Why the current stage cannot take the cursor, in words (None: it can, or quiz mode
        hides its numbers)."""
        if self.trace is None or self._hidden(self.stage_ids[self.stage_index]) or self._drillable():
            return None
        from ..why import KINDS

        stage = self.trace.stages[self.stage_index]
        if not stage.tensors:
            return f"Stage {stage.id} draws no tensor to put a cursor on."
        if stage.kind not in KINDS:
            return f"mha-tui does not explain the cells of a {stage.kind!r} stage yet."
        record = stage.tensors[-1]
        return (f"{record.name}, shape ({', '.join(map(str, record.values.shape))}), has no cell "
                "to put a cursor on.")

    def action_drill(self) -> None:
        """`enter`: a cursor on the stage's result, at the focused head's first cell; on a
        stage that cannot take one, the panel says why not."""
        if self.cursor is not None:
            return
        if self._drillable():
            self.cursor = self._clamped((self.view.focus or 0, 0, 0))
            return
        reason = self._no_cursor()
        if reason is not None:
            self._why_panel(Text(reason, style="yellow"), "no cursor here", "esc leaves")
            self.set_class(True, "-drilling")
            self.refresh_bindings()

    def action_leave(self) -> None:
        self.cursor = None
        self.set_class(False, "-drilling")  # also the panel that said why there is no cursor
        self.refresh_bindings()

    def action_cursor_to(self, head: int, row: int, col: int) -> None:
        """A click on a cell of the stage's result: the cursor goes there."""
        if self._drillable():
            self.cursor = self._clamped((head, row, col))

    def _move(self, rows: int, cols: int) -> None:
        assert self.cursor is not None
        head, row, col = self.cursor
        self.cursor = self._clamped((head, row + rows, col + cols))
