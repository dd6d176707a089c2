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


# ---------------------------------------------------------------- --hf: a checkpoint


# The interpreter with torch, transformers and tokenizers imported, before any weight
# (measured: a whole `--hf` run on a tiny checkpoint peaks at about 360 MiB).
HF_IMPORTS = 400 << 20
# What one recorded attention layer keeps, per layer (the recorder's copies): about 7 (h, T, T)
# maps (raw, scaled and masked scores, softmax, its cast, dropout, and one more) and 24
# (T, C)-sized tensors (projections, their splits, views, transposes, heads, the output),
# and a copy of the layer's attention parameters, float32 each (measured on GPT-2:
# tests/test_hf.py::test_memory_estimate_counts_what_the_recorder_keeps).
MAPS_PER_LAYER = 7
CHANNEL_TENSORS_PER_LAYER = 24
# The model's own forward at one block, beyond the records: a few (h, T, T) maps and
# (T, C) or (T, MLP width) tensors alive at once.
FORWARD_MAPS = 4
FORWARD_CHANNELS = 12


# On top of the weights and activations an `--hf` estimate counts: a fifth more, and 64 MiB
# for what the interpreter's share varies by (375-415 MiB across the bench's shapes). The
# estimate is then within about 1.45 x the measured peak and never below it (streamed, 12
# tokens: 1.24 x, 1.42 x and 1.44 x on the bench's 1B, 3B and 8B shapes, 1.27 x on the 70B's;
# loaded whole, the estimate without them was 1 % under the 1B's measured peak).
MARGIN = 1.2
SLACK = 64 << 20
# A page fault on a mapped file maps the pages around it too (the kernel's fault-around,
# 64 KiB): what reading one row of an embedding table costs at least.
_READ_AROUND = 64 << 10


def recorded_elements(T: int, C: int, h: int, attention_params: int) -> int:
    """Values the tracer keeps for one recorded attention layer on T tokens (what a JSON
    transcript of that layer writes, too)."""
    return MAPS_PER_LAYER * h * T * T + CHANNEL_TENSORS_PER_LAYER * C * T + attention_params


@dataclass(frozen=True)
class HfShape:
    """An `--hf` run's sizes, from config.json and the checkpoint's headers (hf_files)."""

    tokens: int  # T: the sentence's token count, or a bound above it
    embed_dim: int  # C
    num_heads: int  # h
    mlp_width: int  # the MLP's hidden width (4 C when config.json does not say)
    elements: int  # every tensor of the checkpoint
    block_elements: tuple[int, ...]  # each block's (empty: the blocks were not found)
    head_elements: int  # an output head stored apart (the streamed forward stops before it)
    element_bytes: int  # what one element takes in the dtype the model runs in
    stored: int  # bytes of the weight files
    safetensors: bool  # readable tensor by tensor: streamable
    stored_element_bytes: int = 0  # what one element takes as stored (0: as element_bytes)
    tables: tuple[int, ...] = ()  # the embeddings' lookup tables outside the blocks, elements
    largest_elements: int = 0  # the largest tensor read (not the output head)
    attention_elements: int = 0  # one layer's attention weights (0: 4 C x C)


def _with_margin(counted: int) -> int:
    """What the interpreter holds, and MARGIN and SLACK on what was counted."""
    return HF_IMPORTS + SLACK + int(MARGIN * counted)


def _activations(shape: HfShape, T: int, layers: int = 1) -> int:
    C, h = shape.embed_dim, shape.num_heads
    attention = shape.attention_elements or 4 * C * C
    recorded = layers * recorded_elements(T, C, h, attention) * FLOAT
    forward = (FORWARD_MAPS * h * T * T + FORWARD_CHANNELS * T * max(C, shape.mlp_width)) * FLOAT
    # After the forward, the stages' checks recompute from the recorded weights in float64
    # (measured: Llama-3-70B's layer 40 peaked at 2.5 GiB in its forward and 3.0 GiB at the
    # end, about W_Q in float64 more): half a layer's attention weights, 8 bytes each.
    recompute = attention // 2 * 8
    return recorded + forward + recompute


def hf_whole_bytes(shape: HfShape, T: int | None = None, layers: int = 1) -> int:
    """Peak memory of the full load: every weight in the model's dtype, the activations
    (`layers` recorded: `mha-tui heads` records every one), and
    the file itself where its tensors are copied into another dtype (transformers maps it
    and converts tensor by tensor: measured, the mapped pages stay in the peak) or read whole
    (a `.bin`, torch.load)."""
    T = shape.tokens if T is None else T
    weights = shape.elements * shape.element_bytes
    same = abs(shape.stored - weights) <= shape.stored // 100  # (the header aside)
    copied = 0 if same and shape.safetensors else shape.stored
    return _with_margin(weights + copied + _activations(shape, T, layers))


def hf_streamed_bytes(shape: HfShape, layer: int, T: int | None = None) -> int | None:
    """Peak memory streamed (load.hf_stream), from what streaming holds; None: not streamable.

    In the checkpoint's own dtype, safetensors maps the file and copies nothing: a tensor
    takes memory only for the pages the forward reads, and a block dropped after its forward
    gives them back. So the peak is the largest block up to `layer` (each is read whole by
    its forward, one at a time: block `layer` is mapped from the start but read only when
    the forward reaches it), the rows of the embeddings the sentence reads (the tables'
    pages; every other tensor outside the blocks counted whole), every earlier block's
    output kept (B, T, C), and the recorded layer's activations and its attention weights'
    float32 copy. In another dtype (`--dtype`), every tensor read is converted into memory:
    what lies outside the blocks, then block `layer` and the largest one before it at once,
    and, while a tensor converts, its stored copy too. On top, what the interpreter holds
    and the margin (tests/test_hf_stream.py checks a run's measured peak against this).
    """
    blocks = shape.block_elements
    if not shape.safetensors or not blocks or not 0 <= layer < len(blocks):
        return None
    T = shape.tokens if T is None else T
    size, C = shape.element_bytes, shape.embed_dim
    stored = shape.stored_element_bytes or size
    outside = shape.elements - sum(blocks) - shape.head_elements
    if stored == size:  # mapped: only the pages read count
        tables = sum(min(table, T * max(C, _READ_AROUND // size)) for table in shape.tables)
        held = (outside - sum(shape.tables) + tables) * size
        weights = held + max(blocks[:layer + 1]) * size
    else:  # converted into memory, one stored tensor at a time beside its copy
        held = outside * size
        loading = shape.largest_elements * stored  # (the embeddings, converting)
        running = ((blocks[layer] + max(blocks[:layer], default=0)) * size
                   + C * shape.mlp_width * stored)  # (and a block's largest, converting)
        weights = held + max(loading, running)
    kept = layer * T * C * FLOAT
    return _with_margin(weights + kept + _activations(shape, T))


def hf_memory_problem(source: str, shape: HfShape, layer: int, stream: bool,
                      available: Available | None) -> str | None:
    """Why `--hf source --layer layer` cannot fit in memory, in one line with both figures
    and what would fit; or None."""
    if available is None:
        return None
    have = available.bytes
    streamed = hf_streamed_bytes(shape, layer)
    whole = hf_whole_bytes(shape)
    need = streamed if stream and streamed is not None else whole
    if need <= have:
        return None
    T = shape.tokens
    if stream and streamed is not None:
        figures = (f"needs about {human(streamed)} of memory streamed ({human(whole)} loaded "
                   f"whole)")
    elif streamed is not None:
        figures = (f"needs about {human(whole)} of memory loaded whole with --no-stream "
                   f"({human(streamed)} streamed)")
    else:
        figures = f"needs about {human(whole)} of memory (its checkpoint cannot be streamed)"
    head = (f"--hf {source} at layer {layer} on {T} token{'s' if T != 1 else ''} {figures}; "
            f"{human(have)} is available ({available.source})")
    return f"{head}; {_what_fits(shape, layer, stream, have)}"


def _what_fits(shape: HfShape, layer: int, stream: bool, have: int) -> str:
    """The option that would fit: streaming on, an earlier layer, fewer tokens; or none."""
    streamable = hf_streamed_bytes(shape, 0) is not None
    if not stream and streamable and (hf_streamed_bytes(shape, layer) or have + 1) <= have:
        return "without --no-stream (streamed) it fits"

    def need(at: int, T: int) -> int:
        found = hf_streamed_bytes(shape, at, T) if stream and streamable else None
        return found if found is not None else hf_whole_bytes(shape, T)

    earlier = [at for at in range(layer) if need(at, shape.tokens) <= have]
    if earlier:
        return f"--layer {earlier[-1]} fits"
    fewer = [T for T in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
             if T < shape.tokens and need(layer, T) <= have]
    if fewer:
        low, high = fewer[-1], shape.tokens  # the longest sentence that fits, by bisection
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if need(layer, middle) <= have else (low, middle)
        return f"a sentence of at most {low} tokens fits"
    least = need(0, 1)
    return (f"no layer or sentence fits: the model's weights alone take about {human(least)} "
            f"this way; free memory or use a smaller model")


def hf_whole_problem(what: str, shape: HfShape, available: Available | None, advice: str,
                     layers: int = 1) -> str | None:
    """Why a run that loads the whole model (`mha-tui heads`, an encoder-decoder with
    `--context`) cannot fit in memory, in one line with both figures; or None."""
    if available is None:
        return None
    need = hf_whole_bytes(shape, layers=layers)
    if need <= available.bytes:
        return None
    return (f"{what} on {shape.tokens} token{'s' if shape.tokens != 1 else ''} loads the whole "
            f"model and needs about {human(need)} of memory; {human(available.bytes)} is "
            f"available ({available.source}); {advice}")


def hf_json_bytes(shape: HfShape, layers: int = 1) -> int:
    """About how large the JSON transcript of `layers` recorded layers is."""
    C, h, T = shape.embed_dim, shape.num_heads, shape.tokens
    per_layer = recorded_elements(T, C, h, 4 * C * C) + 6 * T * C  # + the first stage's
    return layers * per_layer * JSON_BYTES_PER_VALUE + 20_000


def hf_disk_problem(source: str, shape: HfShape, folder: str, free: int | None) -> str | None:
    """Why the JSON transcript of one `--hf` layer cannot fit in folder, or None."""
    if free is None:
        return None
    need = hf_json_bytes(shape)
    if need <= free:
        return None
    return (f"the JSON transcript of --hf {source} on {shape.tokens} tokens takes about "
            f"{human(need)}; {folder} has {human(free)} free; use fewer tokens or write it "
            f"where there is room")
