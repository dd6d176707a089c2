"""One submission judged in a process of its own, for `mha-tui check` grading a class.

`python -m mha_tui.grade_worker REQUEST RESULT`: REQUEST is the JSON `judge.grade` builds
(the module, the sizes, the limits); RESULT a path where the worker puts one JSON object,
the verdict as `check --format json` writes it, once it is done. Whatever the learner's
code does (hang, sys.exit, os._exit, os.abort, a segfault, eat memory) the parent sees either
that file or a process that ended without it, and says which.

Before any learner code runs: the worker's standard output becomes its standard error (a
print cannot reach the result), core dumps are off, no file (its log included) may grow
past the request's `max_write`, and the address space is capped at what
torch and mha-tui already use plus the request's memory budget (Linux), so that a runaway
allocation fails inside this process rather than the machine's. This is a robustness
boundary for honest mistakes, not a sandbox: code that means harm can still reach anything
this process can.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any


def _address_space() -> int | None:
    """This process's virtual size in bytes (Linux), None where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _limit_resources(memory: int, max_write: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if max_write > 0:  # a print loop would otherwise fill the disk through the log
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_write, max_write))
    used = _address_space()
    if used is not None and memory > 0:
        cap = used + memory
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _preload() -> None:
    """What a check imports, imported before the memory cap (torch's libraries alone map
    hundreds of MB). A NumPy-only environment has no torch: its modules need none."""
    import importlib

    for name in ("torch", "mha_tui.load", "mha_tui.tracing", "mha_tui.tracing.torch_ops",
                 "mha_tui.tracing.rerun"):
        try:
            importlib.import_module(name)
        except ImportError:
            return


def _learner_line(error: BaseException, file: str | None) -> int:
    """The innermost line of the learner's file in error's traceback (0: none)."""
    if not file:
        return 0
    target = os.path.realpath(file)
    lines = [frame.lineno or 0 for frame in traceback.extract_tb(error.__traceback__)
             if os.path.realpath(frame.filename) == target]
    return lines[-1] if lines else 0


def judge(request: dict[str, Any]) -> dict[str, Any]:
    """The verdict's JSON object for one submission; never raises (but for the learner's
    code ending the process)."""
    from .config import DEFAULT_MODEL, Config, Source, parse_init
    from .judge.grade import unjudged

    module, model = request["module"], request["model"]
    shown = module or model
    file = module.rpartition(":")[0] if module and ".py:" in module else None
    try:
        config = Config(request["sentence"], embed_dim=request["embed_dim"],
                        num_heads=request["heads"], seed=request["seed"],
                        causal=request["causal"], max_seq_len=request["max_seq_len"])
        source = Source(model=model or DEFAULT_MODEL, module=module,
                        init=tuple(parse_init(text) for text in request["init"]),
                        weights=request["weights"])
        # torch and the tracer are imported here, before the cap: their size is not the
        # learner's to pay for.
        from .judge.report import verdict_json
        from .load.learner import LoadError
        from .pipeline import Expect, check_source

        _preload()

        _limit_resources(request["memory"], request.get("max_write", 0))
        try:
            verdict = check_source(config, source, Expect(
                rotary=bool(request.get("rotary")), window=request.get("window"),
                alibi=bool(request.get("alibi")),
                rotary_base=float(request.get("rotary_base", 10000.0))))
        except LoadError as error:
            return unjudged(shown, "load_error", str(error).removeprefix("--module "))
        return verdict_json(verdict)
    except SystemExit as stop:  # the learner's sys.exit(), in __init__ or forward
        return unjudged(shown, "exited", f"the module called sys.exit({stop.code!r})",
                        file=file or "", line=_learner_line(stop, file))
    except MemoryError as error:
        return unjudged(shown, "out_of_memory",
                        f"ran out of memory (the limit is {request['memory'] >> 20} MB more than "
                        "mha-tui itself uses)", file=file or "", line=_learner_line(error, file))
    except Exception as error:  # mha-tui's own failure: said, never a traceback
        return unjudged(shown, "internal_error",
                        f"mha-tui could not judge it: {type(error).__name__}: {error}",
                        file=file or "", line=_learner_line(error, file))


def _watch_grader(grader: int | None) -> None:
    """End this worker, and whatever the learner's code started in its session, as soon as
    the grader that started it is gone: killed, or ended by a signal it could not act on
    (SIGTERM, SIGKILL, a hang-up). Its parent then is no longer the grader (it is init or a
    subreaper), so a worker never spins on alone until its time limit."""
    if not grader:
        return
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == grader:
            time.sleep(0.5)
        if os.getpgrp() == os.getpid():  # the session grade() started it in: all of it
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="mha-tui-watch-grader", daemon=True).start()


def main(argv: list[str]) -> None:
    request, result = json.loads(argv[1]), Path(argv[2])
    _watch_grader(request.get("grader"))  # first: before the memory cap, before any learner code
    os.dup2(2, 1)  # the learner's prints go to the log, never into the result
    sys.stdout = sys.stderr
    document = judge(request)
    partial = result.with_suffix(".partial")
    partial.write_text(json.dumps(document, allow_nan=False), "utf-8")
    os.replace(partial, result)
    sys.stderr.flush()
    os._exit(0)  # done: skip torch's teardown and any learner atexit hook


if __name__ == "__main__":
    main(sys.argv)
