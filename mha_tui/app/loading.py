"""The trace-loading worker: the forward (build, trace, judge) runs in a daemon thread off the
event loop, and the app shows the catalogue's stages with a waiting line until it arrives;
`s`, `H` and `c` run the same module again on another input, in the background.

`Loading` is mixed into `ExplainApp` (explain.py). Never import typer, torch or the CLI here
(the pipeline, and with it torch, is imported in the worker's thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.widgets import Static

from .. import collector
from ..config import Config, ConfigError, divisors
from ..records import Trace
from ..records.request import Request
from ..render.text import printable
from .stage_view import StageView
from .widgets import SentenceBar, StageRail

if TYPE_CHECKING:
    from ..judge import Verdict
    from ..load.modules import LoadedTorch
    from ..load.numpy_modules import LoadedNumpy

SHOW_ELAPSED_AFTER = 3
"""Seconds a forward may take before the waiting line shows how long it has been running."""
START_LOADING_AFTER = 0.5
"""Seconds after mount by which the first forward starts even if the waiting screen's paint
was never seen (it normally starts at that paint, well before)."""


def load_trace(config: Config, loaded: LoadedTorch | LoadedNumpy | None = None,
               request: Request | None = None) -> Trace:
    """The app's input (config) run through the pipeline's one door: the caller's Request
    (the CLI's: its module and options; by default the default module) with that config.
    loaded: the request's module, already built (`pipeline.load`)."""
    from dataclasses import replace

    from ..pipeline import traced

    trace = traced(Request(config) if request is None else replace(request, config=config),
                   loaded=loaded)
    # Warm Pygments' Python lexer here, off the event loop, before the first stage draws.
    from rich.syntax import Syntax

    Syntax("x", "python").highlight("x")
    return trace


class Loading:
    """The forward off the event loop: the first one, and again on another input."""

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
            finally:  # at the latest now (a --hf model runs no learner's code: no freeze)
                collector.resume()
            with contextlib.suppress(RuntimeError):  # the app has quit meanwhile
                loop.call_soon_threadsafe(deliver, result)

        threading.Thread(target=work, name="mha-tui forward", daemon=True).start()
        return await done

    def _start_loading(self) -> None:
        """Start the first forward, once.

        After the waiting screen is painted: the loading thread's `import torch` holds the
        GIL that the first frames' layout and render need, and started at the first frame
        it delayed the waiting screen by more than it brought the values forward (Python
        runs one thread at a time either way)."""
        if self._loading:
            return
        self._loading = True
        self._load_started = time.monotonic()
        self.run_worker(self._load(), exclusive=True, name="trace")

    def _painted(self) -> None:
        """The first frame with the stage pane drawn is on the terminal."""
        self._mark("paint")
        if self.trace is None:
            self._start_loading()

    def _load_if_hidden(self) -> None:
        """After the first frame: a stage pane with no size (the terminal too small for the
        app) will not be painted, so the forward starts now rather than when it is."""
        if not self.query_one(StageView).size:
            self._start_loading()

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

    def _rerun(self, **changes: Any) -> None:
        """The same module on another sentence, head count or mask: checked as the CLI
        checks it (its messages), run in the background; the old trace stays until then."""
        if self.trace is None or self._rerunning is not None:
            self.notify("the forward is still running; wait for it", severity="warning")
            return
        current = self.config
        fields = {"sentence": current.sentence, "embed_dim": current.embed_dim,
                  "num_heads": current.num_heads, "seed": current.seed,
                  "causal": current.causal, "max_seq_len": current.max_seq_len,
                  "context": current.context, **changes}
        try:
            config = Config(**fields)
        except ConfigError as error:  # the CLI's words; a flag it names is not the app's
            said = str(error) + (" (a flag of the command: quit with q and run it again with "
                                 "it; the app cannot change it)" if " --" in str(error) else "")
            self.notify(said, title="refused", severity="error", timeout=8)
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
        self._new_quiz(trace)
        self._cache.clear()
        with self._cache.lock:
            self._box_heights.clear()
        self.query_one("#header", Static).update(self._header())
        rail = self.query_one(StageRail)
        rail.clear_options()
        rail.add_options(self._rail_options())
        ids = self.stage_ids
        index = ids.index(old_id) if old_id in ids else min(self.stage_index, len(ids) - 1)
        self.set_reactive(type(self).stage_index, index)
        if self.cursor is not None:  # the same cell, where it still exists
            self.set_reactive(type(self).cursor, self._clamped(self.cursor))
            self.set_class(self.cursor is not None, "-drilling")
        else:  # a panel that said the stage takes no cursor
            self.set_class(False, "-drilling")
        self.refresh_bindings()
        self._show()
        self._warm()

    def action_sentence(self) -> None:
        """`s`: type another sentence; the module runs on it."""
        self.query_one(SentenceBar).open(self.config.sentence)

    def on_sentence_bar_typed(self, message: SentenceBar.Typed) -> None:
        """Enter on the sentence line runs the module on it; esc keeps the sentence."""
        self.query_one(StageView).focus()
        if message.text is not None:
            self._rerun(sentence=message.text)

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
        self._decode_steps, self._step = trace.steps, 0  # --decode: a new run starts at step 1
        self._new_quiz(trace)
        self.query_one("#header", Static).update(self._header())
        rail = self.query_one(StageRail)
        rail.clear_options()
        rail.add_options(self._rail_options())
        ids = self.stage_ids
        current = min(self.stage_index, len(ids) - 1)
        wanted = self._start_id if self.stage_index == self._start else ids[current]
        index = ids.index(wanted) if wanted in ids else min(self.stage_index, len(ids) - 1)
        self.set_reactive(type(self).stage_index, index)
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
