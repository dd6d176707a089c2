"""The step-through app: which stage is shown, keys, layout. Drawing is `render`'s job.

The trace is computed once, off the event loop (torch takes seconds to import), and handed
to the app whole; until it arrives the header and stage rail are already on screen and key
presses move the stage cursor. Nothing is computed in compose() or in key handlers: they
only choose what to show and how wide. Never import typer or the CLI here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rich import box
from rich.console import Group, RenderableType
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Horizontal, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Static
from textual.widgets.option_list import Option

from .config import Config, ConfigError, divisors
from .records import Trace
from .render.header import header, module_line
from .render.options import RenderOptions
from .render.stage import pending_box, pending_screen, stage_box, stage_screen
from .render.tensor import matrix_cell, tensor_index
from .render.text import printable
from .stage_view import LineCache, StageView, render_strips
from .stages import STAGE_IDS, stage_info
from .widgets import (
    AsciiOnly,
    HelpScreen,
    KeyFooter,
    SentenceScreen,
    StageRail,
    TooSmall,
    ascii_strips,
    use_ascii_scrollbars,
)

if TYPE_CHECKING:
    from .check import Verdict
    from .load.modules import Loaded
    from .load.numpy_modules import LoadedNumpy

MIN_WIDTH, MIN_HEIGHT = 60, 16
RAIL_MIN_WIDTH = 80
"""Narrower than this, the stage heading ("2/11 project") stands in for the rail."""
SIDE_PANEL_MIN_WIDTH = 140
"""From this width the drill-down's panel stands beside the stage; narrower, below it."""
NARROW_FOOTER_LEAVES_OUT = frozenset({"wrong_view", "drill"})
"""Below RAIL_MIN_WIDTH the footer drops these keys, so that `? Help` and `q Quit` fit."""
BOX_SHARE = 3
"""A stage's box (shape, code, explanation) that would take more than 1/BOX_SHARE of the
terminal's height starts folded to shape and code: the numbers come first (`e` unfolds)."""
SHOW_ELAPSED_AFTER = 3
"""Seconds a forward may take before the waiting line shows how long it has been running."""
MAX_DECIMALS = 8
MAX_COLS = 64  # more than any pane shows at 4 decimals

STAGE = Binding.Group("Stage", compact=True)
SCROLL = Binding.Group("Scroll", compact=True)
DECIMALS = Binding.Group("Dec", compact=True)

# How keys are named in the help screen; ASCII_KEYS replaces the arrows with --ascii.
KEY_NAMES = {"question_mark": "?", "plus": "+", "equals_sign": "=", "minus": "-",
             "right": "→", "left": "←", "up": "↑", "down": "↓", "pageup": "pgup",
             "pagedown": "pgdn", "escape": "esc",
             "left_square_bracket": "[", "right_square_bracket": "]"}
ASCII_KEYS = {"→": "right", "←": "left", "↑": "up", "↓": "down", "↵": "enter"}
# In the footer an arrow becomes the letter bound beside it: one cell, and a real key.
ASCII_FOOTER_KEYS = {"→": "l", "←": "h", "↑": "k", "↓": "j", "↵": "enter"}


class Layers(Protocol):
    """A pretrained model's layers on one sentence (`--hf`): a trace per layer, on request."""

    n_layers: int
    limit: int  # every layer is recorded in one pass up to this many tokens
    all_layers: bool

    def recorded(self, layer: int) -> bool: ...

    def trace(self, layer: int) -> Trace: ...


def _load_trace(config: Config, loaded: Loaded | LoadedNumpy | None = None) -> Trace:
    from .pipeline import run_trace

    trace = run_trace(config, loaded=loaded)
    # Warm Pygments' Python lexer here, off the event loop, before the first stage draws.
    from rich.syntax import Syntax

    Syntax("x", "python").highlight("x")
    return trace


class MainScreen(Screen[None], inherit_bindings=False):
    """The app's screen. Without Screen's own tab/shift+tab (focus cycling: nothing here
    takes focus), those keys reach the app, which cycles heads with them."""


class ExplainApp(App[None]):
    """Step through a traced MultiHeadAttention forward pass."""

    CSS_PATH = "app.tcss"
    TITLE = "mha-tui"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [
        (0, "-too-narrow"), (MIN_WIDTH, "-narrow"), (RAIL_MIN_WIDTH, "-wide"),
        (SIDE_PANEL_MIN_WIDTH, "-widest")]
    """Screen classes from the current width; app.tcss hides the rail or the whole app, and
    puts the drill-down's panel beside the stage (-widest) or below it."""
    VERTICAL_BREAKPOINTS: ClassVar[list[tuple[int, str]] | None] = [
        (0, "-too-short"), (MIN_HEIGHT, "-tall-enough")]

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,h,p", "step(-1)", "Prev", key_display="←", group=STAGE,
                tooltip="Previous stage", id="stage.prev"),
        Binding("right,l,n,space", "step(1)", "Next", key_display="→",
                group=STAGE, tooltip="Next stage", id="stage.next"),
        Binding("up,k", "scroll(-1)", "Up", key_display="↑", group=SCROLL,
                tooltip="Scroll the stage up a line", id="scroll.up"),
        Binding("down,j", "scroll(1)", "Down", key_display="↓", group=SCROLL,
                tooltip="Scroll the stage down a line", id="scroll.down"),
        Binding("pageup,b", "page(-1)", "Page up", show=False, id="scroll.page_up"),
        Binding("pagedown,f", "page(1)", "Page down", show=False, id="scroll.page_down"),
        Binding("g,ctrl+home", "edge(0)", "Top", show=False, id="scroll.top"),
        Binding("G,ctrl+end", "edge(1)", "Bottom", show=False, id="scroll.bottom"),
        Binding("home", "jump(0)", "First", show=False, id="stage.first"),
        Binding("end", "jump(-1)", "Last", show=False, id="stage.last"),
        *(Binding(str(k), f"jump({(k - 1) % 10})", f"Stage {(k - 1) % 10 + 1}", show=False,
                  id=f"stage.jump{k}") for k in range(10)),
        Binding("tab", "head(1)", "Head", key_display="tab",
                tooltip="Focus the next head; the others dim", id="head.next"),
        Binding("shift+tab", "head(-1)", "Prev head", show=False,
                id="head.prev"),
        Binding("a", "all_heads", "All", show=False, tooltip="Show every head at full strength",
                id="head.all"),
        Binding("v", "numbers", "Nums", tooltip="Numbers on/off over the colours",
                id="view.numbers"),
        Binding("plus,equals_sign", "decimals(1)", "More decimals", key_display="+",
                group=DECIMALS, tooltip="More decimals", id="view.more"),
        Binding("minus", "decimals(-1)", "Fewer decimals", key_display="-", group=DECIMALS,
                tooltip="Fewer decimals", id="view.fewer"),
        Binding("e", "explain", "Explain", show=False,
                tooltip="Explanation on/off (it starts folded where it would fill more than "
                f"1/{BOX_SHARE} of the screen)", id="view.explain"),
        Binding("w", "wrong_view", "Wrong", tooltip="At transpose: show the wrong "
                "Q.view(B, h, T, d_h) above the right Q", id="view.wrong"),
        Binding("left_square_bracket", "layer(-1)", "Layer", key_display="[", show=False,
                tooltip="Previous layer of the model (--hf)", id="layer.prev"),
        Binding("right_square_bracket", "layer(1)", "Layer", key_display="]", show=False,
                tooltip="Next layer of the model (--hf)", id="layer.next"),
        Binding("enter", "drill", "Why", key_display="↵", tooltip="Put a cursor on the "
                "stage's result: how the number under it was made", id="cell.drill"),
        Binding("escape", "leave", "Leave", show=False, tooltip="Leave the cell cursor",
                id="cell.leave"),
        Binding("s", "sentence", "Sentence", show=False, tooltip="Type another sentence; "
                "the forward runs on it", id="run.sentence"),
        Binding("H", "heads", "Heads", show=False, tooltip="Run again with the next head "
                "count that divides C", id="run.heads"),
        Binding("c", "causal", "Causal", show=False, tooltip="Run again with the causal mask "
                "on / off", id="run.causal"),
        Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, id="app.interrupt"),
    ]
    """No key is a priority binding: nothing on MainScreen takes focus, so none can be
    swallowed, and a modal screen (help) keeps every one of them from acting behind it."""

    HELP: ClassVar[list[tuple[tuple[str, ...], str]]] = [
        (("stage.next", "stage.prev"), "next / previous stage"),
        (("scroll.down", "scroll.up"), "scroll the stage down / up a line"),
        (("scroll.page_down", "scroll.page_up"), "scroll down / up a page"),
        (("scroll.bottom", "scroll.top"), "bottom / top of the stage"),
        (("stage.first", "stage.last"), "first / last stage"),
        (tuple(f"stage.jump{k}" for k in (*range(1, 10), 0)), "stage 1-9, 0 for stage 10"),
        (("head.next", "head.prev"), "focus the next / previous head (others dim)"),
        (("head.all",), "show every head at full strength"),
        (("view.numbers",), "numbers on/off over the colours"),
        (("view.more", "view.fewer"), "more / fewer decimals"),
        (("view.explain",), f"explanation on/off (folded where it would fill 1/{BOX_SHARE} "
                            "of the screen)"),
        (("view.wrong",), "at transpose: the wrong view above the right Q"),
        (("layer.prev", "layer.next"), "with --hf: the same stage of the previous / next layer"),
        (("cell.drill", "cell.leave"), "a cursor on the stage's result (arrows move it, tab "
                                       "changes head): how that number was made / leave it"),
        (("run.sentence",), "type another sentence: the forward runs on it"),
        (("run.heads",), "run again with the next head count that divides C"),
        (("run.causal",), "run again with the causal mask on / off"),
        (("app.help",), "this help"),
        (("app.quit", "app.interrupt"), "quit"),
    ]
    """The help screen's rows: keys come from BINDINGS by id (a test checks that every
    binding is listed), so the help cannot drift from what the keys do."""

    stage_index: reactive[int] = reactive(0, init=False)
    """Which stage is on screen: the one value navigation changes.

    Not `bindings=True`: that recomposes the footer (a full layout, ~13 ms) on every step;
    the app refreshes bindings only when a key's enabled state really changes."""

    cursor: reactive[tuple[int, int, int] | None] = reactive(None, bindings=True, init=False)
    """The drill-down's cell on the stage's result: (head, row, column) as drawn, or None."""

    view: reactive[RenderOptions] = reactive(RenderOptions, bindings=True, init=False)
    """How tensors are drawn: focused head, numbers, decimals, explanation, wrong view."""

    def __init__(self, config: Config, *, trace: Trace | None = None, start: str | None = None,
                 ascii_only: bool = False,
                 loader: Callable[[Config], Trace] = _load_trace, batched: bool = True,
                 checker: Callable[[Trace], Verdict] | None = None,
                 layers: Layers | None = None, running: str = "the forward pass",
                 refusals: tuple[type[Exception], ...] = ()) -> None:
        super().__init__()
        self.config = config
        # False for a NumPy module (x is (T, C)): the header leaves out B from the first frame.
        self._batched = batched
        self._layers = layers
        self._layer = config.model.layer if config.model is not None else 0
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

    # ------------------------------------------------------------------ which stages

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

    # ------------------------------------------------------------------ layout

    def get_default_screen(self) -> Screen[None]:
        return MainScreen(id="_default")

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        with Horizontal(id="body"):
            yield StageRail(id="rail")
            with Container(id="stage-area"):
                yield StageView(id="main")
                with VerticalScroll(id="why", can_focus=False):
                    yield Static(id="why-body")
        yield Static(id="progress")
        yield TooSmall(MIN_WIDTH, MIN_HEIGHT, id="too-small")
        yield KeyFooter(lesser=NARROW_FOOTER_LEAVES_OUT, compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.theme = "textual-dark"
        self.set_class(self._ascii, "-ascii")
        no_color = "NO_COLOR" in os.environ
        self.set_reactive(ExplainApp.view, RenderOptions(
            ascii=self._ascii, color=not no_color))
        self._height = self.size.height
        self.set_reactive(ExplainApp.stage_index, self._start)
        self.query_one("#header", Static).update(self._header())
        self.query_one(StageRail).add_options(self._rail_options())
        stage_view = self.query_one(StageView)
        if self._ascii:
            use_ascii_scrollbars(stage_view)
            use_ascii_scrollbars(self.query_one(StageRail))
        self.watch(stage_view, "scroll_y", self._sync_keys, init=False)
        if self.trace is None:
            # Now, not after the first frame: measured, starting torch at mount costs the
            # first paint nothing visible and brings the numbers ~0.5 s sooner.
            self._load_started = time.monotonic()
            self.run_worker(self._load(), exclusive=True, name="trace")
            self._elapsed = self.set_interval(1, self._tick, name="elapsed")
        # The stage itself is drawn once the layout has given it a width (WidthChanged).

    def _header(self) -> RenderableType:
        """Sentence, tokens and sizes (laid out at the header's width, so the sizes always
        show); once traced, also the module's class and file."""
        opts = RenderOptions(ascii=self._ascii)
        batched = self.trace.batched if self.trace is not None else self._batched
        if self.trace is not None and self.trace.module is not None and self.config.model is None:
            # The header holds three lines: two for the sentence, tokens and sizes. (A
            # pretrained model's header names its attention module on the model's line.)
            return Group(header(self.config, opts, batched=batched, max_lines=2),
                         module_line(self.trace.module, opts))
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
        from .check.report import rows_by_stage

        return rows_by_stage(self.verdict, [(s.id, s.source.line if s.source else 0)
                                            for s in self.trace.stages])

    def _rail_mark(self, marks: dict[str, list] | None, stage_id: str) -> tuple[Text, ...]:
        if marks is None:
            return ()
        from .check.report import stage_mark

        return (stage_mark(marks.get(stage_id, []), ascii_only=self._ascii), Text(" "))

    def get_key_display(self, binding: Binding) -> str:
        """The footer's key names; with --ascii the arrows become the letter keys beside them."""
        display = super().get_key_display(binding)
        return ASCII_FOOTER_KEYS.get(display, display) if self._ascii else display

    def _mark(self, name: str) -> None:
        if self._marks_path:
            with open(self._marks_path, "a", encoding="utf-8") as marks:
                marks.write(f"{name} {time.time():.6f}\n")

    async def _run_forward(self, config: Config) -> tuple[Trace | None, Verdict | None,
                                                          Exception | None]:
        """Build, trace and judge in a daemon thread; this worker only awaits the result.

        Not a Textual thread worker: those run in asyncio's default executor, which the
        interpreter joins at exit, so a learner's forward that never returns would keep the
        process alive after `q`. A daemon thread is left behind when the app quits."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[Trace | None, Verdict | None, Exception | None]] = (
            loop.create_future())

        def deliver(result: tuple[Trace | None, Verdict | None, Exception | None]) -> None:
            if not done.done():
                done.set_result(result)

        def work() -> None:
            result: tuple[Trace | None, Verdict | None, Exception | None]
            try:
                trace = self._loader(config)
                verdict = self._checker(trace) if self._checker is not None else None
                result = (trace, verdict, None)
            except Exception as error:  # shown on screen; a TUI must not die with a traceback
                result = (None, None, error)
            with contextlib.suppress(RuntimeError):  # the app has quit meanwhile
                loop.call_soon_threadsafe(deliver, result)

        threading.Thread(target=work, name="mha-tui forward", daemon=True).start()
        return await done

    async def _load(self) -> None:
        trace, verdict, error = await self._run_forward(self.config)
        if error is not None and isinstance(error, self._refusals):
            self.refusal = str(error)  # bad input: the CLI prints it and exits 2
            self.exit(return_code=2)
        elif error is not None:
            self._failed(f"{type(error).__name__}: {error}")
        elif trace is not None:
            self.verdict = verdict
            self._loaded(trace)

    # ------------------------------------------------------------------ another input

    def _rerun(self, **changes: Any) -> None:
        """The same module on another sentence, head count or mask: checked as the CLI
        checks it (its messages), run in the background; the old trace stays until then."""
        if self.trace is None or self._rerunning is not None:
            self.notify("the forward is still running; wait for it", severity="warning")
            return
        current = self.config
        fields = {"sentence": current.sentence, "embed_dim": current.embed_dim,
                  "num_heads": current.num_heads, "seed": current.seed,
                  "causal": current.causal, "max_seq_len": current.max_seq_len, **changes}
        try:
            config = Config(**fields)
        except ConfigError as error:
            self.notify(str(error), title="refused", severity="error", timeout=8)
            return
        self._rerunning = config
        self.set_class(True, "-rerunning")
        progress = Text.assemble(("running ", "italic"), printable(self._whose), " on ",
                                 (printable(config.sentence), "bold"),
                                 f"  h={config.num_heads} "
                                 f"{'causal' if config.causal else 'no causal mask'}…")
        self.query_one("#progress", Static).update(progress)
        self.run_worker(self._rerun_worker(config), exclusive=True, group="rerun", name="rerun")

    async def _rerun_worker(self, config: Config) -> None:
        trace, verdict, error = await self._run_forward(config)
        self._rerunning = None
        self.set_class(False, "-rerunning")
        if error is not None:  # refused (LoadError: the CLI's message) or failed: keep the old
            message = str(error) if isinstance(error, self._refusals) else (
                f"{type(error).__name__}: {error}")
            self.notify(message, title="refused" if isinstance(error, self._refusals)
                        else "could not run", severity="error", timeout=8)
            return
        assert trace is not None
        old_id = self.stage_ids[self.stage_index]
        self.config, self.trace, self.verdict = config, trace, verdict
        self._cache.clear()
        with self._cache.lock:
            self._box_heights.clear()
        self.query_one("#header", Static).update(self._header())
        rail = self.query_one(StageRail)
        rail.clear_options()
        rail.add_options(self._rail_options())
        ids = self.stage_ids
        index = ids.index(old_id) if old_id in ids else min(self.stage_index, len(ids) - 1)
        self.set_reactive(ExplainApp.stage_index, index)
        if self.cursor is not None:  # the same cell, where it still exists
            self.set_reactive(ExplainApp.cursor, self._clamped(self.cursor))
            self.set_class(self.cursor is not None, "-drilling")
        self.refresh_bindings()
        self._show()
        self._warm()

    def action_sentence(self) -> None:
        """`s`: type another sentence; the module runs on it."""
        self.push_screen(SentenceScreen(self.config.sentence),
                         lambda text: None if text is None else self._rerun(sentence=text))

    def action_heads(self) -> None:
        """`H`: the next head count that divides C."""
        valid = divisors(self.config.embed_dim)
        self._rerun(num_heads=valid[(valid.index(self.config.num_heads) + 1) % len(valid)]
                    if self.config.num_heads in valid else valid[0])

    def action_causal(self) -> None:
        """`c`: the causal mask on or off (a module with its own mask refuses, as the CLI)."""
        self._rerun(causal=not self.config.causal)

    def _tick(self) -> None:
        """While the forward runs: redraw the waiting line with the time it has taken."""
        if self.trace is not None or self.load_error is not None:
            if self._elapsed is not None:
                self._elapsed.stop()
        elif time.monotonic() - self._load_started >= SHOW_ELAPSED_AFTER:
            self._show()

    def _loaded(self, trace: Trace) -> None:
        self.trace = trace
        self.query_one("#header", Static).update(self._header())
        rail = self.query_one(StageRail)
        rail.clear_options()
        rail.add_options(self._rail_options())
        ids = self.stage_ids
        current = min(self.stage_index, len(ids) - 1)
        wanted = self._start_id if self.stage_index == self._start else ids[current]
        index = ids.index(wanted) if wanted in ids else min(self.stage_index, len(ids) - 1)
        self.set_reactive(ExplainApp.stage_index, index)
        self.refresh_bindings()
        self._show()
        self.call_after_refresh(self._mark, "values")
        self._warm()

    def _waiting(self) -> Text:
        """What is running while the trace is not there yet: whose forward, and for how long."""
        text = Text(f"loading torch and running {self._whose}…", style="italic")
        elapsed = int(time.monotonic() - self._load_started)
        if elapsed >= SHOW_ELAPSED_AFTER:
            text.append(f" {elapsed} s", style="bold")
            text.append("  (q quits)", style="dim")
        return text

    def _failed(self, message: str) -> None:
        self.load_error = message
        self._show()

    # ------------------------------------------------------------------ showing

    def watch_stage_index(self) -> None:
        started = time.perf_counter()
        if self.cursor is not None:  # the same cell on the new stage, where it still exists
            self.set_reactive(ExplainApp.cursor, self._clamped(self.cursor))
            self.set_class(self.cursor is not None, "-drilling")
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
            self.call_after_refresh(self._mark, "paint")

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
               layer: int | None = None) -> list[Strip]:
        """The stage's rendered lines at this width, from the cache or rendered now."""
        trace = trace or self.trace
        assert trace is not None
        layer = self._layer if layer is None else layer
        stage = trace.stages[index]
        explain = self._explains(partial(stage_box, stage), (layer, index), width)
        opts = replace(self._window_options(width), explain=explain)
        if self.cursor is not None and index == self.stage_index and stage.tensors:
            record = stage.tensors[-1]
            # The numbers first: the box folds while the panel explains a cell.
            opts = replace(opts, explain=False,
                           cursor=(record.name, tensor_index(record, *self.cursor)))
        key = (layer, index, opts)
        with self._cache.lock:
            lines = self._cache.get(key)
            if lines is None:
                screen = stage_screen(trace, stage, opts)
                marks = self._check_rows()
                if marks is not None:  # --check: the judgement above the stage
                    from .check.report import stage_judgement

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
        """Render the other stages in the background so that every step is a cache hit."""
        if self.trace is not None and not self._cache_disabled:
            self.run_worker(self._warm_all, thread=True, exclusive=True, group="warm",
                            name="warm cache")

    def _warm_all(self) -> None:
        trace, layer = self.trace, self._layer  # a layer switch must not mix two layers' lines
        assert trace is not None
        width = self.query_one(StageView).text_width
        order = sorted(range(len(trace.stages)), key=lambda i: abs(i - self.stage_index))
        for index in order:
            self._lines(index, width, trace, layer)

    # ------------------------------------------------------------------ actions

    def _sync_keys(self) -> None:
        """Refresh the footer only when a key's enabled state really changed (it costs a
        full footer layout): first or last stage, the wrong-view stage, top or bottom of the
        stage."""
        view = self.query_one(StageView)
        index = self.stage_index
        state = (index == 0, index == len(self.stage_ids) - 1, self._has_aside(index),
                 view.scroll_y <= 0, view.scroll_y >= view.max_scroll_y)
        if state != self._key_state:
            self._key_state = state
            self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Grey out keys that cannot act here (None), rather than hiding them."""
        last = len(self.stage_ids) - 1
        forward = int(parameters[0]) > 0 if parameters else True  # type: ignore[call-overload]
        if action in ("sentence", "heads", "causal"):
            if self._layers is not None:
                return False  # a pretrained model brings its own sizes and mask
            return True if self.trace is not None and self._rerunning is None else None
        if action == "drill":
            return True if self.cursor is None and self._drillable() else None
        if action == "leave":
            return True if self.cursor is not None else False
        if self.cursor is not None and action in ("step", "scroll"):
            return True
        if action == "step":
            return None if (forward and self.stage_index == last) or (
                not forward and self.stage_index == 0) else True
        if action == "jump":
            target = int(parameters[0]) if parameters else 0  # type: ignore[call-overload]
            return None if target % len(self.stage_ids) == self.stage_index else True
        if action in ("scroll", "page", "edge"):
            view = self.query_one(StageView)
            if action == "edge":
                forward = bool(parameters and parameters[0])
            return None if (view.scroll_y >= view.max_scroll_y if forward
                            else view.scroll_y <= 0) else True
        if action == "head":
            return True if self.config.num_heads > 1 else None
        if action == "all_heads":
            return None if self.view.focus is None else True
        if action == "decimals":
            delta = int(parameters[0]) if parameters else 1  # type: ignore[call-overload]
            return None if not 0 <= self.view.decimals + delta <= MAX_DECIMALS else True
        if action == "wrong_view":
            return True if self._has_aside(self.stage_index) else None
        if action == "layer":
            if self._layers is None:
                return False  # not a pretrained model: no layers to move between
            target = self._layer + (int(parameters[0]) if parameters else 1)  # type: ignore[call-overload]
            return True if self.trace is not None and 0 <= target < self._layers.n_layers else None
        return True

    # ------------------------------------------------------------------ the drill-down

    def _drillable(self) -> bool:
        """Whether the current stage's result can take the cursor (a why for its kind)."""
        if self.trace is None:
            return False
        from .why import KINDS

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

        from .render.why import why_view
        from .why import WhyError, why

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

    def action_step(self, delta: int) -> None:
        if self.cursor is not None:
            self._move(0, delta)
            return
        self.stage_index = min(len(self.stage_ids) - 1, max(0, self.stage_index + delta))

    def action_jump(self, index: int) -> None:
        self.stage_index = index % len(self.stage_ids)

    def action_scroll(self, lines: int) -> None:
        if self.cursor is not None:
            self._move(lines, 0)
            return
        self.query_one(StageView).scroll_relative(y=lines, animate=False)

    def action_page(self, pages: int) -> None:
        view = self.query_one(StageView)
        view.scroll_relative(y=pages * view.scrollable_content_region.height, animate=False)

    def action_edge(self, bottom: int) -> None:
        view = self.query_one(StageView)
        view.scroll_to(y=view.max_scroll_y if bottom else 0, animate=False)

    def action_head(self, delta: int) -> None:
        h = self.config.num_heads
        current = self.view.focus
        if self.cursor is not None:  # the cursor's head: the same cell, one head over
            heads, _, cols = self._bounds()
            head, row, col = self.cursor
            if heads > 1:
                focus = (head + delta) % heads
                self.cursor = (focus, row, col)
            else:  # (B, T, C): the same channel of the next head's block of d_h
                d_h = self.config.head_dim
                self.cursor = (0, row, (col + delta * d_h) % cols)
                focus = self.cursor[2] // d_h % h
            self.view = replace(self.view, focus=focus)
            return
        focus = (0 if delta > 0 else h - 1) if current is None else (current + delta) % h
        self.view = replace(self.view, focus=focus)

    def action_all_heads(self) -> None:
        self.view = replace(self.view, focus=None)

    def action_numbers(self) -> None:
        self.view = replace(self.view, numbers=not self.view.numbers)

    def action_decimals(self, delta: int) -> None:
        self.view = replace(self.view, decimals=min(MAX_DECIMALS, max(0, self.view.decimals + delta)))

    def action_explain(self) -> None:
        """Fold or unfold every stage's explanation: the opposite of what this stage shows."""
        width = self.query_one(StageView).text_width
        if self.trace is not None:
            shown = self._explains(partial(stage_box, self.trace.stages[self.stage_index]),
                                   (self._layer, self.stage_index), width)
        else:
            info = stage_info(STAGE_IDS[min(self.stage_index, len(STAGE_IDS) - 1)],
                              causal=self.config.causal)
            shown = self._explains(partial(pending_box, info), ("pending", info.id), width)
        self._explain_chosen = True
        if self.view.explain != (not shown):
            self.view = replace(self.view, explain=not shown)
        else:  # the same view options, chosen now rather than by height: draw again
            self._show()
            self._warm()

    def action_layer(self, delta: int) -> None:
        """`[` / `]`: the same stage of the previous / next layer of the model."""
        layers, target = self._layers, self._layer + delta
        if layers is None or not 0 <= target < layers.n_layers:
            return
        if layers.recorded(target):
            self._show_layer(target, layers.trace(target))
            return
        self.notify(f"layer {target}: running the model's forward again (sentences longer than "
                    f"{layers.limit} tokens keep one layer at a time)", timeout=4)
        self.run_worker(lambda: self._load_layer(target), thread=True, exclusive=True,
                        group="layer", name=f"layer {target}")

    def _load_layer(self, layer: int) -> None:
        assert self._layers is not None
        try:
            trace = self._layers.trace(layer)
        except Exception as error:  # shown as a notice; the current layer stays on screen
            self.call_from_thread(self.notify, f"could not run layer {layer}: {error}",
                                  severity="error")
            return
        self.call_from_thread(self._show_layer, layer, trace)

    def _show_layer(self, layer: int, trace: Trace) -> None:
        """Put another layer's trace on screen at the same stage (its lines cached by layer)."""
        same_rail = self.trace is not None and [s.id for s in self.trace.stages] == [
            s.id for s in trace.stages]
        self._layer = layer
        self.trace = trace
        self.config = trace.config
        if not same_rail:
            rail = self.query_one(StageRail)
            rail.clear_options()
            rail.add_options(self._rail_options())
        self.query_one("#header", Static).update(self._header())
        self.set_reactive(ExplainApp.stage_index, min(self.stage_index, len(trace.stages) - 1))
        self.refresh_bindings()
        self._show()
        self._warm()

    def action_wrong_view(self) -> None:
        self.view = replace(self.view, wrong_view=not self.view.wrong_view)

    def help_rows(self) -> list[tuple[str, str]]:
        """The help screen's (keys, what) rows, keys named from the bindings themselves."""
        by_id = {b.id: b for b in self.BINDINGS if isinstance(b, Binding)}
        names = {**KEY_NAMES, **({k: ASCII_KEYS.get(v, v) for k, v in KEY_NAMES.items()}
                                 if self._ascii else {})}

        def keys(binding_id: str) -> str:
            return " ".join(names.get(key, key) for key in by_id[binding_id].key.split(","))

        rows = []
        for ids, description in self.HELP:
            if ids[0].startswith("layer.") and self._layers is None:
                continue  # layers exist only for a pretrained model (--hf)
            if ids[0].startswith("stage.jump"):
                rows.append(("1-9, 0", description))
            else:
                rows.append((" / ".join(keys(binding_id) for binding_id in ids), description))
        return rows

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_rows(), ascii_only=self._ascii))

    def on_option_list_option_selected(self, event: StageRail.OptionSelected) -> None:
        self.stage_index = event.option_index


def prepare_terminal() -> str | None:
    """Make the process fit to run the app; returns why not, in one line, or None.

    - COLUMNS/LINES exported in the shell would lock the app's size: Textual asks
      shutil.get_terminal_size, which prefers them to the terminal's real size, on start
      and on every resize. The app follows the terminal, so they go.
    - Textual draws on stderr (its Linux driver writes frames there). With stderr
      redirected (2>log) the frames would fill the file and the terminal stay blank: the
      CLI chose the app because stdout is a terminal, so draw there.
    - Textual reads keys from stdin. When stdin is a pipe or a file, the keys typed in the
      terminal (even q) would never arrive: read them from the controlling terminal
      instead, as less and fzf do. No controlling terminal: refuse.
    """
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    if not os.isatty(0):
        try:
            tty = os.open("/dev/tty", os.O_RDWR)
        except OSError as error:
            return (f"the app reads keys from the terminal, and there is none "
                    f"({error.strerror}); use --dump to write a transcript")
        os.dup2(tty, 0)
        os.close(tty)
    if os.isatty(1) and not os.isatty(2):  # after any refusal: that goes to the real stderr
        os.dup2(1, 2)
    return None


def wants_ascii() -> bool:
    """True when the terminal streams cannot encode the app's glyphs (PYTHONIOENCODING=ascii).

    Textual writes its frames to stderr; the CLI chose the app because stdout is a terminal."""
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            "→━▇".encode(getattr(stream, "encoding", None) or "utf-8")
        except (UnicodeEncodeError, LookupError):
            return True
    return False


def explain_app(config: Config, *, start: str | None = None, ascii_only: bool = False,
                loaded: Loaded | LoadedNumpy | None = None,
                build: Callable[[Config], Loaded | LoadedNumpy] | None = None,
                **options: Any) -> ExplainApp:
    """The app for one run, not started yet.

    loaded: the module the CLI built from --model/--module (None: the default run);
    build: builds it instead, in the app's loading thread, so that the app is on screen
    while a learner's module imports and its forward runs (it may never return);
    options: ExplainApp's, e.g. loader and checker for --check, running, refusals."""
    if build is not None:
        options.setdefault("loader", lambda c: _load_trace(c, loaded=build(c)))
    options.setdefault("loader", partial(_load_trace, loaded=loaded))
    return ExplainApp(config, start=start, ascii_only=ascii_only or wants_ascii(),
                      batched=getattr(loaded, "batched", True), **options)  # NumPy: (T, C)


def run_app(config: Config, **options: Any) -> str | None:
    """Run the app in this terminal (call prepare_terminal first); returns a refusal of the
    input (one line, for exit code 2), or None. options: explain_app's."""
    app = explain_app(config, **options)
    app.run()
    return app.refusal
