"""The fork server: torch and mha-tui imported once, a fresh process forked for each submission.

`python -m mha_tui.grade.server` is started by the grader (pool.py) with a clean environment.
It reads one job a line on standard input (JSON: id, request, log and result paths, the
sandbox's init pid or none) and answers on standard output, one JSON object a line:
`{"id": N, "pid": P}` once the worker runs (P as the grader sees it: for SIGABRT on a timeout),
then `{"id": N, "status": S, "left": [...]}` with the worker's wait status and, without a
sandbox, the processes it left behind (killed). Several jobs run at once: the server only
forks and reaps.

Per job: the server forks a child; the child joins the sandbox (sandbox.enter) and forks the
worker (worker.run), which is so in the sandbox's pid namespace; the child waits for it and
reports. The server ends (and, without a sandbox, kills its workers' sessions) when its
standard input closes or its parent dies.

Never imports rich, textual or typer.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _child(job: dict[str, Any], report_w: int) -> None:
    """The server's child for one job: into the sandbox, fork the worker, wait, report.
    Never returns."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        log_fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        result_fd = os.open(job["result"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        if job.get("sandbox"):
            from .sandbox import enter

            enter(job["sandbox"])
        else:
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # what the learner's code leaves comes to us
        pid = os.fork()
        if pid == 0:
            os.close(report_w)
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            from .worker import run

            run(job, log_fd, result_fd)  # never returns
        os.close(log_fd)
        os.close(result_fd)
        os.write(report_w, f"pid {pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        left = [] if job.get("sandbox") else _kill_orphans()
        os.write(report_w, (json.dumps({"status": status, "left": left}) + "\n").encode())
    except BaseException as error:  # said to the grader as this job's failure
        try:
            os.write(report_w, (json.dumps({"error": f"{type(error).__name__}: {error}"})
                                + "\n").encode())
        except OSError:
            pass
        code = 1
    os._exit(code)


def _kill_orphans() -> list[str]:
    """Without a sandbox: the processes the worker left (they came to this subreaper),
    named and killed, until none is left."""
    named: list[str] = []
    me = os.getpid()
    for _ in range(100):
        try:
            children = Path(f"/proc/{me}/task/{me}/children").read_text().split()
        except OSError:
            return named
        if not children:
            return named
        for pid in map(int, children):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
                if cmd and len(named) < 5:
                    named.append(cmd.decode("utf-8", "replace"))
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
    return named


def serve() -> None:
    from .worker import preload

    sys.dont_write_bytecode = True
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    preload()
    out = sys.stdout.buffer
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    pending = b""
    reports: dict[int, tuple[int, bytes, bool]] = {}  # read end -> (job, bytes, done)
    workers: dict[int, int] = {}  # job id -> worker pid (no sandbox: its session)

    def say(message: dict[str, Any]) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    out.write(b'{"ready": true}\n')
    out.flush()
    while True:
        readable, _, _ = select.select([stdin, wake_r, *reports], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            while True:  # reap the children; what they reported is read below
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
        if stdin in readable:
            chunk = os.read(stdin.fileno(), 1 << 20)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                job = json.loads(line)
                report_r, report_w = os.pipe()
                if os.fork() == 0:
                    os.close(report_r)
                    _child(job, report_w)
                os.close(report_w)
                reports[report_r] = (job["id"], b"", False)
        for fd in [fd for fd in readable if fd in reports]:
            job_id, got, done = reports[fd]
            chunk = os.read(fd, 65536)
            got += chunk
            while b"\n" in got:
                line, got = got.split(b"\n", 1)
                if line.startswith(b"pid "):
                    workers[job_id] = int(line[4:])
                    say({"id": job_id, "pid": workers[job_id]})
                else:
                    workers.pop(job_id, None)
                    done = True
                    say({"id": job_id, **json.loads(line)})
            if chunk:
                reports[fd] = (job_id, got, done)
                continue
            os.close(fd)
            del reports[fd]
            if not done:
                workers.pop(job_id, None)
                say({"id": job_id, "error": "the fork server's child ended without a word"})
    for pid in workers.values():  # the grader is gone: so are its workers
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    serve()
