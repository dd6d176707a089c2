"""Where `--dump PATH` writes, and how, so that no path can make mha-tui destroy anything.

- A regular file, or a new name, in a folder we can write: the transcript goes to a
  temporary file beside it, which is renamed over it once complete (keeping its mode).
- A symlink is followed; its final target is treated as above, in the target's own folder.
- A regular file we may write in a folder we may not: rewritten in place once the whole
  transcript exists (its space reserved first, so that a full disk leaves it as it was).
- `-`, a character device, a FIFO, `/dev/fd/N`, `/dev/stdout`: written through in place,
  once the whole transcript exists (held in a spool: memory, then a temporary file).
- Anything else (a folder, a block device, a socket) is refused. Nothing that is not a
  regular file is ever renamed over.

Every refusal is a `DumpError` whose message is one line. Never import textual or typer here.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, TextIO

SPOOL_IN_MEMORY = 64 << 20  # beyond this a spool moves to a temporary file
_FD_PATH = re.compile(r"^/(?:dev/fd|proc/self/fd|proc/thread-self/fd)/(\d+)$")
_OTHER_FD_PATH = re.compile(r"^/proc/\d+/fd/\d+$")  # another process's descriptor
_STD_PATH = {"/dev/stdout": 1, "/dev/stderr": 2, "/dev/stdin": 0}


class DumpError(Exception):
    """A transcript that cannot be written; `code` is 2 before any work, 1 at run time."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


Kind = Literal["replace", "in_place", "through", "fd"]


@dataclass(frozen=True)
class Destination:
    """Where the transcript goes. `shown` is the path as the user typed it."""

    kind: Kind
    shown: str
    path: Path | None = None  # the file itself (symlinks followed) for replace/in_place/through
    fd: int | None = None  # for "fd": a descriptor this process already holds

    @property
    def folder(self) -> Path:
        """Where temporary files go while the transcript is written."""
        if self.kind == "replace" and self.path is not None:
            return self.path.parent
        return Path(tempfile.gettempdir())


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _refuse(shown: str, why: str) -> DumpError:
    return DumpError(f"--dump {_short(shown)}: {why}")


def _fd_destination(shown: str, fd: int) -> Destination:
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        if fd == 1:
            raise _refuse(shown, "standard output is closed; give a file name instead") from None
        raise _refuse(shown, f"file descriptor {fd} is not open") from None
    if flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        raise _refuse(shown, f"file descriptor {fd} is not open for writing")
    return Destination("fd", shown, fd=fd)


def _writable_folder(folder: Path) -> bool:
    """The real test (permission bits lie to root and on special file systems)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return False
    return True


def resolve(raw: str) -> Destination:
    """How a transcript would reach raw (`-` is standard output); refuses with one line.

    Checks everything it can before any work is done: nothing is created or opened for
    writing here (a FIFO is only opened when the transcript is ready).
    """
    if raw == "-":
        return _fd_destination("-", 1)
    match = _FD_PATH.match(raw)
    if match or raw in _STD_PATH:
        return _fd_destination(raw, int(match.group(1)) if match else _STD_PATH[raw])
    if not raw:
        raise DumpError("--dump needs a file name, or '-' for standard output")
    if _OTHER_FD_PATH.match(raw):  # opened anew, written through, never renamed over
        if not os.access(raw, os.W_OK):
            raise _refuse(raw, "is not writable; choose another path or '-' for stdout")
        return Destination("through", raw, path=Path(raw))
    try:
        return _resolve_path(raw)
    except OSError as error:  # a name too long, a loop of links, a folder we cannot enter
        raise _refuse(raw, error.strerror or str(error)) from None


def _resolve_path(raw: str) -> Destination:
    if raw.endswith(os.sep) or raw.endswith(os.sep + "."):
        if os.path.isdir(raw):
            raise _refuse(raw, "is a folder; give a file name such as "
                               f"{os.path.join(raw, 'transcript.txt')}")
        raise _refuse(raw, "ends with '/', which names a folder, and there is no such "
                           "folder; give a file name without the '/'")
    folder = os.path.dirname(raw) or "."
    try:
        os.stat(folder)  # ENAMETOOLONG, ELOOP, EACCES surface in resolve() as one line
    except (FileNotFoundError, NotADirectoryError):
        raise _refuse(raw, f"the folder {_short(folder, 60)} does not exist") from None
    target = Path(os.path.realpath(raw))  # every symlink followed (a dangling one too)
    if str(target).startswith("/proc/"):
        # /proc's entries are not files to rename over, nor to write a transcript into
        # (a file descriptor's link, /dev/fd/N, is handled above).
        raise _refuse(raw, "is not writable; choose another path or '-' for stdout")
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    if info is None:
        folder = target.parent
        if not folder.is_dir():
            raise _refuse(raw, f"the folder {_short(str(folder), 60)} does not exist")
        if not _writable_folder(folder):
            raise _refuse(raw, "is not writable; choose another path or '-' for stdout")
        return Destination("replace", raw, path=target)
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        raise _refuse(raw, "is a folder; give a file name such as "
                           f"{os.path.join(raw, 'transcript.txt')}")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        if not os.access(target, os.W_OK):
            raise _refuse(raw, "is not writable; choose another path or '-' for stdout")
        return Destination("through", raw, path=target)
    if not stat.S_ISREG(mode):
        what = "a block device" if stat.S_ISBLK(mode) else (
            "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise _refuse(raw, f"is {what}; mha-tui writes to files, character devices and pipes")
    if _writable_folder(target.parent):
        if not os.access(target, os.W_OK):  # the rename would succeed; the user said no
            raise _refuse(raw, "is not writable; choose another path or '-' for stdout")
        return Destination("replace", raw, path=target)
    if os.access(target, os.W_OK):
        return Destination("in_place", raw, path=target)
    raise _refuse(raw, "is not writable; choose another path or '-' for stdout")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary_beside(path: Path) -> tuple[int, str]:
    # A short prefix: the temporary name must fit wherever the target's name fits.
    return tempfile.mkstemp(prefix=f".{path.name[:40]}.", suffix=".tmp", dir=path.parent)


@contextmanager
def opened(dest: Destination) -> Iterator[BinaryIO]:
    """A binary file to write the transcript into. When the block ends normally the
    transcript is delivered to dest; when it raises, dest is left exactly as it was."""
    if dest.kind == "replace":
        assert dest.path is not None
        fd, tmp = _temporary_beside(dest.path)
        try:
            with os.fdopen(fd, "wb") as handle:
                yield handle
            # mkstemp makes 0600; a transcript gets the mode a plain open() would give it,
            # or keeps the mode of the file it replaces.
            os.chmod(tmp, dest.path.stat().st_mode & 0o7777 if dest.path.exists()
                     else 0o666 & ~_umask())
            os.replace(tmp, dest.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
        yield spool  # type: ignore[misc]
        spool.flush()
        size = spool.tell()
        spool.seek(0)
        _deliver(dest, spool, size)


def _deliver(dest: Destination, spool: BinaryIO, size: int) -> None:
    """Copy the finished transcript to a destination written in place."""
    if dest.kind == "fd":
        assert dest.fd is not None
        if dest.shown == "-" and _caller_stdout(sys.stdout):
            _write_stream(spool, sys.stdout)
            return
        if dest.fd == 1:
            sys.stdout.flush()
        _copy(spool, dest.fd)
        return
    assert dest.path is not None
    flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(dest.path, flags)  # no O_CREAT, no O_TRUNC: the same inode, whatever it is
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        if regular and size:
            try:  # reserve the space first: a full disk must leave the old file whole
                os.posix_fallocate(fd, 0, size)
            except OSError as error:
                if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
        _copy(spool, fd)
        if regular:
            os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _caller_stdout(stream: object) -> bool:
    """sys.stdout is a stream the caller put in place of descriptor 1 (Typer's CliRunner, a
    notebook's output, contextlib.redirect_stdout): `-` means that stream, as print() does."""
    if stream is None or not hasattr(stream, "write"):
        return False
    try:
        return stream.fileno() != 1  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: no descriptor
        return True


def _write_stream(spool: BinaryIO, stream: TextIO) -> None:
    """The transcript (UTF-8) into a Python stream: its bytes when it has a binary buffer."""
    buffer = getattr(stream, "buffer", None)
    stream.flush()
    if buffer is not None:
        shutil.copyfileobj(spool, buffer, 1 << 20)  # type: ignore[misc]
        buffer.flush()
    else:
        stream.write(spool.read().decode("utf-8"))
        stream.flush()


def _copy(spool: BinaryIO, fd: int) -> None:
    with os.fdopen(os.dup(fd), "wb", closefd=True) as out:  # buffered: writes all of it
        shutil.copyfileobj(spool, out, 1 << 20)  # type: ignore[misc]
