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

from ..render.tensor import matrix_cell, tensor_index
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
                and matrix_cell(stage.tensors[-1], (0,) * len(stage.tensors[-1].dims)) is not None)

    def _bounds(self) -> tuple[int, int, int]:
        """Heads, rows and columns of the current stage's result as drawn."""
        assert self.trace is not None
        record = self.trace.stages[self.stage_index].tensors[-1]
        shape = record.values.shape
        if record.dims == ("B", "T", "C"):
            return 1, shape[1], shape[2]
        if record.dims == ("B", "T", "h", "d_h"):
            return 1, shape[1], shape[2] * shape[3]
        return shape[1], shape[2], shape[3]

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
        from rich.panel import Panel

        from ..render.why import why_view
        from ..why import WhyError, why

        stage = self.trace.stages[self.stage_index]
        record = stage.tensors[-1]
        try:
            body: RenderableType = why_view(why(self.trace, stage.id,
                                                tensor_index(record, *self.cursor)), self.view)
        except WhyError as error:
            body = Text(str(error), style="yellow")
        panel = Panel(body, title="why this number", title_align="left",
                      subtitle="computed by mha-tui · esc leaves", subtitle_align="right",
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

    def action_drill(self) -> None:
        """`enter`: a cursor on the stage's result, at the focused head's first cell."""
        if self.cursor is None and self._drillable():
            self.cursor = self._clamped((self.view.focus or 0, 0, 0))

    def action_leave(self) -> None:
        self.cursor = None

    def action_cursor_to(self, head: int, row: int, col: int) -> None:
        """A click on a cell of the stage's result: the cursor goes there."""
        if self._drillable():
            self.cursor = self._clamped((head, row, col))

    def _move(self, rows: int, cols: int) -> None:
        assert self.cursor is not None
        head, row, col = self.cursor
        self.cursor = self._clamped((head, row + rows, col + cols))
