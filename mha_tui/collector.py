"""CPython's cyclic garbage collector held back while the app starts up.

Opening the app imports Textual and the app, paints, then imports torch in the loading
thread: several hundred thousand long-lived objects (modules, classes, functions) and next
to no garbage. The collector runs by the count of allocations, and each pass over its
oldest generation walks every object alive while holding the GIL: on the development
machine those passes took ~40 ms before the first frame and ~200 ms of torch's import in
the app (~120 ms of the same import alone, the floor `python -c "import torch"`) and
freed next to nothing.

- `pause()`: the `mha-tui` command, before it imports the app (`cli.process.open_app`). Never in
  a process that only calls mha-tui (tests, a notebook): their collector is theirs.
- `resume(freeze=True)`: before a module's own code runs (`load.learner.learner_code`:
  importing a learner's file, building a module). What is alive then is the start-up's
  (Textual, the app, torch), and `gc.freeze` leaves it out of every later pass: it is still
  freed by its reference count, only a reference cycle among it would stay (the start
  makes next to none: the passes it paid for found a few thousand objects). The module's
  code, its forward and everything after run with the collector on.
- `resume()` (no freeze): at the latest when the app's first forward is done or the app
  ends (a `--hf` model is built without a learner's code; the forward's garbage must stay
  collectable).
- `off()`: the `mha-tui` command drawing a text transcript (`cli`), which makes no reference
  cycle (tests/test_dump.py): the passes over a --full transcript's millions of cell texts
  were a quarter of its drawing. The collector is as it was after.

Imports nothing of mha-tui: the CLI, the app and the loader call it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_paused = False


def pause() -> None:
    """Stop the collector until `resume` (a no-op if it is already off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume(*, freeze: bool = False) -> None:
    """Start the collector again if `pause` stopped it; freeze: first move every object
    alive out of its passes (only before any module's code ran: see the module's note)."""
    global _paused
    if not _paused:
        return
    _paused = False
    if freeze:
        gc.freeze()
    gc.enable()


def paused() -> bool:
    """Whether `pause` holds the collector now."""
    return _paused


@contextmanager
def off() -> Iterator[None]:
    """The collector off for a block of mha-tui's own code, then as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
