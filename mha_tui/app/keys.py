"""Key handling: every binding with its id, the help screen's rows (named from the bindings,
so the help cannot drift from the keys), which keys can act now (`check_action`), and the
actions that only change what is shown (stage, scroll, head, decimals, explanation).

`Keys` is mixed into `ExplainApp` (explain.py): its actions change the app's reactives
(`stage_index`, `view`, `cursor`); the watchers there redraw. Nothing is computed here.
Never import typer, torch or the CLI here.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import ClassVar

from textual.binding import Binding, BindingType

from ..render.stage import pending_box, stage_box
from ..stages import STAGE_IDS, stage_info
from .layout import BOX_SHARE, MAX_DECIMALS
from .stage_view import StageView
from .widgets import HelpScreen, StageRail

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


class Keys:
    """The app's keys: bindings, help, which keys act now, and the view-changing actions."""

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
        Binding("r", "batch_row(1)", "Row", tooltip="A padded batch (--batch): the next batch row",
                id="batch.next"),
        Binding("R", "batch_row(-1)", "Prev row", show=False, id="batch.prev"),
        Binding("d", "decode_step(1)", "Step", tooltip="Decoding with a KV cache (--decode N): "
                "the next decode step, at the same stage", id="decode.next"),
        Binding("D", "decode_step(-1)", "Prev step", show=False, id="decode.prev"),
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
        (("batch.next", "batch.prev"), "with --batch: the next / previous batch row"),
        (("decode.next", "decode.prev"), "with --decode: the next / previous decode step"),
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

    def get_key_display(self, binding: Binding) -> str:
        """The footer's key names; with --ascii the arrows become the letter keys beside them."""
        display = super().get_key_display(binding)
        return ASCII_FOOTER_KEYS.get(display, display) if self._ascii else display

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
            return True if self.cursor is None and (self._drillable() or self._no_cursor()) else None
        if action == "leave":
            return True if self.cursor is not None or self.has_class("-drilling") else False
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
        if action == "decode_step":
            steps = self._decode_steps or (self.trace.steps if self.trace is not None else ())
            return True if len(steps) > 1 else False
        if action == "batch_row":
            return True if len(self.config.rows) > 1 else False
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
            elif self._heads_in_columns():  # (B, T, C): the same channel, one block of d_h over
                d_h = self.config.head_dim
                self.cursor = (0, row, (col + delta * d_h) % cols)
                focus = self.cursor[2] // d_h % h
            else:  # one matrix with no heads in it (an op's (3, 3)): the cursor stays
                return
            self.view = replace(self.view, focus=focus)
            return
        focus = (0 if delta > 0 else h - 1) if current is None else (current + delta) % h
        self.view = replace(self.view, focus=focus)

    def action_all_heads(self) -> None:
        self.view = replace(self.view, focus=None)

    def action_batch_row(self, delta: int) -> None:
        """A padded batch: draw the next (or previous) row of the batch."""
        rows = len(self.config.rows)
        self.view = replace(self.view, row=((self.view.row or 0) + delta) % rows)

    def action_numbers(self) -> None:
        self.view = replace(self.view, numbers=not self.view.numbers)

    def action_decimals(self, delta: int) -> None:
        self.view = replace(self.view, decimals=min(MAX_DECIMALS, max(0, self.view.decimals + delta)))

    def action_explain(self) -> None:
        """Fold or unfold every stage's explanation: the opposite of what this stage shows."""
        width = self.query_one(StageView).text_width
        if self.trace is not None:
            shown = self._explains(partial(stage_box, self.trace.stages[self.stage_index],
                                           config=self.trace.config),
                                   ((self._layer, self._step), self.stage_index), width)
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
            if not self._in_help([by_id[i] for i in ids if i in by_id]):
                continue
            if ids[0].startswith("stage.jump"):
                rows.append(("1-9, 0", description))
            else:
                rows.append((" / ".join(keys(binding_id) for binding_id in ids), description))
        return rows

    def _in_help(self, bindings: list[Binding]) -> bool:
        """Whether the help lists these keys: layers exist only for a pretrained model (--hf)."""
        return not (bindings[0].id or "").startswith("layer.") or self._layers is not None

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_rows(), ascii_only=self._ascii))

    def on_option_list_option_selected(self, event: StageRail.OptionSelected) -> None:
        self.stage_index = event.option_index
