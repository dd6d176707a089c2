"""The heads screen (`mha-tui heads` in a terminal): every layer x head at a glance.

Draws `render.heads` (the same renderables as `heads --dump`) from a `roles.ModelView`
computed before the app starts. The arrows move the cursor over the heads; enter ends the app
with the chosen (layer, head), and the CLI opens that layer's walk-through at that head (and
comes back here when it is closed); `x` and `m` remove the head under the cursor (zero or
mean ablation) by running the model again in a worker, never in the key handler.
Never import typer, torch or the CLI here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.console import Group
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.reactive import reactive
from textual.widgets import Footer, Static

from ..render.heads import HeadsGrid, head_detail, layer_top, predictions_table, roles_table
from ..render.options import RenderOptions
from ..roles import ModelView

Ablate = Callable[[int, int, str], ModelView]


class HeadsApp(App[tuple[int, int] | None]):
    """Every head of a model; returns the (layer, head) chosen with enter, or None."""

    CSS_PATH = "heads.tcss"
    TITLE = "mha-tui heads"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left,h", "move(0, -1)", "Head", key_display="←", tooltip="The head to the left",
                id="heads.left", priority=True),
        Binding("right,l", "move(0, 1)", "Head", key_display="→", tooltip="The head to the right",
                id="heads.right", priority=True),
        Binding("up,k", "move(-1, 0)", "Layer", key_display="↑", tooltip="The layer above",
                id="heads.up", priority=True),
        Binding("down,j", "move(1, 0)", "Layer", key_display="↓", tooltip="The layer below",
                id="heads.down", priority=True),
        Binding("enter", "open", "Walk-through", key_display="↵",
                tooltip="Open this layer's walk-through at this head", id="heads.open"),
        Binding("x", "ablate('zero')", "Remove head",
                tooltip="Run the model again with this head's slice of the input to W_O set to 0",
                id="heads.ablate"),
        Binding("m", "ablate('mean')", "Mean-ablate", show=False,
                tooltip="Run again with this head's slice set to its mean over the positions",
                id="heads.mean"),
        Binding("q,escape", "quit", "Quit", id="heads.quit"),
    ]
    """Arrows choose a head, enter opens it, x removes it, q quits. The arrows take priority
    over the scroll container's (which keeps page up and page down for a tall grid)."""

    selected: reactive[tuple[int, int]] = reactive((0, 0), init=False)
    """The head under the cursor: (layer, head)."""

    def __init__(self, view: ModelView, opts: RenderOptions | None = None, *,
                 selected: tuple[int, int] = (0, 0), ablate: Ablate | None = None) -> None:
        super().__init__()
        self.model_view = view
        self.opts = opts or RenderOptions()
        self._ablate = ablate
        self._busy = ""
        self.set_reactive(HeadsApp.selected, selected)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="heads-scroll"):
            yield Static(id="heads-grid")
            yield Static(id="heads-detail")
        yield Footer()

    def on_mount(self) -> None:
        self._draw()

    def watch_selected(self) -> None:
        self._draw()
        grid = self.query_one("#heads-grid", Static)
        top = layer_top(self.model_view, self.selected[0], grid.size.width or self.size.width)
        self.query_one("#heads-scroll", VerticalScroll).scroll_to(y=max(top - 1, 0), animate=False)

    def _draw(self) -> None:
        view = self.model_view
        self.query_one("#heads-grid", Static).update(HeadsGrid(view, self.opts, self.selected))
        parts = [head_detail(view, *self.selected), Text(), roles_table(view, self.opts,
                                                                       [self.selected])]
        if self._busy:
            parts.append(Text(self._busy, style="yellow"))
        parts += [Text(), predictions_table(view, self.opts)]
        self.query_one("#heads-detail", Static).update(Group(*parts))

    def action_move(self, layers: int, heads: int) -> None:
        layer, head = self.selected
        view = self.model_view
        self.selected = (min(max(layer + layers, 0), view.n_layers - 1),
                         min(max(head + heads, 0), view.num_heads - 1))

    def action_open(self) -> None:
        self.exit(self.selected)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "ablate" and (self._ablate is None or self.model_view.predictions is None):
            return None  # shown greyed out: nothing to compare without next-token predictions
        return True

    def action_ablate(self, method: str) -> None:
        layer, head = self.selected
        self._busy = f"running the model again without head {layer}.{head} ({method}) …"
        self._draw()
        self._run_ablation(layer, head, method)

    @work(thread=True, exclusive=True)
    def _run_ablation(self, layer: int, head: int, method: str) -> None:
        assert self._ablate is not None
        view = self._ablate(layer, head, method)
        self.call_from_thread(self._ablated, view)

    def _ablated(self, view: ModelView) -> None:
        self.model_view = view
        self._busy = ""
        self._draw()
