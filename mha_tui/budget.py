"""Will a run fit? Memory for the tensors and disk for a JSON transcript, from T, h and C,
estimated before anything is built, so that an impossible size is one line, not a crash.

Pure Python: runs before torch is imported. Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .config import Config

FLOAT = 4  # float32
TORCH_AND_PYTHON = 400 << 20  # the interpreter, torch and NumPy loaded, before any tensor
TORCH_VIRTUAL = 400 << 20  # address space torch maps (libraries, threads) beyond its memory
SMALL = 64 << 20  # tensors below this are never a reason to refuse
JSON_BYTES_PER_VALUE = 11  # "-0.12345678," on average; "0.0," and '"-inf",' are shorter


def trace_elements(config: Config) -> int:
    """How many values the trace records (what a JSON transcript writes)."""
    T, C, h, V = config.seq_len, config.embed_dim, config.num_heads, len(config.vocab)
    weights = 4 * C * C + V * C  # W_Q, W_K, W_V, W_O and the embedding table
    # x; Q, K, V projected, viewed and transposed; the wrong view; context before, as a
    # strided view and after concat; out
    per_token = 15 * T * C
    per_pair = 4 * h * T * T + T * T  # scores, scaled, masked, weights; the causal mask
    return T + weights + per_token + per_pair


def trace_bytes(config: Config) -> int:
    """Memory the run needs beyond the interpreter: the recorded tensors, the module's causal
    mask buffer (max_seq_len squared) and the plain second forward's scratch."""
    T, C, h = config.seq_len, config.embed_dim, config.num_heads
    recorded = trace_elements(config) * FLOAT
    buffer = config.max_seq_len ** 2 * FLOAT
    scratch = (3 * h * T * T + 6 * T * C) * FLOAT
    return recorded + buffer + scratch


def json_bytes(config: Config) -> int:
    """About how large the JSON transcript is."""
    return trace_elements(config) * JSON_BYTES_PER_VALUE + 20_000


@dataclass(frozen=True)
class Available:
    bytes: int
    source: str  # where the figure comes from, shown to the user


def available_memory(meminfo: str = "/proc/meminfo",
                     cgroup: str = "/sys/fs/cgroup") -> Available | None:
    """Memory a new run can have: MemAvailable, or the cgroup's limit if lower; without
    /proc, free physical pages; None when nothing says."""
    found: list[Available] = []
    try:
        with open(meminfo, encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found.append(Available(int(line.split()[1]) * 1024,
                                           "MemAvailable in /proc/meminfo"))
                    break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            if pages > 0:
                found.append(Available(pages, "free physical memory"))
        except (OSError, ValueError, AttributeError):
            pass
    try:  # `ulimit -v`: the address space left, less what torch maps beyond its memory
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/status", encoding="ascii") as handle:
                status = handle.read()
            mapped = int(status.split("VmSize:")[1].split()[0]) * 1024
            found.append(Available(max(soft - mapped - TORCH_VIRTUAL, 0),
                                   "the address-space limit, ulimit -v"))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    try:  # cgroup v2: a container's own ceiling
        with open(os.path.join(cgroup, "memory.max"), encoding="ascii") as handle:
            limit = handle.read().strip()
        with open(os.path.join(cgroup, "memory.current"), encoding="ascii") as handle:
            current = int(handle.read().strip())
        if limit != "max":
            found.append(Available(max(int(limit) - current, 0), "the cgroup's memory.max"))
    except (OSError, ValueError):
        pass
    return min(found, key=lambda a: a.bytes) if found else None


def free_disk(folder: str) -> int | None:
    try:
        info = os.statvfs(folder)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def sizes(config: Config) -> str:
    return (f"T={config.seq_len} C={config.embed_dim} h={config.num_heads}"
            f" (--max-seq-len {config.max_seq_len})")


def memory_problem(config: Config, available: Available | None) -> str | None:
    """Why the run cannot fit in memory, or None."""
    if available is None:
        return None
    need = trace_bytes(config)
    # A small run is never refused: a tight machine's trouble is then not the size.
    if need < SMALL or need + TORCH_AND_PYTHON <= available.bytes:
        return None
    return (f"{sizes(config)} needs about {human(need)} of memory for its tensors, plus "
            f"{human(TORCH_AND_PYTHON)} for Python and torch; {human(available.bytes)} is "
            f"available ({available.source}); use fewer tokens, heads or a smaller --embed-dim")


def disk_problem(config: Config, folder: str, free: int | None) -> str | None:
    """Why a JSON transcript of config cannot fit in folder, or None."""
    if free is None:
        return None
    need = json_bytes(config)
    if need <= free:
        return None
    return (f"the JSON transcript of {sizes(config)} takes about {human(need)}; {folder} has "
            f"{human(free)} free")
