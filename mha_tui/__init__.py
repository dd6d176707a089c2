"""mha-tui: a terminal explainer for PyTorch multi-head attention.

Importing the package must stay cheap (no torch, no textual): the CLI's --help and
--version depend on it. `mha_tui.trace(module, x, tokens=None)` is the public entry point:
run a module's forward once and get back the `Trace` of stages that the app and the
transcripts show (see `mha_tui.tracing.trace`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .records import Trace

__version__ = "0.1.0"


def trace(module: Any, x: Any, tokens: Any = None, **options: Any) -> Trace:
    """Trace one forward of `module` on `x`; see `mha_tui.tracing.trace` for the options."""
    from .tracing import trace as _trace  # torch is imported only now

    return _trace(module, x, tokens, **options)
