"""Run one command and write its wall time and peak memory to a file, from a small process.

    python benchmarks/launch.py RESULT.json COMMAND [ARG ...]

Why a launcher: Linux counts a process's peak RSS from before its exec, so a command the
benchmark starts itself inherits the benchmark's own peak (hundreds of MiB once it has
imported torch) and every row reads the same number. This process is small; the command it
forks and execs reports its own peak. The command keeps this process's stdin, stdout and
stderr (a pseudo-terminal for the app). RESULT.json gets {"started": time.time() just
before the exec, "seconds": fork to exit, "max_rss_kib": ru_maxrss, "code": exit code}; the
launcher exits with the command's code.
"""

import json
import os
import sys
import time


def main() -> int:
    result, argv = sys.argv[1], sys.argv[2:]
    started_wall = time.time()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the command: this small process's memory, then its own
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    with open(result, "w", encoding="utf-8") as out:
        json.dump({"started": started_wall, "seconds": seconds, "max_rss_kib": usage.ru_maxrss,
                   "code": code}, out)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
