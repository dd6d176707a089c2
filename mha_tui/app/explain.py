"""The step-through app: which stage is shown and how wide. Drawing is `render`'s job.

The trace is computed once, off the event loop (`loading.py`: torch takes seconds to import),
and handed to the app whole; until it arrives the header and stage rail are already on
screen and key presses move the stage cursor. Nothing is computed in compose() or in key
handlers: they only choose what to show and how wide. The keys (`keys.py`), the worker
(`loading.py`), the drill-down (`drill.py`) and the layers of a pretrained model
(`layers.py`) are mixed in; the widgets are `widgets.py` and `stage_view.py`.
Never import typer or the CLI here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import BindingType
from textual.containers import Container, Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Static
from textual.widgets.option_list import Option

from ..config import Config
from ..records import Trace
from ..render.header import header, module_line, step_line, trace_header
from ..render.options import RenderOptions
from ..render.stage import pending_box, pending_screen, stage_box, stage_screen
from ..render.tensor import tensor_index
from ..stages import STAGE_IDS, stage_info
from .drill import DrillDown
from .keys import Keys
from .layers import Layers, LayerSwitch
from .layout import (
    BOX_SHARE,
    MAX_COLS,
    MIN_HEIGHT,
    MIN_WIDTH,
    NARROW_FOOTER_LEAVES_OUT,
    RAIL_MIN_WIDTH,
    SIDE_PANEL_MIN_WIDTH,
)
from .loading import START_LOADING_AFTER, Loading, load_trace
from .quiz import QuizBar, Quizzing
from .stage_view import LineCache, StageView, render_strips
from .widgets import (
    KeyFooter,
    SentenceBar,
    StageRail,
    TooSmall,
    ascii_strips,
    use_ascii_scrollbars,
)

if TYPE_CHECKING:
    from ..judge import Verdict
    from ..quiz import Marked, Question, Quiz


class MainScreen(Screen[None], inherit_bindings=False):
    """The app's screen. Without Screen's own tab/shift+tab (focus cycling: nothing here
    takes focus), those keys reach the app, which cycles heads with them."""


class ExplainApp(Keys, Loading, DrillDown, LayerSwitch, Quizzing, App[None]):
    """Step through a traced MultiHeadAttention forward pass."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    """Absolute: Textual resolves a relative path beside the subclass's own file, and a
    subclass may live elsewhere (`app/compare.py`: CompareApp)."""
    TITLE = "mha-tui"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [
        (0, "-too-narrow"), (MIN_WIDTH, "-narrow"), (RAIL_MIN_WIDTH, "-wide"),
        (SIDE_PANEL_MIN_WIDTH, "-widest")]
    """Screen classes from the current width; app.tcss hides the rail or the whole app, and
    puts the drill-down's panel beside the stage (-widest) or below it."""
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [
        (0, "-too-short"), (MIN_HEIGHT, "-tall-enough")]
    BINDINGS: ClassVar[list[BindingType]] = Keys.BINDINGS
    """See keys.py: every key with its id; the help lists them all."""

    stage_index: reactive[int] = reactive(0, init=False, repaint=False)
    """Which stage is on screen: the one value navigation changes.

    Not `bindings=True`: that recomposes the footer (a full layout, ~13 ms) on every step;
    the app refreshes bindings only when a key's enabled state really changes. Not
    `repaint`: an app's reactive repaints the whole screen, a second full render per step;
    the watcher refreshes what shows the stage (view, rail, heading)."""

    cursor: reactive[tuple[int, int, int] | None] = reactive(None, bindings=True, init=False,
                                                           repaint=False)
    """The drill-down's cell on the stage's result: (head, row, column) as drawn, or None."""

    view: reactive[RenderOptions] = reactive(RenderOptions, bindings=True, init=False)
    """How tensors are drawn: focused head, numbers, decimals, explanation, wrong view."""

    quiz: reactive[Quiz | None] = reactive(None, bindings=True, init=False)
    """Quiz mode (`--quiz`, quiz.py): the questions about this trace and the marks so far; a
    stage's numbers are shown once each of its questions has a mark. None outside quiz mode."""

    def __init__(self, config: Config, *, trace: Trace | None = None, start: str | None = None,
                 ascii_only: bool = False,
                 loader: Callable[[Config], Trace] = load_trace, batched: bool = True,
                 checker: Callable[[Trace], Verdict] | None = None,
                 layers: Layers | None = None, running: str = "the forward pass",
                 refusals: tuple[type[Exception], ...] = (), quiz: bool = False,
                 focus: int | None = None) -> None:
        """focus: the head to start focused on (`heads`' enter on a head), None: every head."""
        super().__init__()
        if focus is not None:
            self.set_reactive(ExplainApp.view, RenderOptions(focus=focus))
        self.config = config
        # `--quiz`: each trace this app shows gets its questions (the `quiz` reactive).
        self._quizzing = quiz
        self._last_mark: Marked | None = None
        self._last_asked: Question | None = None  # the question _last_mark marks
        self._asked_on: str | None = None  # the stage whose question took the focus
        # False for a NumPy module (x is (T, C)): the header leaves out B from the first frame.
        self._batched = batched
        self._layers = layers
        self._layer = config.model.layer if config.model is not None else 0
        # `--decode N`: every step's trace (the first trace's `steps`) and the one shown.
        self._decode_steps: tuple[Trace, ...] = ()
        self._step = 0
        self.trace = trace
        self._loader = loader
        # `--check`: judges the trace (in the loading worker); its verdict marks the rail.
        self._checker = checker
        self.verdict: Verdict | None = None
        self._start_id = start
        ids = self.stage_ids
        self._start = ids.index(start) if start in ids else 0
        self._ascii = ascii_only
        self.load_error: str | None = None
        self._whose = running  # whose forward the loader runs ("M.forward from loop.py")
        self._load_started = time.monotonic()
        self._elapsed: Timer | None = None
        # Errors of the loader that mean bad input (an unknown class, a bad --init): the app
        # quits with exit code 2 and `refusal` holds the one line the CLI prints.
        self._refusals = refusals
        self.refusal: str | None = None
        self._rerunning: Config | None = None  # the input a second forward is running on
        self._loading = False  # the first forward has started (Loading._start_loading)
        # Timing hooks for the benchmark: set MHA_TUI_MARKS=FILE to get "paint" and
        # "values" wall-clock marks; repaint_seconds collects key-to-repaint durations.
        self._marks_path = os.environ.get("MHA_TUI_MARKS")
        self.repaint_seconds: list[float] = []
        self._cache = LineCache()
        self._cache_disabled = False  # the benchmark turns warming off to time cold paints
        self._key_state: tuple[bool, ...] = ()
        # `e` pressed: view.explain is the user's choice for every stage, and outlasts
        # resizes. Until then each stage's box is folded or not by its height (BOX_SHARE).
        self._explain_chosen = False
        self._height = 0
        self._box_heights: dict[tuple[object, ...], int] = {}

    @property
    def stage_ids(self) -> list[str]:
        """The stages on the rail: the module's own once traced, the catalogue before.

        The one place the app learns which stages exist; everything else asks this."""
        if self.trace is not None:
            return [stage.id for stage in self.trace.stages]
        return list(STAGE_IDS)

    def _has_aside(self, index: int) -> bool:
        """Whether this stage has the wrong-view contrast (heads split by a reshape)."""
        if self.trace is None:
            return STAGE_IDS[min(index, len(STAGE_IDS) - 1)] == "transpose"
        return bool(self.trace.stages[index].aside)

    def get_default_screen(self) -> Screen[None]:
        return MainScreen(id="_default")

    def compose(self) -> ComposeResult:
        # Header and rail filled here, not at mount: each change after mount cost a layout
        # pass and a frame before the first paint.
        yield Static(self._header(), id="header")
        with Horizontal(id="body"):
            yield StageRail(*self._rail_options(), id="rail")
            with Container(id="stage-area"):
                yield StageView(id="main")
                with VerticalScroll(id="why", can_focus=False):
                    yield Static(id="why-body")
        if self._quizzing:  # its answer line takes the focus: only in quiz mode
            yield QuizBar(id="quiz")
        yield Static(id="progress")
        yield SentenceBar(id="sentence-body")
        yield TooSmall(MIN_WIDTH, MIN_HEIGHT, id="too-small")
        yield KeyFooter(lesser=NARROW_FOOTER_LEAVES_OUT, compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.theme = "textual-dark"
        self.set_class(self._ascii, "-ascii")
        no_color = "NO_COLOR" in os.environ
        self.set_reactive(ExplainApp.view, RenderOptions(
            ascii=self._ascii, color=not no_color, row=0))  # one batch row at a time (r moves)
        self._height = self.size.height
        self.set_reactive(ExplainApp.stage_index, self._start)
        stage_view = self.query_one(StageView)
        if self._ascii:
            use_ascii_scrollbars(stage_view)
            use_ascii_scrollbars(self.query_one(StageRail))
        self.watch(stage_view, "scroll_y", self._sync_keys, init=False)
        if self.trace is not None:
            self._new_quiz(self.trace)
        if self.trace is None:
            # The forward starts once the waiting screen is painted (_painted), not at mount:
            # importing torch in the loading thread holds the GIL the first frames need
            # (Loading._start_loading). A stage pane hidden by a terminal too small is never
            # painted: then after the first frame.
            self._load_started = time.monotonic()
            self.call_after_refresh(self._load_if_hidden)
            # ... and at the latest after a moment, whatever was painted: a forward that
            # never starts would leave the waiting line up for good.
            self.set_timer(START_LOADING_AFTER, self._start_loading, name="start loading")
            self._elapsed = self.set_interval(1, self._tick, name="elapsed")

    def _header(self) -> RenderableType:
        """Sentence, tokens and sizes (laid out at the header's width, so the sizes always
        show); once traced, also the module's class and file."""
        opts = RenderOptions(ascii=self._ascii)
        batched = self.trace.batched if self.trace is not None else self._batched
        if self.trace is not None and self.trace.step is not None:
            # --decode: the step's line (d / D move) in the header's three lines
            step = step_line(self.trace, opts)
            step.no_wrap, step.overflow = True, "ellipsis"  # one line: the module's below
            return Group(trace_header(self.trace, opts, max_lines=1, step=False), step,
                         *([module_line(self.trace.module, opts)]
                           if self.trace.module is not None and self.config.model is None else []))
        if self.trace is not None and self.trace.module is not None and self.config.model is None:
            # The header holds three lines: two for the sentence, tokens and sizes. (A
            # pretrained model's header names its attention module on the model's line.)
            return Group(trace_header(self.trace, opts, max_lines=2),
                         module_line(self.trace.module, opts))
        if self.trace is not None:
            return trace_header(self.trace, opts)
        return header(self.config, opts, batched=batched)

    def _rail_options(self) -> list[Option]:
        marks = self._check_rows()
        return [Option(Text.assemble((f"{i + 1:>2} ", "dim"), *self._rail_mark(marks, stage_id),
                                     stage_id), id=stage_id)
                for i, stage_id in enumerate(self.stage_ids)]

    def _check_rows(self) -> dict[str, list] | None:
        """`--check`: each stage's verdict rows (None without --check or before the trace)."""
        if self.verdict is None or self.trace is None:
            return None
        from ..judge.report import rows_by_stage

        return rows_by_stage(self.verdict, [(s.id, s.source.line if s.source else 0)
                                            for s in self.trace.stages])

    def _rail_mark(self, marks: dict[str, list] | None, stage_id: str) -> tuple[Text, ...]:
        if marks is None:  # --quiz: how the stage's questions stand (quiz.py)
            return self._quiz_rail_mark(stage_id)
        from ..judge.report import stage_mark

        return (stage_mark(marks.get(stage_id, []), ascii_only=self._ascii), Text(" "))

    def _mark(self, name: str) -> None:
        if self._marks_path:
            with open(self._marks_path, "a", encoding="utf-8") as marks:
                marks.write(f"{name} {time.time():.6f}\n")

    def watch_stage_index(self) -> None:
        started = time.perf_counter()
        if self.cursor is not None:  # the same cell on the new stage, where it still exists
            self.set_reactive(ExplainApp.cursor, self._clamped(self.cursor))
            self.set_class(self.cursor is not None, "-drilling")
        else:  # the panel that said the last stage takes no cursor
            self.set_class(False, "-drilling")
        self._show(home=True)
        self.call_after_refresh(lambda: self.repaint_seconds.append(time.perf_counter() - started))

    def watch_view(self) -> None:
        self._show()
        self._warm()

    def on_resize(self, event: events.Resize) -> None:
        # The event's size, not self.size: this handler runs before App's own, which
        # stores the new size.
        height_changed = event.size.height != self._height
        self._height = event.size.height
        if height_changed and not self._explain_chosen and self.query_one(StageView).lines:
            self._show()  # each box folds or unfolds for the new height
            self._warm()

    def _explains(self, box: Callable[[RenderOptions], RenderableType], key: tuple[object, ...],
                  width: int) -> bool:
        """Whether a stage's box shows the explanation: the user's choice once `e` was
        pressed, else whether the unfolded box takes at most 1/BOX_SHARE of the height."""
        if self._explain_chosen:
            return self.view.explain
        with self._cache.lock:
            lines = self._box_heights.get((*key, width))
            if lines is None:
                unfolded = replace(self._window_options(width), explain=True)
                lines = len(self._strips(box(unfolded), width))
                self._box_heights[(*key, width)] = lines
        return lines * BOX_SHARE <= self._height

    def on_stage_view_width_changed(self) -> None:
        first = not self.query_one(StageView).lines
        self._show()
        self._warm()
        if first:
            self.call_after_refresh(self._painted)

    def _window_options(self, width: int) -> RenderOptions:
        """Elide tensors to what the pane can show: cost follows the screen.

        Each matrix fits as many whole columns as the width holds (render.matrix.Matrix measures
        its formatted cells); max_cols only bounds how many it formats to find out.
        """
        return replace(self.view, max_cols=MAX_COLS, max_rows=16, max_heads=4, width=width)

    def _strips(self, renderable: object, width: int) -> list[Strip]:
        strips = render_strips(self.console, renderable, width)  # type: ignore[arg-type]
        return ascii_strips(strips) if self._ascii else strips

    def _lines(self, index: int, width: int, trace: Trace | None = None,
               layer: tuple[int, int] | None = None) -> list[Strip]:
        """The stage's rendered lines at this width, from the cache or rendered now."""
        trace = trace or self.trace
        assert trace is not None
        shown = (self._layer, self._step) if layer is None else layer  # lines cached by both
        stage = trace.stages[index]
        if self._hidden(stage.id):  # quiz mode: code and question only, never cached
            return self._strips(self._hidden_screen(trace, index), width)
        explain = self._explains(partial(stage_box, stage, config=trace.config), (shown, index), width)
        opts = replace(self._window_options(width), explain=explain)
        if self.cursor is not None and index == self.stage_index and stage.tensors:
            record = stage.tensors[-1]
            # The numbers first: the box folds while the panel explains a cell.
            opts = replace(opts, explain=False, cursor=(
                record.name, tensor_index(record, *self.cursor, batch=opts.row or 0)))
        key = (shown, index, opts)
        with self._cache.lock:
            lines = self._cache.get(key)
            if lines is None:
                screen = stage_screen(trace, stage, opts)
                marks = self._check_rows()
                if marks is not None:  # --check: the judgement above the stage
                    from ..judge.report import stage_judgement

                    said = stage_judgement(self.verdict, marks.get(stage.id, []),  # type: ignore[arg-type]
                                           ascii_only=self._ascii)
                    screen = Group(said, Text(""), screen) if said is not None else screen
                lines = self._strips(screen, width)
                self._cache.put(key, lines)
        return lines

    def _show(self, home: bool = False) -> None:
        self.query_one(StageRail).highlighted = self.stage_index
        view = self.query_one(StageView)
        width = view.text_width
        if self.trace is not None:
            view.show(self._lines(self.stage_index, width), home=home)
            if self.cursor is not None:
                self._cursor_in_view(view)
            self._show_why()
            self._show_quiz()
        else:
            message = (Text(f"Could not run the module: {self.load_error}", style="bold red")
                       if self.load_error else self._waiting())
            info = stage_info(STAGE_IDS[min(self.stage_index, len(STAGE_IDS) - 1)],
                              causal=self.config.causal)
            explain = self._explains(partial(pending_box, info), ("pending", info.id), width)
            pending = pending_screen(info, self.stage_index + 1, len(STAGE_IDS), message,
                                     replace(self.view, explain=explain))
            view.show(self._strips(pending, width), home=home)
        self._sync_keys()

    def _warm(self) -> None:
        """Render the other stages in the background so that every step is a cache hit.

        After the next frame: the warming thread holds the GIL much of the time, and started
        before the frame it made that frame (the first values, a new view) wait for it."""
        self.call_after_refresh(self._warm_now)

    def _warm_now(self) -> None:
        if self.trace is not None and not self._cache_disabled:
            self.run_worker(self._warm_all, thread=True, exclusive=True, group="warm",
                            name="warm cache")

    def _warm_all(self) -> None:
        # a layer (or decode step) switch must not mix two layers' lines
        trace, layer = self.trace, (self._layer, self._step)
        assert trace is not None
        width = self.query_one(StageView).text_width
        order = sorted(range(len(trace.stages)), key=lambda i: abs(i - self.stage_index))
        for index in order:
            self._lines(index, width, trace, layer)
