"""The app's small widgets and screens: stage rail, help, the too-small notice, ASCII drawing.

Each knows Rich and Textual and nothing about attention; the app decides what they show.
Never import typer, torch or the CLI here.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.scrollbar import ScrollBarRender
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Footer, Input, OptionList, Static

from ..render.options import ASCII_GLYPHS


class StageRail(OptionList):
    """Every stage, the current one highlighted; a click jumps there. Keys stay with the app."""

    can_focus = False


class KeyFooter(Footer):
    """The footer, marking the keys of `lesser` actions `-lesser`: the app's stylesheet
    leaves them out on a narrow screen, so that the keys after them (`? Help`, `q Quit`)
    are never pushed out of sight. The keys still work, and the help lists them."""

    def __init__(self, *, lesser: frozenset[str], **options: Any) -> None:
        super().__init__(**options)
        self.lesser = lesser
        self._typed = False  # the sentence line had the focus at the last change

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            # FooterKey is not exported by textual.widgets: recognised by its `action`.
            if getattr(widget, "action", None) in self.lesser:
                widget.add_class("-lesser")
            yield widget

    def on_mount(self) -> None:
        # Runs before Footer.on_mount (handlers run subclass first), which subscribes
        # bindings_changed to run on the footer's next idle; the change is made after it.
        self.call_next(self._subscribe_immediately)

    def _subscribe_immediately(self) -> None:
        """Grey keys in the same frame as the change that greyed them.

        Footer's subscription runs bindings_changed on the footer's next idle: after the
        key's own repaint has reached the screen, so a greyed key cost a second frame, one
        to two frame periods (17-33 ms) after the first. Here the keys are greyed when the
        bindings change; a recompose still goes through the footer's own queue, as before
        (composing needs the footer's context)."""
        signal = self.screen.bindings_updated_signal
        signal.unsubscribe(self)
        signal.subscribe(self, self._bindings_now, immediate=True)

    def _bindings_now(self, screen: Screen) -> None:
        if not self._grey_in_place(screen):
            self.call_next(self.bindings_changed, screen)

    def bindings_changed(self, screen: Screen) -> None:
        if not self._grey_in_place(screen):
            super().bindings_changed(screen)

    def _grey_in_place(self, screen: Screen) -> bool:
        """Grey keys in place when only which keys are enabled changed (a step between
        stages, the usual case); False when the footer must recompose. While the sentence
        line is focused (`s`), and when the focus comes back from it, nothing changes: the
        footer keeps the app's keys (the line says enter and esc), and a recompose costs
        more than the line itself (measured: most of a second on the first `s`).

        Footer recomposes on every change of the bindings: it mounts every key again, a
        layout and a style pass over each key, the largest cost of a step. When the keys to
        show are the ones shown, in the same order, each key's `-disabled` class is set
        instead; any other change recomposes as before. (Tooltips and descriptions here are
        fixed per key, so the key and its action identify what is shown.)
        """
        typing = isinstance(screen.focused, Input) and screen.focused.id == "sentence-input"
        if typing or self._typed:
            self._typed = typing
            return True
        shown = list(self.query("FooterKey"))  # FooterKey is not exported by textual.widgets
        enabled: dict[str, bool] = {}
        keys: dict[str, str] = {}
        for _node, binding, on, _tooltip in screen.active_bindings.values():
            if binding.show and binding.action not in enabled:
                enabled[binding.action] = on
                keys[binding.action] = binding.key
        same = [(getattr(k, "action", None), getattr(k, "key", None)) for k in shown] == \
            list(keys.items())
        if not (same and shown and screen.app.app_focus and self.is_attached
                and screen is self.screen):
            return False
        for key in shown:
            off = not enabled[key.action]  # type: ignore[attr-defined]
            key.set_class(off, "-disabled")
            # FooterKey rings the bell on a click from this attribute, which Footer sets when
            # it builds the key; there is no public setter (Footer rebuilds its keys instead).
            key._disabled = off  # type: ignore[attr-defined]
        return True


class HelpScreen(ModalScreen[None]):
    """Every key of the app, from the app's own bindings; nothing behind it reacts to keys."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "Close help", id="help.close"),
    ]

    def __init__(self, rows: list[tuple[str, str]], *, ascii_only: bool = False) -> None:
        super().__init__()
        self.rows = rows
        self.ascii_only = ascii_only

    def compose(self) -> ComposeResult:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(justify="right", style="bold cyan", no_wrap=True)
        grid.add_column()
        for keys, description in self.rows:
            grid.add_row(keys, description)
        with VerticalScroll(id="help-body"):
            yield Static(Group(Text("Keys", style="bold"), grid,
                               Text("Click a stage in the rail to jump to it; "
                                    "esc, q or ? closes this help.", style="dim")))

    def on_mount(self) -> None:
        body = self.query_one("#help-body", VerticalScroll)
        if self.ascii_only:
            use_ascii_scrollbars(body)
        body.focus()  # up/down/page keys scroll the help when it is taller than the screen


class SentenceBar(Vertical):
    """`s` in the app: a line to type a sentence in; enter runs it, esc keeps the old one.

    Built with the app and hidden, shown by a class: opening it composes, styles and mounts
    nothing, so it is there at the key (a modal screen cost over a second on the first `s`,
    and the next key typed went to the stage view)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="sentence.cancel"),
    ]

    class Typed(Message):
        """The learner pressed enter (text) or esc (None) on the sentence line."""

        def __init__(self, text: str | None) -> None:
            super().__init__()
            self.text = text

    def compose(self) -> ComposeResult:
        yield Static(Text("A sentence of your own (enter runs it, esc keeps this one):",
                          style="bold"))
        # Disabled while hidden: a hidden Input is still focusable, and the app's first focus
        # would land in it (every key typed into a line no one sees).
        yield Input(id="sentence-input", disabled=True)

    def open(self, sentence: str) -> None:
        """Show the line holding the sentence on screen, cursor at its end, focused."""
        field = self.query_one("#sentence-input", Input)
        field.disabled = False
        field.value = sentence
        field.cursor_position = len(sentence)
        self.display = True
        field.focus()

    def _close(self, text: str | None) -> None:
        self.display = False
        self.query_one("#sentence-input", Input).disabled = True
        self.post_message(self.Typed(text))

    def action_cancel(self) -> None:
        self._close(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._close(event.value)


class TooSmall(Static):
    """Instead of a broken layout: the minimum size, and the size the terminal has now."""

    def __init__(self, min_width: int, min_height: int, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.min_width, self.min_height = min_width, min_height

    def render(self) -> Text:
        # Read at paint time, never stored: the notice follows every resize.
        width, height = self.app.size
        return Text(f"Make the terminal larger: mha-tui needs at least "
                    f"{self.min_width}x{self.min_height} (now {width}x{height}). q quits.",
                    justify="center")


# ---------------------------------------------------------------- ASCII only


class AsciiScrollBarRender(ScrollBarRender):
    """A scrollbar thumb of coloured spaces: Textual's default ends are block glyphs."""

    VERTICAL_BARS: ClassVar[list[str]] = [" "] * 8
    HORIZONTAL_BARS: ClassVar[list[str]] = [" "] * 8


def use_ascii_scrollbars(widget: Widget) -> None:
    """Per widget, as Textual's ScrollBar docs show: other apps in the process keep theirs."""
    widget.vertical_scrollbar.renderer = AsciiScrollBarRender  # type: ignore[misc]
    widget.horizontal_scrollbar.renderer = AsciiScrollBarRender  # type: ignore[misc]


def to_ascii(text: str) -> str:
    """The tool's glyphs as their one-cell ASCII stand-ins, anything else as '?' per cell.

    Same cell width in and out, so tables stay aligned."""
    text = text.translate(ASCII_GLYPHS)
    if text.isascii():
        return text
    return "".join(ch if ch.isascii() else "?" * cell_len(ch) for ch in text)


class AsciiOnly:
    """A renderable drawn with every non-ASCII character replaced (to_ascii)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.renderable, options):
            yield Segment(to_ascii(segment.text), segment.style, segment.control)


def ascii_strips(strips: list[Strip]) -> list[Strip]:
    """Rendered lines with every non-ASCII character replaced (`--ascii` means everywhere)."""
    return [Strip([Segment(to_ascii(seg.text), seg.style, seg.control) for seg in strip],
                  strip.cell_length) for strip in strips]
