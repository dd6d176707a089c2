"""A pretrained model's layers (`--hf`): `[` and `]` show the same stage of another layer,
from the session's traces (recorded in one forward, or run again for a long sentence); and
`--decode N`'s steps: `d` and `D` show the same stage of another decode step.

`LayerSwitch` is mixed into `ExplainApp` (explain.py). Never import typer, torch or the CLI here.
"""

from __future__ import annotations

from typing import Protocol

from textual.widgets import Static

from ..records import Trace
from .widgets import StageRail


class Layers(Protocol):
    """A pretrained model's layers on one sentence (`--hf`): a trace per layer, on request."""

    n_layers: int
    limit: int  # every layer is recorded in one pass up to this many tokens
    all_layers: bool

    def recorded(self, layer: int) -> bool: ...

    def trace(self, layer: int) -> Trace: ...


class LayerSwitch:
    """`[` / `]`: another layer of the model, at the same stage; `d` / `D`: another decode
    step (`--decode N`), each its own trace."""

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

    def action_decode_step(self, delta: int) -> None:
        """`d` / `D` (`--decode N`): the next / previous decode step, at the same stage."""
        if not self._decode_steps and self.trace is not None:
            self._decode_steps = self.trace.steps
        steps = self._decode_steps
        if len(steps) < 2:
            return
        self._step = (self._step + delta) % len(steps)
        self._show_layer(self._layer, steps[self._step])

    def _show_layer(self, layer: int, trace: Trace) -> None:
        """Put another layer's trace (or decode step's) on screen at the same stage (its
        lines cached by layer and step)."""
        same_rail = self.trace is not None and [s.id for s in self.trace.stages] == [
            s.id for s in trace.stages]
        self._layer = layer
        self.trace = trace
        self.config = trace.config
        self._new_quiz(trace)
        if not same_rail:
            rail = self.query_one(StageRail)
            rail.clear_options()
            rail.add_options(self._rail_options())
        self.query_one("#header", Static).update(self._header())
        self.set_reactive(type(self).stage_index, min(self.stage_index, len(trace.stages) - 1))
        self.refresh_bindings()
        self._show()
        self._warm()
