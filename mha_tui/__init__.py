"""mha-tui: a terminal explainer for PyTorch multi-head attention.

Importing the package must stay cheap (no torch, no textual): the CLI's --help and
--version depend on it. `mha_tui.trace(module, x, tokens=None)` is the public entry point:
run a module's forward once and get back the `Trace` of stages that the app and the
transcripts show (see `mha_tui.pipeline`: load -> trace -> recognise -> judge).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .notebook import Checked, Trace

__version__ = "0.1.0"


def trace(module: Any, x: Any, tokens: Any = None, **options: Any) -> Trace:
    """Trace one forward of `module` on `x`; see `mha_tui.tracing.record_forward` for the
    options (call, embedding, ids, config).

    A NumPy module (x an ndarray, the module not a torch nn.Module) is traced by the NumPy
    adapter instead (`mha_tui.pipeline.trace_numpy`: x (T, C), options args, kwargs, table,
    ids, config), and torch is never imported. In a Jupyter notebook the trace shows itself
    (`mha_tui.notebook.Trace`), and so does `trace.stage("softmax")`.

    decode=N: the last N tokens of x are generated one at a time against the module's KV
    cache after a prefill of the others; the Trace is the first step's and `trace.steps`
    holds every step's (each compared with the same row of the full, uncached forward).
    context=: cross-attention's second sequence (see `mha_tui.pipeline.trace`)."""
    from .notebook import trace_of

    return trace_of(module, x, tokens, **options)


def show(module: Any, x: Any, tokens: Any = None, **options: Any) -> None:
    """Trace `module` on `x` (options as for `trace`) and display every stage: in Jupyter as
    HTML in the app's colours (a stage chooser with ipywidgets), elsewhere as text."""
    from .notebook import show as _show

    _show(module, x, tokens, **options)


def check(module: Any, x: Any = None, tokens: Any = None, **options: Any) -> Checked:
    """Judge `module` stage by stage as `mha-tui check` does; in Jupyter the result shows the
    verdict table. See `mha_tui.notebook.check` for x's default and the options (context=,
    decode=N as `check --decode N`)."""
    from .notebook import check as _check

    return _check(module, x, tokens, **options)
