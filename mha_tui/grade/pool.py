"""Grading a class: every submission judged in a fresh process of its own, in a sandbox of
its own, with a time limit, several at once.

`mha-tui check submissions/ --class MultiHeadAttention` (a folder, a glob or files) starts one
fork server (server.py: torch and mha-tui imported once) and, for each submission, builds a
sandbox (sandbox.py: bubblewrap) and has the server fork a worker into it (worker.py). A worker
that does not finish in time is asked, by SIGABRT, where it was, then its sandbox is torn down
with everything in it; one that exits, crashes or runs out of memory leaves no result: each
becomes "could not judge" with the reason and, where the interpreter said it, the learner's
line. A submission that leaves a process running, or tries what the sandbox forbids where that
can be seen, is "could not judge" too, naming what it did. The order the submissions are
given in changes nothing but the order of the rows.

Where bwrap is missing (or cannot build a sandbox here) the grading goes on without one,
said once on stderr, unless the sandbox is required.

Never imports torch (the server does), rich, textual or typer.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from .find import Submission
from .results import MAX_WRITE, Graded, Limits, unjudged
from .sandbox import Box, SandboxError, open_box

# faulthandler's lines: `  File "/path/sub.py", line 28 in forward`
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in ', re.MULTILINE)
_UID_BASE = 2_000_000  # a root grader's sandboxes run as uids from here, one per job


class Server:
    """The fork server, and the answers it sends for each job (a thread reads them)."""

    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        # Nothing of the instructor's environment: the workers are forked from this one.
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": root, "PYTHONNOUSERSITE": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mha_tui.grade.server"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd="/",
            start_new_session=True)
        self._lock = threading.Lock()
        self._answers: dict[int, list[dict[str, Any]]] = {}
        self._ready = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self.gone = False
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if not first.startswith(b'{"ready"'):
            self.gone = True
        threading.Thread(target=self._read, name="mha-tui-grade-server", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            with self._ready:
                self._answers.setdefault(message["id"], []).append(message)
                self._ready.notify_all()
        with self._ready:
            self.gone = True
            self._ready.notify_all()

    def send(self, job: dict[str, Any]) -> int:
        job_id = next(self._ids)
        with self._lock:
            self._answers[job_id] = []
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({**job, "id": job_id}).encode() + b"\n")
            self.process.stdin.flush()
        return job_id

    def answer(self, job_id: int, key: str, timeout: float) -> dict[str, Any] | None:
        """The job's first answer holding `key` (or an error), None after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._ready:
            while True:
                for message in self._answers.get(job_id, []):
                    if key in message or "error" in message:
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if self.gone:
                    return {"id": job_id, "error": "the fork server ended"}
                self._ready.wait(min(left, 0.5))

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._answers.pop(job_id, None)

    def close(self) -> None:
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Workers:
    """The workers and sandboxes running now, so that an interrupted grading (Ctrl-C) stops
    them all at once: they run in sessions of their own, out of reach of the terminal's
    SIGINT."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[int | None, Box | None]] = {}
        self.stopping = False

    def add(self, key: int, pid: int | None, box: Box | None) -> None:
        with self._lock:
            self._running[key] = (pid, box)
            if self.stopping:
                _stop(pid, box)

    def discard(self, key: int) -> None:
        with self._lock:
            self._running.pop(key, None)

    def stop_all(self) -> None:
        with self._lock:
            self.stopping = True
            for pid, box in self._running.values():
                _stop(pid, box)


def _stop(pid: int | None, box: Box | None) -> None:
    """Kill a worker: its sandbox with everything in it, or (no sandbox) its session."""
    if box is not None:
        box.close()
    if pid is not None:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class Grader:
    """What a grading holds for its whole run: the fork server, whether it sandboxes, the
    folders no submission may open, and the workers running now."""

    def __init__(self, limits: Limits, *, sandbox: bool, watched: Sequence[str] = ()) -> None:
        self.limits = limits
        self.sandbox = sandbox
        self.watched = list(watched)
        self.workers = Workers()
        self.server = Server()
        self._jobs = itertools.count()

    def close(self) -> None:
        self.server.close()

    def run_one(self, sub: Submission) -> Graded:
        """One submission: its own folder and sandbox, a fresh process forked for it."""
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="mha-tui-grade-") as folder:
            report = self._judged(sub, Path(folder))
        report["module"] = sub.module or sub.model or report["module"]  # as given
        report["submission"] = sub.shown
        report["seconds"] = round(time.monotonic() - started, 2)
        return Graded(sub, report)

    def _judged(self, sub: Submission, folder: Path) -> dict[str, Any]:
        limits = self.limits
        log, result = folder / "log.txt", folder / "result.json"
        scratch = folder / "scratch"
        scratch.mkdir()
        number = next(self._jobs)
        request = worker_request(sub, limits)
        box = None
        if self.sandbox:
            try:
                box = open_box(read_only=_visible(sub, limits, folder), size=MAX_WRITE)
            except SandboxError as error:
                return unjudged(sub.module or sub.model or sub.shown, "sandbox",
                                f"could not grade: {error}")
        job = {"request": request, "log": str(log), "result": str(result),
               "sandbox": box.init if box else None, "scratch": str(scratch),
               "uid": _UID_BASE + (os.getpid() % 1000) * 1000 + number % 1000,
               "watched": self.watched}
        timed_out, status, left, error, filled = False, None, [], None, []
        job_id = self.server.send(job)
        self.workers.add(job_id, None, box)
        try:
            started = self.server.answer(job_id, "pid", 60)
            pid = started.get("pid") if started else None
            if pid is None:
                error = (started or {}).get("error", "the worker did not start within 60 s")
            else:
                self.workers.add(job_id, pid, box)
                ended = self._wait(job_id, limits.timeout)
                if ended is None:
                    timed_out = True
                    try:  # faulthandler prints where the forward is stuck, then it ends
                        os.kill(pid, signal.SIGABRT)
                    except (ProcessLookupError, PermissionError):
                        pass
                    ended = self.server.answer(job_id, "status", 2)
                    if ended is None:
                        _stop(pid, box)
                        ended = self.server.answer(job_id, "status", 10)
                if ended is not None:
                    status, left = ended.get("status"), ended.get("left", [])
                    error = ended.get("error")
            if box is not None and not timed_out:
                left = left or box.leftovers()
                filled = box.filled(MAX_WRITE)
        finally:
            if box is not None:
                box.close()
            self.workers.discard(job_id)
            self.server.forget(job_id)
        log_text = log.read_text("utf-8", "replace") if log.exists() else ""
        report = None
        if status == 0 and not timed_out and result.is_file():
            try:
                report = json.loads(result.read_text("utf-8"))
            except ValueError:
                report = None
        if report is None:
            report = _why_no_verdict(sub, limits, status, timed_out, log_text, error)
        tried = [f"filled {place} to its {MAX_WRITE >> 20} MB limit" for place in filled]
        if left:
            tried.insert(0, f"left {len(left)} process{'es' if len(left) > 1 else ''} running "
                         f"after its forward ({left[0][:80]}), stopped")
        if tried:
            said = report["diagnosis"]["message"] if report["diagnosis"] and \
                report["diagnosis"]["kind"] == "sandbox" else ""
            earlier = said.removeprefix("could not grade: it ")
            report = unjudged(sub.module or sub.model or sub.shown, "sandbox",
                              "could not grade: it " + "; ".join([*tried, *filter(None, [earlier])]))
        return report

    def _wait(self, job_id: int, timeout: float) -> dict[str, Any] | None:
        """The job's end, half a second at a time: once the grading is stopping (Ctrl-C),
        None at once (the caller then kills the worker)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ended = self.server.answer(job_id, "status", min(left, 0.5))
            if ended is not None:
                return ended
            if self.workers.stopping:
                return None


def grade(submissions: Sequence[Submission], limits: Limits, *, jobs: int = 1,
          done: Callable[[Graded], None] | None = None, sandbox: bool = False,
          watched: Sequence[str] = ()) -> list[Graded]:
    """Judge every submission, `jobs` at a time; the results in the order given. `done` is
    called (in this thread) as each one finishes: a progress bar, results written as they
    come. Interrupted (Ctrl-C), it kills every worker before the interruption goes on.
    `watched`: folders whose files no submission but their own may open (the class's)."""
    results: dict[int, Graded] = {}
    grader = Grader(limits, sandbox=sandbox, watched=watched)
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    stop = threading.Event()
    restore = _ctrl_c_sets(stop)
    try:
        futures = {pool.submit(grader.run_one, sub): i for i, sub in enumerate(submissions)}
        pending = set(futures)
        # Ctrl-C only sets `stop`, read here, where no lock is half taken. Never an unbounded
        # wait: Linux may hand the SIGINT to a pool thread, which does not wake a main thread
        # asleep on a lock.
        while pending and not stop.is_set():
            finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=futures.__getitem__):
                graded = future.result()
                results[futures[future]] = graded
                if done is not None:
                    done(graded)
        if stop.is_set():
            raise KeyboardInterrupt
    except BaseException:
        restore()  # a second Ctrl-C now interrupts the stopping itself
        grader.workers.stop_all()
        pool.shutdown(wait=True, cancel_futures=True)
        grader.close()
        raise
    finally:
        restore()
    pool.shutdown()
    grader.close()
    return [results[i] for i in range(len(submissions))]


def _ctrl_c_sets(stop: threading.Event) -> Callable[[], None]:
    """While grading, SIGINT sets `stop` instead of raising KeyboardInterrupt wherever the
    main thread is (inside a lock's acquire, it left the lock taken and a worker thread
    waiting on it forever). Returns what puts the handler back (idempotent). Outside the
    main thread (no handler can be set there), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = signal.getsignal(signal.SIGINT)
    if before in (signal.SIG_IGN, None):  # ignored (or set outside Python): leave it so
        return lambda: None
    signal.signal(signal.SIGINT, lambda number, frame: stop.set())
    put_back: list[bool] = []

    def restore() -> None:
        if not put_back:
            put_back.append(True)
            signal.signal(signal.SIGINT, before)

    return restore


def _visible(sub: Submission, limits: Limits, folder: Path) -> list[tuple[str, str]]:
    """What a submission's sandbox sees besides the system and Python, read-only: a copy of its
    own file at the file's own path (so that tracebacks and the diagnosis name it), and
    --weights."""
    shown: list[tuple[str, str]] = []
    if sub.file:
        real = str(Path(sub.file).resolve())
        copy = folder / "submission.py"
        try:
            shutil.copyfile(real, copy)
            copy.chmod(0o644)
            folder.chmod(0o755)
            shown.append((str(copy), real))
        except OSError:
            pass  # the worker says it cannot read it, in load's words
    if weights := limits.request.source.weights:
        real = str(Path(weights).resolve())
        shown.append((real, real))
    return shown


def worker_request(sub: Submission, limits: Limits) -> dict[str, Any]:
    """`check`'s Request for one submission (records/request.py), as JSON, with the worker's
    limits beside it; paths made absolute, since the worker runs in a folder of its own."""
    request = limits.request.of_module(sub.model, None if sub.module is None
                                       else _absolute(sub.module))
    if (weights := request.source.weights) is not None:
        request = replace(request, source=replace(request.source,
                                                  weights=str(Path(weights).resolve())))
    return {**request.as_json(), "memory": limits.memory, "processes": limits.processes,
            "max_write": MAX_WRITE}


def _absolute(module: str) -> str:
    """A file spec made absolute: the worker runs in a folder of its own."""
    where, _, cls = module.rpartition(":")
    if where.endswith(".py") or os.sep in where:
        return f"{Path(where).resolve()}:{cls}"
    return module


def _why_no_verdict(sub: Submission, limits: Limits, status: int | None, timed_out: bool,
                    log: str, error: str | None) -> dict[str, Any]:
    """A worker that left no result: say what ended it and, if the log says, at which line."""
    module = sub.module or sub.model or sub.shown
    file, line = str(Path(sub.file).resolve()) if sub.file else "", _line_in(log, sub.file)
    if timed_out:
        return unjudged(module, "timeout", f"did not finish within {limits.timeout:g} s: "
                        "a forward that never returns?", file=file, line=line)
    if status is None:
        return unjudged(module, "internal_error", f"mha-tui could not run it: {error}",
                        file=file, line=line)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number == signal.SIGXFSZ:
            return unjudged(module, "output_limit", f"wrote more than {MAX_WRITE >> 20} MB "
                            "(prints or files) and was stopped", file=file, line=line)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return unjudged(module, "crashed", f"the Python interpreter crashed ({name})",
                        file=file, line=line)
    code = os.WEXITSTATUS(status)
    if "MemoryError" in log:
        return unjudged(module, "out_of_memory", "ran out of memory", file=file, line=line)
    last = next((li.strip() for li in reversed(log.splitlines()) if li.strip()), "")
    said = f": {last[:200]}" if last else ""
    return unjudged(module, "exited", f"the process exited with code {code} before a "
                    f"verdict (os._exit or sys.exit in the module?){said}", file=file, line=line)


def _line_in(log: str, file: str | None) -> int:
    """The innermost line of the submission's file in faulthandler's stack (most recent call
    first), 0 when it is not there."""
    if not file:
        return 0
    target = os.path.realpath(file)
    for match in _FRAME.finditer(log):
        if os.path.realpath(match["file"]) == target:
            return int(match["line"])
    return 0
