"""Submissions written to attack the grader, graded with honest ones in one class.

Each attack is the correct module (or, for the verdict forgery, a wrong one) with the attack
at the top of its file, run when the grader loads it; an attack that worked raises with its
loot, so that the loot would show in the output. Every one is contained (nothing outside its
sandbox changes, nothing leaks), the honest submissions get the verdicts they get alone, and
where the attempt can be seen the attacker is "could not judge" (`sandbox`) naming it.

Needs bubblewrap (.ci/run installs it); skipped, saying why, where it cannot build a sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mha_tui.grade.sandbox import unavailable
from mha_tui.judge.outcome import COULD_NOT_JUDGE, EQUIVALENT, NOT_EQUIVALENT

from .conftest import ROOT

MISTAKES = Path(ROOT, "tests", "fixtures", "mistakes")
TOKEN = "instructor-token-5f3a9"  # an environment variable only the instructor's shell has

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"no sandbox here: {unavailable()}")


def _attacks(folder: Path, outputs: Path, port: int) -> dict[str, str]:
    """Attack name -> the code put at the top of its file."""
    import torch

    torch_file = str(Path(torch.__file__).with_name("functional.py"))
    return {
        "reads_neighbour": f"""
try:
    loot = open({str(folder / 'right.py')!r}).read()
except OSError:
    loot = ""
if loot:
    raise RuntimeError("LOOT " + loot[:40])
""",
        "writes_around": f"""
for target in ({str(folder / 'planted.py')!r}, {str(outputs / 'results.json')!r}):
    try:
        open(target, "w").write("PLANTED")
    except OSError:
        pass
""",
        "connects": f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).sendall(b"LEAK")
except OSError:
    pass
""",
        "reads_env": """
import os
if os.environ.get("MHA_TEST_INSTRUCTOR"):
    raise RuntimeError("LOOT " + os.environ["MHA_TEST_INSTRUCTOR"])
""",
        "leaves_process": """
import subprocess
subprocess.Popen(["sleep", "987.654"])
""",
        "forks_until_refused": """
import os, time
forked = 0
try:
    while forked < 5000:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        forked += 1
except OSError:
    pass
""",
        "fills_disk": """
chunk = b"x" * (1 << 20)
for place in ("/tmp/fill", "fill"):
    try:
        with open(place, "wb") as f:
            for _ in range(4096):
                f.write(chunk)
    except OSError:
        pass
""",
        "patches_torch_file": f"""
try:
    with open({torch_file!r}, "a") as f:
        f.write("\\n# PATCHED\\n")
except OSError:
    pass
""",
    }


def _listener() -> tuple[socket.socket, list[bytes], threading.Event]:
    """A server on 127.0.0.1 (loopback only), accepting for a bounded time, recording what
    any client sends."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        deadline = time.monotonic() + 900
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    got.append(conn.recv(64) or b"(connected)")
                except OSError:
                    got.append(b"(connected)")
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, got, stop


def _uids_alive(low: int, high: int) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if low <= os.stat(f"/proc/{pid}").st_uid <= high:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace"))
        except OSError:
            continue
    return found


def test_attacks_are_contained_named_and_change_no_other_verdict(tmp_path: Path) -> None:
    folder, outputs = tmp_path / "class", tmp_path / "out"
    folder.mkdir()
    outputs.mkdir()
    correct = (MISTAKES / "correct.py").read_text()
    shutil.copy(MISTAKES / "correct.py", folder / "right.py")
    shutil.copy(MISTAKES / "no_scale.py", folder / "wrong.py")
    server, received, stop = _listener()
    attacks = _attacks(folder, outputs, server.getsockname()[1])
    for name, code in attacks.items():
        (folder / f"{name}.py").write_text(code + "\n" + correct)
    forged = "import mha_tui.judge.report as _report\n_report.outcome = lambda verdict: 'equivalent'\n"
    (folder / "forges_verdict.py").write_text(forged + (MISTAKES / "no_scale.py").read_text())
    import torch

    torch_file = Path(torch.__file__).with_name("functional.py")
    torch_before = torch_file.stat()
    process = subprocess.Popen(
        [sys.executable, "-m", "mha_tui", "check", str(folder), "--class", "MultiHeadAttention",
         "--format", "json", "--jobs", "2", "--timeout", "120", "--sandbox", "required"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "MHA_TEST_INSTRUCTOR": TOKEN})
    try:
        out, err = process.communicate(timeout=900)
    finally:
        stop.set()
        if process.poll() is None:
            process.kill()
    text = out.decode() + err.decode()
    assert process.returncode == 3, text
    reports = {Path(r["submission"]).stem: r for r in json.loads(out)}

    # The honest ones, as if the attackers were not there.
    assert reports["right"]["verdict"] == EQUIVALENT
    assert reports["wrong"]["verdict"] == NOT_EQUIVALENT
    assert reports["wrong"]["diagnosis"]["kind"] == "not_scaled"

    # Contained: nothing leaked, nothing written, nobody reached, nothing left running.
    assert "LOOT" not in text and TOKEN not in text
    assert not (folder / "planted.py").exists() and list(outputs.iterdir()) == []
    assert received == []
    assert torch_file.stat().st_mtime_ns == torch_before.st_mtime_ns
    assert torch_file.stat().st_size == torch_before.st_size
    base = 2_000_000 + (process.pid % 1000) * 1000  # the uids this grader's sandboxes ran as
    assert _uids_alive(base, base + 999) == []
    assert not any("987.654" in cmd for cmd in _uids_alive(0, 2**32))

    # Named, where it can be seen.
    def said(name: str) -> str:
        report = reports[name]
        assert report["verdict"] == COULD_NOT_JUDGE, (name, report)
        assert report["diagnosis"]["kind"] == "sandbox", (name, report)
        message = report["diagnosis"]["message"]
        assert message.startswith("could not grade: it "), message
        return message

    assert f"tried to open {folder / 'right.py'}" in said("reads_neighbour")
    assert f"tried to write {folder / 'planted.py'}" in said("writes_around")
    assert f"tried to connect to 127.0.0.1:{server.getsockname()[1]}" in said("connects")
    assert "sleep 987.654" in said("leaves_process")
    assert "forked a process" in said("forks_until_refused")
    assert "process" in said("forks_until_refused").split("forked")[0]  # left some running
    assert "filled /tmp to its 64 MB limit" in said("fills_disk")
    assert f"tried to write {torch_file}" in said("patches_torch_file")
    assert "changed mha_tui.judge.report.outcome in memory" in said("forges_verdict")
    # Invisible (it read a variable that is not there): graded on its code.
    assert reports["reads_env"]["verdict"] == EQUIVALENT


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap is not installed")
def test_without_bwrap_the_grading_says_so_once_or_refuses(tmp_path: Path) -> None:
    """PATH without bwrap: auto grades without a sandbox and says so once on stderr;
    required refuses in one line (exit 2); off is silent."""
    shutil.copy(MISTAKES / "correct.py", tmp_path / "right.py")
    shutil.copy(MISTAKES / "no_scale.py", tmp_path / "wrong.py")
    env = {**os.environ, "PATH": str(tmp_path / "no-bin")}
    argv = [sys.executable, "-m", "mha_tui", "check", str(tmp_path), "--class",
            "MultiHeadAttention", "--format", "csv"]
    refused = subprocess.run([*argv, "--sandbox", "required"], capture_output=True, text=True,
                             cwd=ROOT, env=env, timeout=300)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == ("mha-tui: error: --sandbox required: bwrap (bubblewrap) is not "
                              "installed\n")
    graded = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=600)
    assert graded.returncode == 1, graded.stderr
    assert len(graded.stderr.splitlines()) == 1
    assert "grading WITHOUT a sandbox (bwrap (bubblewrap) is not installed)" in graded.stderr
    assert graded.stdout.count("\n") == 3  # the header and two rows
