"""One submission judged, in a process of its own: the fork server's grandchild, inside the
submission's sandbox when there is one.

`run(job)` never returns. Before any learner code runs: privileges dropped (sandbox.py), the
working directory the sandbox's empty /scratch (or the job's own folder without one), a clean
environment, standard input /dev/null, standard output and error the job's log (a print cannot
reach the result), core dumps off, no file past `max_write` bytes, the address space capped at
what torch and mha-tui already use plus the request's memory budget, at most `processes`
processes, and Python's audit hook noting what a forward has no reason to do (connect, start a
process, send a signal, write outside its scratch folder, open another submission's file).

Then the verdict, as `check --format json` writes it, goes to the job's result file, unless
the learner's code ended the process first (the parent then says why) or did something the
sandbox forbids or the audit saw: that submission is "could not judge", naming what it tried.
A submission's code runs in this same process as the judge: the sandbox keeps it from
everything outside the process; inside, `tampering()` catches torch or mha-tui functions
swapped in memory, not every way to forge a verdict (docs/grading.md).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

# What the fork server imports once (torch's libraries alone take about a second).
PRELOAD = ("resource", "faulthandler", "socket", "torch", "mha_tui.config", "mha_tui.load",
           "mha_tui.load.learner", "mha_tui.load.modules", "mha_tui.load.numpy_modules", "mha_tui.tracing",
           "mha_tui.tracing.torch_ops", "mha_tui.tracing.numpy_ops", "mha_tui.tracing.rerun",
           "mha_tui.pipeline", "mha_tui.judge.report", "mha_tui.judge.verdict",
           "mha_tui.grade.results")


def _name_process(name: bytes) -> None:
    import ctypes

    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME


def preload() -> None:
    """Import what a check imports (a NumPy-only environment has no torch: its modules need
    none), and warm torch up once (its first op loads more), so that no worker pays for it."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # several workers share the cores; tensors are tiny
        # One whole check of a tutorial's module: what every check runs the first time
        # (lazy imports, torch's first ops) is then done once, here, not in every worker.
        from ..config import DEFAULT_MODEL

        judge({"module": None, "model": DEFAULT_MODEL, "sentence": "I love AI !",
               "embed_dim": 4, "heads": 2, "seed": 0, "causal": True, "max_seq_len": 8,
               "init": [], "weights": None, "memory": 0})
    BEFORE.update(fingerprint())
    import gc

    gc.collect()
    # Every object so far is the server's, shared with each forked worker: kept out of the
    # collector's reach, so that a worker's collections neither walk nor copy them.
    gc.freeze()


def _address_space() -> int | None:
    """This process's virtual size in bytes (Linux), None where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _user_processes() -> int:
    """How many processes (threads too) this process's uid has now, machine-wide."""
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                continue
    return count


def limit_resources(memory: int, max_write: int, processes: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if max_write > 0:  # a print loop would otherwise fill the disk through the log
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_write, max_write))
    used = _address_space()
    if used is not None and memory > 0:
        cap = used + memory
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if processes > 0:  # a fork bomb is refused (the kernel counts per uid, threads too)
        # As another uid of its own (a root grader's sandbox) it counts only itself; as the
        # grader's user it shares the count with everything that user runs.
        cap = processes + (_user_processes() if os.getuid() != 0 else 0)
        resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))


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
    from ..records.request import Request
    from .results import unjudged

    module, model = request["module"], request["model"]
    shown = module or model
    file = module.rpartition(":")[0] if module and ".py:" in module else None
    try:
        asked = Request.from_json(request)  # the same Request `check` builds for one module
        from ..judge.report import verdict_json
        from ..load.learner import LoadError
        from ..pipeline import verdict as verdict_of

        try:
            verdict = verdict_of(asked)
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


# ------------------------------------------------------------------- what the audit sees

_STARTS = {"os.fork": "forked a process", "os.forkpty": "forked a process",
           "os.posix_spawn": "started a program", "os.spawn": "started a program",
           "os.exec": "ran a program", "os.system": "ran a shell command",
           "subprocess.Popen": "started a program"}


class Audit:
    """Python's audit events a forward has no reason to raise, noted (first few) for the
    verdict. An audit hook cannot be removed; code that goes round Python (ctypes, a C
    extension) is not seen here, only stopped by the sandbox."""

    def __init__(self, own_file: str | None, watched: list[str], writable: list[str]) -> None:
        self.seen: list[str] = []
        self.own = os.path.realpath(own_file) if own_file else None
        self.watched = [w.rstrip("/") + "/" for w in watched]
        self.writable = [w.rstrip("/") + "/" for w in writable]
        # Python, its packages and mha-tui are read-only, wherever they live: a checkout (or a
        # CI clone) under /tmp must not make torch's files count as the private /tmp.
        fixed = {sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[1]),  # mha_tui/
                 *(p for p in sys.path if "site-packages" in p)}
        self.read_only = [os.path.realpath(p).rstrip("/") + "/" for p in fixed if p] + \
            [p.rstrip("/") + "/" for p in fixed if p]
        self.active = False

    def note(self, what: str) -> None:
        if what not in self.seen and len(self.seen) < 5:
            self.seen.append(what)

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        try:
            self._event(event, args)
        except Exception:  # never let the audit itself break a forward
            return

    def _event(self, event: str, args: tuple[Any, ...]) -> None:
        if event in ("socket.connect", "socket.sendto", "socket.bind"):
            address = args[1] if len(args) > 1 else "?"
            if isinstance(address, tuple) and len(address) >= 2:
                address = f"{address[0]}:{address[1]}"
            verb = "listen on" if event == "socket.bind" else "connect to"
            self.note(f"tried to {verb} {address} (the sandbox has no network)")
        elif event in _STARTS:
            program = args[0] if args and event != "os.fork" else ""
            if isinstance(program, (list, tuple)):
                program = " ".join(map(str, program))
            self.note(f"{_STARTS[event]}{f' ({str(program)[:80]})' if program else ''}")
        elif event in ("os.kill", "os.killpg"):
            self.note(f"sent a signal to process {args[0]}")
        elif event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.fsdecode(args[0])
            mode, flags = (args[1] if len(args) > 1 else "r"), (args[2] if len(args) > 2 else 0)
            full = os.path.abspath(path)
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            theirs = any(full.startswith(w) for w in self.watched) and \
                self.own != os.path.realpath(full) and "/__pycache__/" not in full
            fixed = any(full.startswith(r) for r in self.read_only)
            if writes and (theirs or fixed or not any(full.startswith(w) for w in self.writable)) \
                    and not full.startswith("/dev/"):
                self.note(f"tried to write {full}")
            elif theirs:
                self.note(f"tried to open {full}, which is not its own file")


_WATCHED_TORCH = ("torch", "torch.functional", "torch.nn.functional", "torch.nn.modules.linear",
                  "torch.nn.modules.module", "torch.nn.modules.activation")


def fingerprint() -> dict[tuple[str, str], int]:
    """Which object every name of mha-tui's modules, of torch's namespaces a forward calls
    (torch, torch.nn.functional, nn.Linear, nn.Module, the activations) and of torch.Tensor's
    methods is bound to now. Taken once in the fork server: every worker starts from it."""
    seen: dict[tuple[str, str], int] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name in _WATCHED_TORCH or name.startswith("mha_tui")):
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) or isinstance(value, (int, float, str, tuple, frozenset)):
                seen[(name, attr)] = id(value)
    torch = sys.modules.get("torch")
    if torch is not None:
        for attr, value in list(vars(torch.Tensor).items()):
            seen[("torch.Tensor", attr)] = id(value)
    return seen


BEFORE: dict[tuple[str, str], int] = {}  # the fork server's fingerprint, after preload


def tampering(before: dict[tuple[str, str], int]) -> list[str]:
    """The names of torch and mha-tui rebound (or deleted) since `before`."""
    after = fingerprint()
    return sorted(f"{module}.{attr}" for (module, attr), ident in before.items()
                  if after.get((module, attr)) != ident)


def verdict_with_audit(document: dict[str, Any], audit: Audit, changed: list[str],
                       shown: str) -> dict[str, Any]:
    """The verdict, or "could not judge" naming what the submission tried."""
    from .results import unjudged

    tried = list(audit.seen)
    if changed:
        names = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3
                                          else "")
        tried.insert(0, f"changed {names} in memory")
    if not tried:
        return document
    said = "; ".join(tried)
    return unjudged(shown, "sandbox", f"could not grade: it {said}")


# ------------------------------------------------------------------------------- the run

def run(job: dict[str, Any], log_fd: int, result_fd: int) -> None:
    """The worker: never returns (os._exit), whatever the learner's code does."""
    import faulthandler
    import signal

    code = 0
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.closerange(3, result_fd)
        os.closerange(result_fd + 1, 4096)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _name_process(b"mha-tui-worker")  # what ps and the tests see
        faulthandler.enable(sys.stderr)  # a crash or SIGABRT prints the Python stack to the log
        sys.stdout = sys.stderr
        request = job["request"]
        if job.get("sandbox"):
            from .sandbox import SCRATCH, drop_privileges

            drop_privileges(job.get("uid"))
            scratch = SCRATCH
        else:
            os.setsid()  # the grader kills this session: a learner's child process too
            scratch = job["scratch"]
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update({"HOME": scratch, "TMPDIR": "/tmp" if job.get("sandbox") else scratch,
                           "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"})
        limit_resources(request["memory"], request.get("max_write", 0),
                        request.get("processes", 0) if job.get("sandbox") else 0)
        module = request["module"]
        file = module.rpartition(":")[0] if module and ".py:" in module else None
        audit = Audit(file, job.get("watched", []),
                      [scratch, "/tmp"] if job.get("sandbox") else [scratch])
        sys.addaudithook(audit)
        before = BEFORE or fingerprint()
        audit.active = True
        document = judge(request)
        audit.active = False
        document = verdict_with_audit(document, audit, tampering(before),
                                      module or request["model"])
        data = json.dumps(document, allow_nan=False).encode("utf-8")
        os.ftruncate(result_fd, 0)
        while data:
            data = data[os.write(result_fd, data):]
    except BaseException:  # mha-tui's own failure around the judge: the parent says it
        code = 70
        try:
            traceback.print_exc()
        except BaseException:  # the log itself may be full (RLIMIT_FSIZE)
            pass
    try:
        sys.stderr.flush()
    except BaseException:  # a full log: the learner's last prints are lost, not the verdict
        pass
    os._exit(code)  # done: skip torch's teardown and any learner atexit hook
