"""StageView: a scrolling widget that paints a Rich renderable from lines rendered once.

Rendering a stage's tables is the expensive part of a key press; painting cached lines is
cheap. The app renders each (stage, view options, width) once, keeps the lines in a small
LRU cache, and this widget only crops the visible window: repaint cost follows the screen,
not the tensor. Knows Rich and Textual, nothing about attention.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

from rich.console import Console, RenderableType
from rich.segment import Segment
from textual import events
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

CACHE_SIZE = 64


class LineCache:
    """Rendered lines by key, least recently used dropped first."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._lines: OrderedDict[Hashable, list[Strip]] = OrderedDict()
        self._size = size
        # The app renders from a warming thread and the event loop; one at a time.
        self.lock = threading.RLock()

    def get(self, key: Hashable) -> list[Strip] | None:
        with self.lock:
            lines = self._lines.get(key)
            if lines is not None:
                self._lines.move_to_end(key)
            return lines

    def put(self, key: Hashable, lines: list[Strip]) -> None:
        with self.lock:
            self._lines[key] = lines
            self._lines.move_to_end(key)
            while len(self._lines) > self._size:
                self._lines.popitem(last=False)

    def clear(self) -> None:
        """Forget every line: the app ran the module again (another sentence, heads, mask)."""
        with self.lock:
            self._lines.clear()


def render_strips(console: Console, renderable: RenderableType, width: int) -> list[Strip]:
    """Lay a renderable out at width once; the result is cheap to paint again and again."""
    options = console.options.update(width=width, min_width=width, max_width=width,
                                     height=None, highlight=False, markup=False)
    lines = console.render_lines(renderable, options, pad=True)
    return [Strip(Segment.simplify(line), width) for line in lines]


class StageView(ScrollView, can_focus=False):
    """Shows a list of pre-rendered lines, scrolled; the app decides which lines."""

    class WidthChanged(Message):
        """The text width changed: lines rendered for the old width no longer fit."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: list[Strip] = []
        self._width = 0

    def on_resize(self, event: events.Resize) -> None:
        if self.text_width != self._width:
            self._width = self.text_width
            self.post_message(self.WidthChanged())

    @property
    def text_width(self) -> int:
        """Columns available for content (the vertical scrollbar excluded)."""
        return max(20, self.scrollable_content_region.width or self.size.width)

    def show(self, lines: list[Strip], *, home: bool = False) -> None:
        self.lines = lines
        width = max((strip.cell_length for strip in lines), default=0)
        new = Size(width, len(lines))
        old = self.virtual_size
        height = self.scrollable_content_region.height
        if (new != old and new.width == old.width and self.show_vertical_scrollbar
                and old.height > height and new.height > height):
            # Both taller than the pane: the scrollbar stays, only its thumb changes. Setting
            # virtual_size would ask for a layout of the whole screen (~6 ms here), whose
            # scrollbar update then repaints the bar once more in a second frame, 17-33 ms
            # after the first: the stage's new length goes to the bar directly instead.
            self.set_reactive(StageView.virtual_size, new)
            self.vertical_scrollbar.window_virtual_size = new.height
        else:  # the scrollbar comes or goes (or the width changed): a layout places it
            self.virtual_size = new
        if home:
            self.scroll_to(0, 0, animate=False, immediate=True)
        self.refresh()

    @property
    def plain(self) -> str:
        """What is shown, as text (tests and the benchmark read this)."""
        return "\n".join(strip.text.rstrip() for strip in self.lines)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if index >= len(self.lines):
            return Strip.blank(width, base)
        # The widget's colours go underneath the line's own, as for any Textual widget.
        return self.lines[index].crop_extend(scroll_x, scroll_x + width, base).apply_style(base)
