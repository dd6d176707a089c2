"""Grading a class: `mha-tui check FOLDER --class C`, each submission in its own process.

A forward that hangs, calls sys.exit, aborts the interpreter or eats memory is "could not
judge" with its reason and line; the others are still judged; one submission cannot change
what another sees. No timing assertions: the time limits are the subject, not a benchmark.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mha_tui.config import Config
from mha_tui.grade import GradeError, Limits, Submission, find_submissions, is_batch
from mha_tui.grade.gradebook import csv_rows
from mha_tui.grade.pool import grade
from mha_tui.judge.outcome import COULD_NOT_JUDGE, EQUIVALENT, NOT_EQUIVALENT, worst
from mha_tui.records.request import Request

from .conftest import ROOT, run_cli, sigint_as_a_terminal_gives_it

MISTAKES = Path(ROOT, "tests", "fixtures", "mistakes")
FIRST_LINE = "        B, T, C = x.shape\n"  # the first line of correct.py's forward


def _submission(folder: Path, name: str, line: str | None = None) -> int:
    """correct.py with `line` added at the top of its forward; returns that line's number."""
    source = (MISTAKES / "correct.py").read_text()
    if line is not None:
        source = source.replace(FIRST_LINE, f"{FIRST_LINE}        {line}\n", 1)
    (folder / f"{name}.py").write_text(source)
    return source.splitlines().index(f"        {line}") + 1 if line else 0


@pytest.fixture(scope="module")
def classroom(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    folder = tmp_path_factory.mktemp("submissions")
    lines = {
        "hangs": _submission(folder, "hangs", "while True: pass"),
        "aborts": _submission(folder, "aborts", "import os; os.abort()"),
        "exits": _submission(folder, "exits", "import sys; sys.exit(3)"),
        "hoards": _submission(folder, "hoards", "hoard = bytearray(1 << 30)"),  # 1 GB
        "right": _submission(folder, "right"),
    }
    shutil.copy(MISTAKES / "no_scale.py", folder / "wrong.py")
    (folder / "__init__.py").write_text("")  # not a submission
    return folder, lines


def _by_name(rows: list[dict]) -> dict[str, dict]:
    return {Path(row["submission"]).stem: row for row in rows}


def test_a_folder_is_graded_one_process_each_and_the_worst_verdict_is_the_exit_code(
        classroom: tuple[Path, dict[str, int]]) -> None:
    """One command over a folder holding a hanging, an aborting, an exiting, a memory-eating,
    a correct and a wrong submission: every one gets a row, and it ends."""
    folder, lines = classroom
    result = run_cli("check", str(folder), "--class", "MultiHeadAttention", "--format", "csv",
                     "--timeout", "15", "--memory", "256", "--jobs", "2", timeout=120)
    assert result.returncode == 3, result.stderr.decode()  # could not judge is the worst
    assert result.stderr == b""  # no progress bar: stderr is not a terminal
    rows = list(csv.DictReader(io.StringIO(result.stdout.decode())))
    assert [Path(r["submission"]).name for r in rows] == sorted(
        f"{name}.py" for name in [*lines, "wrong"])  # the folder's order, __init__.py left out
    got = _by_name(rows)
    assert {name: row["verdict"] for name, row in got.items()} == {
        "aborts": COULD_NOT_JUDGE, "exits": COULD_NOT_JUDGE, "hangs": COULD_NOT_JUDGE,
        "hoards": COULD_NOT_JUDGE, "right": EQUIVALENT, "wrong": NOT_EQUIVALENT}
    assert {name: row["exit_code"] for name, row in got.items()} == {
        "aborts": "3", "exits": "3", "hangs": "3", "hoards": "3", "right": "0", "wrong": "1"}
    assert got["hangs"]["diagnosis"] == "timeout" and "15 s" in got["hangs"]["message"]
    assert got["aborts"]["diagnosis"] == "crashed" and "SIGABRT" in got["aborts"]["message"]
    assert got["exits"]["diagnosis"] == "exited" and "sys.exit(3)" in got["exits"]["message"]
    assert "MemoryError" in got["hoards"]["message"]
    for name in ("hangs", "aborts", "exits", "hoards"):  # the learner's own line, found
        assert got[name]["line"] == str(lines[name]), name
        assert got[name]["file"].endswith(f"{name}.py")
    assert got["wrong"]["diagnosis"] == "not_scaled" and got["wrong"]["stage"] == "scale"
    assert got["right"]["diagnosis"] == "" and got["right"]["line"] == ""


def test_json_for_a_gradebook_and_the_table(classroom: tuple[Path, dict[str, int]]) -> None:
    folder, _ = classroom
    files = [str(folder / f"{name}.py") for name in ("exits", "right", "wrong")]
    result = run_cli("check", *files, "--class", "MultiHeadAttention", "--format", "json",
                     timeout=120)
    assert result.returncode == 3
    data = json.loads(result.stdout)
    assert [d["verdict"] for d in data] == [COULD_NOT_JUDGE, EQUIVALENT, NOT_EQUIVALENT]
    assert [d["equivalent"] for d in data] == [False, True, False]
    assert data[1]["stages"] and all(stage["ok"] is not False for stage in data[1]["stages"])
    assert data[2]["diagnosis"]["kind"] == "not_scaled"
    assert data[2]["diagnosis"]["stage"] == "scale"
    assert data[0]["diagnosis"]["kind"] == "exited"


def test_the_text_table_says_each_verdict_and_why_it_could_not_judge(
        classroom: tuple[Path, dict[str, int]]) -> None:
    folder, _ = classroom
    files = [str(folder / f"{name}.py") for name in ("exits", "right")]
    result = run_cli("check", *files, "--class", "MultiHeadAttention", "--width", "120",
                     timeout=120)
    assert result.returncode == 3
    text = result.stdout.decode()
    exits = next(i for i, line in enumerate(text.splitlines()) if "exits.py" in line)
    assert "could not judge" in text.splitlines()[exits]
    assert "the module called sys.exit(3)" in text.splitlines()[exits + 1]
    assert "2 modules: 1 equivalent, 1 could not judge" in text


POLLUTER = '''
import torch

torch.Tensor.masked_fill = lambda self, mask, value: self  # every later mask does nothing
open("left_behind.txt", "w").write("x")
'''


def test_a_submission_cannot_change_what_another_sees(tmp_path: Path) -> None:
    """A submission that patches torch and writes a file, graded before and after a correct
    one: the correct one's verdict is the same in both orders."""
    _submission(tmp_path, "right")
    source = (tmp_path / "right.py").read_text()
    (tmp_path / "patches.py").write_text(POLLUTER + source)
    limits = Limits(Request(Config("I love AI !")), timeout=60)
    right = Submission(shown="right", module=f"{tmp_path / 'right.py'}:MultiHeadAttention")
    patches = Submission(shown="patches", module=f"{tmp_path / 'patches.py'}:MultiHeadAttention")
    first = grade([patches, right], limits, jobs=1)
    second = grade([right, patches], limits, jobs=1)
    assert first[1].outcome == second[0].outcome == EQUIVALENT

    def same(report: dict) -> dict:
        return {k: v for k, v in report.items() if k != "seconds"}
    assert same(first[1].report) == same(second[0].report)
    assert not (tmp_path / "left_behind.txt").exists()  # each worker has a folder of its own


def test_finding_submissions(tmp_path: Path) -> None:
    for name in ("b.py", "a.py", "__init__.py", "notes.txt"):
        (tmp_path / name).write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text("")
    found = find_submissions([str(tmp_path)], "M")
    assert [s.module for s in found] == [f"{tmp_path}/a.py:M", f"{tmp_path}/b.py:M"]
    assert [s.shown for s in found] == [f"{tmp_path}/a.py", f"{tmp_path}/b.py"]
    globbed = find_submissions([f"{tmp_path}/**/*.py:Other"], None)
    assert [s.module for s in globbed] == [f"{tmp_path}/__init__.py:Other", f"{tmp_path}/a.py:Other",
                                           f"{tmp_path}/b.py:Other", f"{tmp_path}/sub/c.py:Other"]
    assert is_batch([str(tmp_path)]) and is_batch(["x/*.py"]) and not is_batch(["a.py:M"])
    with pytest.raises(GradeError, match=r"no \.py files"):
        find_submissions([str(_empty(tmp_path))], "M")
    with pytest.raises(GradeError, match=r"no \.py file matches"):
        find_submissions([f"{tmp_path}/*.pyx"], "M")
    with pytest.raises(GradeError, match=r"is a folder: give --class CLASS, the class to look "
                                         r"for in each of its \.py files$"):
        find_submissions([str(tmp_path)], None)  # not one of its files named as the culprit
    with pytest.raises(GradeError, match=r"is a pattern: give --class CLASS"):
        find_submissions([f"{tmp_path}/*.py"], None)
    with pytest.raises(GradeError, match=r"a\.py': name the class, as FILE\.py:Class"):
        find_submissions([f"{tmp_path}/a.py"], None)


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


@pytest.mark.parametrize("args", [
    ["--timeout", "0"], ["--jobs", "0"], ["--memory", "1"], ["--format", "xml"]])
def test_grading_options_are_checked_before_anything_runs(tmp_path: Path, args: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "mha_tui", "check", str(tmp_path), "--class",
                             "M", *args], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("args,said", [
    (["--class", "1abc"], "--class takes the name of a class; '1abc' is not one"),
    (["a.py:1abc"], "check takes FILE.py:Class or package.module:Class; '1abc' is not a class name")])
def test_a_bad_class_name_is_refused_in_checks_own_words(tmp_path: Path, args: list[str],
                                                         said: str) -> None:
    """check has no --module: a class name it cannot use names check's argument or --class
    (trial 2, finding 19)."""
    (tmp_path / "a.py").write_text("import torch\n")
    folder = [str(tmp_path)] if args[0] == "--class" else []
    result = subprocess.run([sys.executable, "-m", "mha_tui", "check", *folder, *args],
                            capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"mha-tui: error: {said}\n"


def test_outcomes_order_and_csv_columns() -> None:
    assert worst([EQUIVALENT, NOT_EQUIVALENT]) == NOT_EQUIVALENT
    assert worst([NOT_EQUIVALENT, COULD_NOT_JUDGE, EQUIVALENT]) == COULD_NOT_JUDGE
    assert worst([]) == EQUIVALENT
    row = csv_rows([{"module": "m.py:M", "verdict": NOT_EQUIVALENT,
                     "diagnosis": {"kind": "not_scaled", "file": "", "line": 7,
                                   "message": "x", "stage": "scale"}}])[0]
    assert row == {"student": "m", "submission": "m.py:M", "verdict": NOT_EQUIVALENT,
                   "exit_code": 1, "points": "0", "max_points": "15", "project": "0",
                   "view": "0", "transpose": "0", "scores": "0", "scale": "0", "mask": "0",
                   "softmax": "0", "attend": "0", "concat": "0", "w_o": "0", "end_to_end": "0",
                   "stage": "scale", "file": "", "line": 7, "diagnosis": "not_scaled",
                   "message": "x"}


def test_help_documents_the_exit_codes() -> None:
    result = run_cli("check", "--help", env={"_TYPER_FORCE_DISABLE_TERMINAL": "1"})
    text = " ".join(result.stdout.decode().split())
    for said in ("0: equivalent", "1: NOT equivalent", "3: could not judge", "2: usage error"):
        assert said in text
    for flag in ("--timeout", "--jobs", "--memory", "csv"):
        assert flag in text
    usage = result.stdout.decode().splitlines()[0]
    assert "check [OPTIONS] [SUBMISSION]" in usage and "SUBMISSION..." not in usage


def test_one_module_whose_forward_raises_is_could_not_judge_exit_3() -> None:
    """The three-way verdict for a single module too (it was "NOT equivalent", exit 1)."""
    from typer.testing import CliRunner

    from mha_tui.cli import app

    result = CliRunner().invoke(app, ["check", f"{MISTAKES / 'crash.py'}:MultiHeadAttention"])
    assert result.exit_code == 3
    assert result.output.splitlines()[0].endswith("could not judge")
    as_json = CliRunner().invoke(app, ["check", f"{MISTAKES / 'crash.py'}:MultiHeadAttention",
                                       "--format", "json"])
    assert json.loads(as_json.stdout)["verdict"] == COULD_NOT_JUDGE


def test_the_grader_itself_never_imports_torch() -> None:
    probe = ("import sys, mha_tui.grade.pool, mha_tui.grade.session, mha_tui.grade.options\n"
             "import mha_tui.grade.lms, mha_tui.grade.feedback, mha_tui.grade.summary\n"
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def _spinning(tmp_path: Path, names: tuple[str, ...] = ("one", "two")) -> Path:
    """Submissions that each say they are inside the forward (a file `started` in their own
    working folder, the sandbox's scratch), then spin."""
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name in names:
        spins = (f"{FIRST_LINE}        open('started', 'w').close()\n"
                 f"        while True:\n            pass\n")
        (folder / f"{name}.py").write_text(
            (MISTAKES / "correct.py").read_text().replace(FIRST_LINE, spins, 1))
    return folder


def _worker(pid: int) -> bool:
    """pid is a live (not zombie) grading worker: the fork server names them."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return comm == "mha-tui-worker" and state != "Z"


def _workers_of(grader: int) -> list[int]:
    """The grading workers descending from the grader process."""
    import os

    parents: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text()
                                    .rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue

    def descends(pid: int) -> bool:
        for _ in range(20):
            pid = parents.get(pid, 0)
            if pid == grader:
                return True
            if pid <= 1:
                return False
        return False

    return [pid for pid in parents if descends(pid) and _worker(pid)]


def _inside(pids: list[int], count: int) -> bool:
    """`count` workers, each inside the forward (its `started` file written)."""
    return len(pids) == count and all(Path(f"/proc/{pid}/cwd/started").exists() for pid in pids)


def _within(seconds: float, ready: Callable[[], bool],
            running: subprocess.Popen[bytes] | None = None) -> bool:
    """Wait until ready() or the guard runs out (a hang guard, not a timing assertion);
    running: give up as soon as that process has ended."""
    import time

    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline or (running is not None and running.poll() is not None):
            return ready()
        time.sleep(0.2)
    return True


def _kill_leftovers(workers: list[int], process: subprocess.Popen[bytes] | None = None) -> None:
    """A failed run leaves nothing behind: the grader, then its workers."""
    import os
    import signal

    if process is not None and process.poll() is None:
        process.kill()
        process.wait()
    for pid in workers:
        if _worker(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _grading(folder: Path) -> subprocess.Popen[bytes]:
    """`mha-tui check FOLDER` with two jobs and an hour's --timeout, SIGINT as a terminal
    gives it (see `sigint_as_a_terminal_gives_it`: the hang seen once at load 7)."""
    return subprocess.Popen(
        [sys.executable, "-m", "mha_tui", "check", str(folder), "--class", "MultiHeadAttention",
         "--timeout", "3600", "--jobs", "2"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, preexec_fn=sigint_as_a_terminal_gives_it)


def _sigint_ignored(pid: int) -> bool:
    import signal

    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    return False


def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    """Workers run in sessions (and sandboxes) of their own (the terminal's SIGINT does not
    reach them): an interrupted grading kills them rather than waiting out their time limit.

    Robust under load: the interrupt is sent once both workers are inside the forward (each
    writes a file there, then spins), not when their processes merely appear; the guards are
    generous wall-clock bounds, never timing assertions, and each fails the test when it runs
    out. It can still fail: a grader that waited for its workers would wait out their
    hour-long --timeout, far past the guard."""
    import signal

    folder = _spinning(tmp_path)
    process = _grading(folder)
    workers: list[int] = []
    try:
        def both_inside() -> bool:
            workers[:] = _workers_of(process.pid)
            return _inside(workers, 2)

        inside = _within(600, both_inside, process)
        assert inside, process.stderr.read().decode() if process.poll() is not None else \
            "the workers did not reach the forward within 600 s"
        assert not _sigint_ignored(process.pid), "the grader ignores SIGINT"
        for pid in workers:  # forked from the fork server (torch imported once), not new Pythons
            assert b"mha_tui.grade.server" in Path(f"/proc/{pid}/cmdline").read_bytes()
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=300)  # far below the workers' 3600 s
        except subprocess.TimeoutExpired:
            pytest.fail("the grader was still running 300 s after Ctrl-C")
        assert process.returncode == 130, err.decode()
        assert _within(60, lambda: not any(map(_worker, workers))), workers
    finally:
        _kill_leftovers(workers, process)


def test_workers_end_when_the_grader_is_killed(tmp_path: Path) -> None:
    """A grader that cannot act (SIGKILL, or SIGTERM, which it does not catch) leaves no
    worker spinning until its hour-long --timeout: the fork server, its children and the
    sandboxes die with their parent."""
    import signal

    folder = _spinning(tmp_path)
    process = _grading(folder)
    workers: list[int] = []
    try:
        def both_inside() -> bool:
            workers[:] = _workers_of(process.pid)
            return _inside(workers, 2)

        assert _within(600, both_inside, process), "the workers did not reach the forward"
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert _within(120, lambda: not any(map(_worker, workers))), workers
    finally:
        _kill_leftovers(workers, process)


def test_a_stopping_grading_kills_a_worker_its_stop_missed(tmp_path: Path) -> None:
    """Once the grading is stopping, a worker's own thread kills it too: a second Ctrl-C in
    the middle of stop_all cannot leave one running (and the grader waiting on it)."""
    import os
    import threading

    from mha_tui.grade.pool import Grader

    folder = _spinning(tmp_path, ("one",))
    limits = Limits(Request(Config("I love AI !")), timeout=3600)
    grader = Grader(limits, sandbox=False)
    done: list[object] = []
    sub = Submission(shown="one", module=f"{folder / 'one.py'}:MultiHeadAttention")
    thread = threading.Thread(target=lambda: done.append(grader.run_one(sub)), daemon=True)
    thread.start()
    workers: list[int] = []
    try:
        def inside() -> bool:
            workers[:] = _workers_of(os.getpid())
            return _inside(workers, 1) or not thread.is_alive()

        assert _within(600, inside), "the worker did not reach the forward within 600 s"
        grader.workers.stopping = True  # as stop_all's first step; its kill never came
        thread.join(120)
        assert not thread.is_alive(), "run_one still waited 120 s after the grading stopped"
        assert _within(60, lambda: not any(map(_worker, workers))), workers
    finally:
        grader.close()
        _kill_leftovers(workers)


def test_a_print_loop_cannot_fill_the_disk(tmp_path: Path) -> None:
    """The worker's files (its log holds the learner's prints) stop growing at MAX_WRITE: the
    print fails, the forward raises, and the submission is could not judge, at its line."""
    line = _submission(tmp_path, "loud", 'while True: print("x" * 65536)')
    limits = Limits(Request(Config("I love AI !")), timeout=60)
    (graded,) = grade([Submission(shown="loud", module=f"{tmp_path / 'loud.py'}:MultiHeadAttention")],
                      limits)
    assert graded.outcome == COULD_NOT_JUDGE
    assert "File too large" in graded.report["diagnosis"]["message"]
    assert graded.report["diagnosis"]["line"] == line


def test_a_ctrl_c_taken_by_another_thread_still_stops_the_grading(tmp_path: Path) -> None:
    """Linux hands a process's SIGINT to any of its threads that does not block it; one that
    lands on a pool thread must still reach the grading, which kills its workers and ends
    (it slept on, on a lock, until the submission's 3600 s ran out: 1 run in 14 of a script
    that sent SIGINT just after a result)."""
    folder = _spinning(tmp_path, ("one",))
    script = f"""
import os, signal, sys, threading, time
from pathlib import Path
from mha_tui.config import Config
from mha_tui.grade import Limits, Submission
from mha_tui.grade.pool import grade
from mha_tui.records.request import Request

def interrupt_from_this_thread():
    while not Path({str(tmp_path / 'go')!r}).exists():  # the test saw the worker in its forward
        time.sleep(0.2)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # not the main thread

threading.Thread(target=interrupt_from_this_thread, daemon=True).start()
try:
    grade([Submission(shown='one', module={str(folder / 'one.py')!r} + ':MultiHeadAttention')],
          Limits(Request(Config('I love AI !')), timeout=3600))
except KeyboardInterrupt:
    print('interrupted')
"""
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, preexec_fn=sigint_as_a_terminal_gives_it)
    workers: list[int] = []
    try:
        def inside() -> bool:
            workers[:] = _workers_of(process.pid)
            return _inside(workers, 1)

        assert _within(600, inside, process), "the worker did not reach the forward within 600 s"
        (tmp_path / "go").touch()
        try:
            out, err = process.communicate(timeout=300)  # a hang guard, not a timing assertion
        except subprocess.TimeoutExpired:
            raise AssertionError("the grading slept through a SIGINT another thread took") from None
        assert out.decode().split() == ["interrupted"], err.decode()[-2000:]
        assert _within(60, lambda: not any(map(_worker, workers))), workers
    finally:
        _kill_leftovers(workers, process)
