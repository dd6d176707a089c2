"""NumPy's BLAS on one thread while torch's threads are about (threadpoolctl).

torch runs its ops on its own OpenMP threads; NumPy's matrix products run on OpenBLAS's.
Each pool keeps its threads spinning for a while after a call (OpenBLAS's for about a tenth
of a second), so when the recogniser recomputes a product right after a torch forward, or a
forward runs right after a recomputed product, the two pools take turns at the same cores:
on two cores, a trace's wall clock was 1.5 to 2.5 times its CPU time. With the
recomputations on the calling thread alone (`one_blas_thread`), the forward keeps its
threads and nothing spins beside it. Only the thread count changes: the products, and so
every check, are the same. Never import rich, textual or typer here.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

_controller: list[Any] = []  # the ThreadpoolController, made once (it reads the loaded libraries)


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """A context in which NumPy's BLAS uses one thread, when torch is imported (its threads
    are the other pool); elsewhere (NumPy modules, no torch) nothing changes."""
    if "torch" not in sys.modules:
        return contextlib.nullcontext()
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # a dependency; an environment without it only runs slower
        return contextlib.nullcontext()
    if not _controller:
        import numpy  # noqa: F401  (its BLAS is loaded before the controller looks)

        _controller.append(ThreadpoolController())
    return _controller[0].limit(limits=1, user_api="blas")
