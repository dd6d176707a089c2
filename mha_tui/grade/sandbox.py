"""The sandbox each submission runs in: bubblewrap (`bwrap`, what Flatpak uses) builds it, the
fork server's child steps into it.

What a sandbox is (one per submission, built fresh by `bwrap`):
- no network: a network namespace of its own, with only a loopback nobody listens on;
- a read-only view of the system (/usr and the /bin, /lib links), of Python and of the
  installed packages (torch, mha-tui), of the submission's own file and of --weights; nothing
  else of the machine: no other submission, no home, no grader's output, no /work;
- its own empty scratch folder (/scratch, its working directory) and a private /tmp, both
  tmpfs of MAX_WRITE bytes: the only writable places;
- its own process (pid), IPC and host-name namespaces: it sees only its own processes, and
  they all end with the sandbox (`--die-with-parent`, and the namespace's init);
- a clean environment (the fork server's, which the grader starts with nothing of its own).

How a submission gets into it fast: `bwrap ... -- sh -c 'echo ready; exec cat'` builds the
namespaces and holds them open (cat waits on a pipe only the grader holds). The fork server,
which imported torch and mha-tui once, forks a child that joins those namespaces (setns), takes
the sandbox's root (chroot), forks the worker inside the sandbox's pid namespace, and the
worker gives up every privilege (another uid when the grader is root, no capabilities, no new
privileges) before any of the learner's code runs. Closing the holder's pipe or killing bwrap
ends every process of the sandbox.

Never imports torch, rich, textual or typer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

SCRATCH = "/scratch"
# The sandbox's pid namespace holds bwrap's init (1), the holder shell turned cat (2) and the
# submission's processes.
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group",
        "nsswitch.conf")
NAMESPACES = ("user", "ipc", "uts", "net", "pid", "mnt")  # setns order: user first, mnt last


class SandboxError(Exception):
    """The sandbox could not be built (bwrap missing or refused): one line."""


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


_PROBED: dict[str, str | None] = {}


def unavailable() -> str | None:
    """Why no sandbox can be built here (None: it can). Tried once per process: bwrap runs
    `true` in a sandbox like a submission's."""
    if "why" in _PROBED:
        return _PROBED["why"]
    bwrap = bwrap_path()
    why: str | None = None
    if bwrap is None:
        why = "bwrap (bubblewrap) is not installed"
    elif not sys.platform.startswith("linux"):
        why = "the sandbox needs Linux namespaces"
    else:
        try:
            done = subprocess.run([bwrap, *_base_args(), "--", "true"], capture_output=True,
                                  text=True, timeout=30, env=_bwrap_env())
            if done.returncode != 0:
                said = done.stderr.strip().splitlines()
                why = f"bwrap cannot build a sandbox here: {said[-1] if said else done.returncode}"
        except (OSError, subprocess.TimeoutExpired) as error:
            why = f"bwrap cannot build a sandbox here: {error}"
    _PROBED["why"] = why
    return why


def _bwrap_env() -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _python_paths() -> list[str]:
    """What the worker's Python reads: its install, the environment's packages, and this
    mha_tui (a checkout, for an editable install: only the package's own folder)."""
    import mha_tui

    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(mha_tui.__file__).resolve().parent)}
    for entry in sys.path:
        if entry and os.path.isdir(entry) and "site-packages" in entry:
            paths.add(entry)
    real = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)} | paths)
    # A folder inside another one already bound is bound with it.
    kept: list[str] = []
    for path in sorted(real, key=len):
        if os.path.exists(path) and not any(path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _base_args() -> list[str]:
    # As root the worker becomes another uid of the machine's own user namespace (so that
    # RLIMIT_NPROC counts its processes alone); any other user gets a user namespace.
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", *(["--unshare-user"] if os.getuid() != 0 else []),
            "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    for path in _SYSTEM:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in _ETC:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    return args


@dataclass
class Box:
    """One submission's sandbox, held open by its holder process until close()."""

    process: subprocess.Popen[bytes]
    init: int  # the sandbox's init (bwrap's pid 1), as the grader sees it
    pidns: int  # the inode of its pid namespace
    known: set[int] = field(default_factory=set)  # bwrap, init and the holder

    def leftovers(self) -> list[str]:
        """The processes of this sandbox other than its own three: what the submission left
        running. Their command lines, as far as they can be read."""
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in self.known:
                continue
            try:
                if os.stat(f"/proc/{name}/ns/pid").st_ino != self.pidns:
                    continue
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
                state = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found.append(cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip())
        return found

    def filled(self, size: int) -> list[str]:
        """The sandbox's writable places that the submission filled to (nearly) `size`."""
        full = []
        for place in ("/tmp", SCRATCH):
            try:
                stat = os.statvfs(f"/proc/{self.init}/root{place}")
            except OSError:
                continue
            if (stat.f_blocks - stat.f_bfree) * stat.f_frsize >= size * 0.9:
                full.append(place)
        return full

    def close(self) -> None:
        """End the sandbox and everything in it (its init's death ends its pid namespace)."""
        for pid in (self.init, self.process.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def open_box(*, read_only: list[tuple[str, str]], size: int) -> Box:
    """Build a sandbox: the system and Python read-only, `read_only` (source, where) too, an
    empty /scratch and /tmp of `size` bytes each. Raises SandboxError."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxError("bwrap (bubblewrap) is not installed")
    args = [bwrap, *_base_args()]
    for place in ("/tmp", SCRATCH):  # first: a file bound below /tmp is bound on top of it
        args += ["--perms", "1777", "--size", str(size), "--tmpfs", place]
    binds = [(path, path) for path in _python_paths()] + list(read_only)
    made: set[str] = set()
    for _, where in binds:  # the folders on the way, readable by the worker's uid
        for parent in reversed(Path(where).parents[:-1]):
            if str(parent) not in made and str(parent) not in ("/tmp", SCRATCH):
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
    for source, where in binds:
        args += ["--ro-bind", source, where]
    info_r, info_w = os.pipe()
    try:
        process = subprocess.Popen(
            [*args, "--info-fd", str(info_w), "--", "/bin/sh", "-c", "echo ready; exec cat"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(info_w,), env=_bwrap_env(), start_new_session=True)
    except OSError as error:
        os.close(info_r)
        os.close(info_w)
        raise SandboxError(f"bwrap could not start: {error}") from None
    os.close(info_w)
    with os.fdopen(info_r, "rb") as info:
        ready = process.stdout.readline() if process.stdout else b""  # the root is in place
        said = info.read(65536) if ready else b""
    if ready != b"ready\n":
        error = process.stderr.read().decode("utf-8", "replace") if process.stderr else ""
        process.kill()
        process.wait()
        raise SandboxError(f"bwrap could not build the sandbox: {error.strip() or ready!r}")
    init = int(json.loads(said)["child-pid"])
    known = {process.pid, init}
    try:
        known.update(int(pid) for pid in
                     Path(f"/proc/{init}/task/{init}/children").read_text().split())
        pidns = os.stat(f"/proc/{init}/ns/pid").st_ino
    except OSError as error:
        process.kill()
        process.wait()
        raise SandboxError(f"the sandbox ended as it started: {error}") from None
    return Box(process, init, pidns, known)


# ------------------------------------------------------------------ inside (the fork server)

_CLONE = {"mnt": 0x00020000, "uts": 0x04000000, "ipc": 0x08000000, "user": 0x10000000,
          "pid": 0x20000000, "net": 0x40000000}


def enter(init: int) -> None:
    """Join the sandbox whose init is `init` (the fork server's child, single-threaded, before
    it forks the worker): its user namespace if it has its own, IPC, host name, network, pid
    (for the children) and mount namespaces, then its root. Raises OSError."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    root = os.open(f"/proc/{init}/root", os.O_RDONLY | os.O_DIRECTORY)
    fds = {}
    for name in NAMESPACES:
        mine, theirs = f"/proc/self/ns/{name}", f"/proc/{init}/ns/{name}"
        if os.stat(mine).st_ino != os.stat(theirs).st_ino:
            fds[name] = os.open(theirs, os.O_RDONLY)
    for name, fd in fds.items():
        if libc.setns(fd, _CLONE[name]) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({name}): {os.strerror(errno)}")
        os.close(fd)
    os.fchdir(root)
    os.chroot(".")
    os.close(root)
    os.chdir("/")


def drop_privileges(uid: int | None) -> None:
    """Give up everything before the learner's code: as root, become `uid` (no groups, no
    capabilities left); otherwise drop the capabilities a user namespace gave; and never gain
    new ones (no setuid program, no file capability)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if os.getuid() == 0 and uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from uid 0 to another: every capability goes
    else:
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
        if libc.capset(ctypes.byref(header), data) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"capset: {os.strerror(errno)}")
    pr_set_no_new_privs = 38
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(NO_NEW_PRIVS): {os.strerror(errno)}")
