"""Grading a class: every submission judged in a process of its own, with a time limit.

`mha-tui check submissions/ --class MultiHeadAttention` (a folder, a glob or files) runs
`python -m mha_tui.grade_worker` once per submission, a few at a time. A worker that does
not finish in time is stopped (its whole process group) and asked, by SIGABRT, where it
was; one that exits, crashes or runs out of memory leaves no result: each becomes "could
not judge" with the reason and, where the interpreter said it, the learner's line. A fresh
process, folder and environment for each submission: none can change what another sees,
and the order they are given in changes nothing but the order of the rows.

Never imports torch (the workers do), rich, textual or typer: the CLI draws the table and
the progress bar from what this module returns.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..records.verdict import Diagnosis, Verdict
from .outcome import COULD_NOT_JUDGE, EXIT_CODES, Outcome

DEFAULT_TIMEOUT = 20.0  # seconds per submission, torch's import included
DEFAULT_MEMORY = 2048 << 20  # bytes a submission may map beyond what mha-tui itself uses
MAX_WRITE = 64 << 20  # bytes any one file of a worker (its log: the learner's prints) may hold
_GLOB = re.compile(r"[*?\[]")
# faulthandler's lines: `  File "/path/sub.py", line 28 in forward`
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in ', re.MULTILINE)


class GradeError(Exception):
    """A usage error before any submission runs (one line, exit code 2)."""


@dataclass(frozen=True)
class Submission:
    """One module to grade: a learner's FILE.py:Class (or package.module:Class), or a
    tutorial's --model NAME. `shown` is how the table names it."""

    shown: str
    module: str | None = None
    model: str | None = None

    @property
    def file(self) -> str | None:
        where = (self.module or "").rpartition(":")[0]
        return where if where.endswith(".py") else None


@dataclass(frozen=True)
class Limits:
    """What every submission is run with: the check's sizes and the grading limits."""

    sentence: str
    embed_dim: int
    heads: int
    seed: int
    causal: bool
    max_seq_len: int
    init: tuple[str, ...] = ()  # --init texts, parsed again by the worker
    weights: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    memory: int = DEFAULT_MEMORY
    rotary: bool = False  # --expect rotary
    window: int | None = None  # --window N
    alibi: bool = False  # --expect alibi
    rotary_base: float = 10000.0  # --rotary-base


@dataclass(frozen=True)
class Graded:
    """A submission's result: the verdict's JSON object, as `check --format json` gives it
    for one module, with `verdict` one of the three outcomes."""

    submission: Submission
    report: dict[str, Any]

    @property
    def outcome(self) -> Outcome:
        return self.report["verdict"]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]


def is_batch(specs: Sequence[str]) -> bool:
    """A folder or a glob among the specs: grading, even when it holds one file."""
    return any(Path(spec.rpartition(":")[0] or spec).is_dir() or _GLOB.search(spec)
               for spec in specs)


def find_submissions(specs: Sequence[str], class_name: str | None) -> list[Submission]:
    """FILE.py[:Class], package.module:Class, a folder (its *.py files) or a glob, in the
    order given; a folder's and a glob's files sorted by name. Raises GradeError."""
    found: list[Submission] = []
    for spec in specs:
        where, sep, cls = spec.rpartition(":")
        if not sep or "/" in cls or cls.endswith(".py") or cls.startswith("*"):
            where, cls = spec, ""
        cls = cls or class_name or ""
        if Path(where).is_dir():
            files = sorted(str(p) for p in Path(where).glob("*.py") if p.name != "__init__.py")
            if not files:
                raise GradeError(f"{spec!r}: no .py files in this folder")
        elif _GLOB.search(where):
            files = sorted(glob.glob(where, recursive=True))
            files = [f for f in files if f.endswith(".py") and Path(f).is_file()]
            if not files:
                raise GradeError(f"{spec!r}: no .py file matches this pattern")
        else:
            files = [where]
        if not cls and where != files[0]:  # a folder or a pattern: one class for all its files
            raise GradeError(f"{spec!r} is a {'folder' if Path(where).is_dir() else 'pattern'}: "
                             "give --class CLASS, the class to look for in each of its .py files")
        for file in files:
            if not cls:
                raise GradeError(f"{file!r}: name the class, as FILE.py:Class, or give "
                                 "--class CLASS for every file")
            shown = file if class_name and cls == class_name else f"{file}:{cls}"
            found.append(Submission(shown=shown, module=f"{file}:{cls}"))
    return found


def unjudged(module: str, kind: str, message: str, *, file: str = "", line: int = 0,
             stage: str = "") -> dict[str, Any]:
    """The JSON object of a submission that could not be judged, shaped as a verdict's."""
    from .report import verdict_json

    report = verdict_json(Verdict(module, False, (), Diagnosis(kind, file, line, message, stage)))
    report["verdict"] = COULD_NOT_JUDGE
    return report


class Workers:
    """The workers running now, so that an interrupted grading (Ctrl-C) stops them all at
    once: they run in sessions of their own, out of reach of the terminal's SIGINT."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self.stopping = False

    def add(self, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._running.add(process)
            if self.stopping:
                _stop(process)

    def discard(self, process: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._running.discard(process)

    def stop_all(self) -> None:
        with self._lock:
            self.stopping = True
            for process in self._running:
                _stop(process)


def grade(submissions: Sequence[Submission], limits: Limits, *, jobs: int = 1,
          done: Callable[[Graded], None] | None = None) -> list[Graded]:
    """Judge every submission, `jobs` at a time; the results in the order given. `done` is
    called (in this thread) as each one finishes, for a progress bar. Interrupted (Ctrl-C),
    it kills every worker before the interruption goes on."""
    results: dict[int, Graded] = {}
    workers = Workers()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {pool.submit(run_one, sub, limits, workers): i
                   for i, sub in enumerate(submissions)}
        for future in as_completed(futures):
            graded = future.result()
            results[futures[future]] = graded
            if done is not None:
                done(graded)
    except BaseException:
        workers.stop_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return [results[i] for i in range(len(submissions))]


def _worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MHA_TUI_")}
    # This mha_tui, whether installed or run from a checkout (the worker's folder is fresh).
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # several workers share the cores; tensors are tiny
    env["PYTHONFAULTHANDLER"] = "1"  # a crash or SIGABRT prints the Python stack to the log
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ left in the submissions' folder
    return env


def _request(sub: Submission, limits: Limits) -> str:
    return json.dumps({
        "module": None if sub.module is None else _absolute(sub.module), "model": sub.model,
        "sentence": limits.sentence, "embed_dim": limits.embed_dim, "heads": limits.heads,
        "seed": limits.seed, "causal": limits.causal, "max_seq_len": limits.max_seq_len,
        "init": list(limits.init), "weights": None if limits.weights is None
        else str(Path(limits.weights).resolve()), "memory": limits.memory,
        "rotary": limits.rotary, "window": limits.window,
        "alibi": limits.alibi, "rotary_base": limits.rotary_base, "max_write": MAX_WRITE,
        "grader": os.getpid(),  # the worker ends itself once this process is gone
    })


def _absolute(module: str) -> str:
    """A file spec made absolute: the worker runs in a folder of its own."""
    where, _, cls = module.rpartition(":")
    if where.endswith(".py") or os.sep in where:
        return f"{Path(where).resolve()}:{cls}"
    return module


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Kill the worker's whole process group (a submission's own children too)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(process: subprocess.Popen[bytes], timeout: float, workers: Workers | None) -> int:
    """process.wait(timeout), half a second at a time: once the grading is stopping (Ctrl-C),
    this worker is killed here too, whatever happened to stop_all's own kill (a second Ctrl-C
    in the middle of it)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(process.args, timeout)
        try:
            return process.wait(timeout=min(left, 0.5))
        except subprocess.TimeoutExpired:
            if workers is not None and workers.stopping:
                _stop(process)
                return process.wait()


def run_one(sub: Submission, limits: Limits, workers: Workers | None = None) -> Graded:
    """One submission in a fresh process, folder and session."""
    with tempfile.TemporaryDirectory(prefix="mha-tui-grade-") as folder:
        result, log_path = Path(folder, "result.json"), Path(folder, "log.txt")
        timed_out = False
        started = time.monotonic()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "mha_tui.grade_worker", _request(sub, limits), str(result)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=folder, env=_worker_env(),
                start_new_session=True)
            if workers is not None:
                workers.add(process)
            try:
                code = _wait(process, limits.timeout, workers)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:  # faulthandler prints where the forward is stuck, then it ends
                    os.kill(process.pid, signal.SIGABRT)
                    code = process.wait(timeout=2)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    _stop(process)
                    code = process.wait()
            finally:
                _stop(process)
                if workers is not None:
                    workers.discard(process)
        seconds = time.monotonic() - started
        log_text = log_path.read_text("utf-8", "replace")
        report = None
        if result.is_file() and not timed_out:
            try:
                report = json.loads(result.read_text("utf-8"))
            except ValueError:
                report = None
        if report is None:
            report = _why_no_verdict(sub, limits, code, timed_out, log_text)
    report["module"] = sub.module or sub.model or report["module"]  # as given, as one check says it
    report["submission"] = sub.shown
    report["seconds"] = round(seconds, 2)
    return Graded(sub, report)


def _why_no_verdict(sub: Submission, limits: Limits, code: int, timed_out: bool,
                    log: str) -> dict[str, Any]:
    """A worker that left no result: say what ended it and, if the log says, at which line."""
    module = sub.module or sub.model or sub.shown
    file, line = str(Path(sub.file).resolve()) if sub.file else "", _line_in(log, sub.file)
    if timed_out:
        return unjudged(module, "timeout", f"did not finish within {limits.timeout:g} s: "
                        "a forward that never returns?", file=file, line=line)
    if code == -signal.SIGXFSZ:
        return unjudged(module, "output_limit", f"wrote more than {MAX_WRITE >> 20} MB (prints "
                        "or files) and was stopped", file=file, line=line)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return unjudged(module, "crashed", f"the Python interpreter crashed ({name})",
                        file=file, line=line)
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


# ---------------------------------------------------------------------------- gradebook

CSV_COLUMNS = ("submission", "verdict", "exit_code", "stage", "file", "line", "diagnosis",
               "message")


def csv_rows(reports: Sequence[dict[str, Any]]) -> list[dict[str, object]]:
    """One row per module, for a spreadsheet, from the verdicts' JSON objects."""
    from .report import shown_path

    rows = []
    for report in reports:
        d = report.get("diagnosis") or {}
        rows.append({"submission": report.get("submission") or report["module"],
                     "verdict": report["verdict"], "exit_code": EXIT_CODES[report["verdict"]],
                     "stage": d.get("stage", ""), "file": shown_path(d.get("file") or ""),
                     "line": d.get("line") or "", "diagnosis": d.get("kind", ""),
                     "message": d.get("message", "")})
    return rows
