"""Decoding with a KV cache (`--decode N`): the full forward, a prefill, then one recorded
forward per generated token, each against the cache its predecessors left.

The cache is the module's own, in the style its forward's signature shows
(`load.signature.cache_style`): passed in and returned (GPT-2's `layer_past`, nanoGPT forks'
`past_kv`), or kept in the module and reached by `use_cache` (Raschka's, emptied by
`reset_cache()`), `start_pos` (Meta Llama's) or `input_pos` (gpt-fast's KVCache). The module
runs unchanged; between the calls mha-tui only keeps what the module returned, and puts its
own state back before a step is run a second time (the tracer runs a forward that writes
state twice, to tell its output is its own).

Knows torch and the record types; never import rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..load.learner import MASK_NAMES
from ..load.signature import PAD_KEEP_NAMES, PAD_NAMES, CacheStyle, Refused, cache_style
from ..records import Recorded
from . import record_forward

# A forward's parameters that can carry a padding mask (load.signature's names).
PADDING_PARAMETERS = (*PAD_KEEP_NAMES, *PAD_NAMES, *MASK_NAMES)

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn


@dataclass(frozen=True, eq=False)
class RecordedStep:
    """One decode step as recorded: the new token at `position`, and what the cache held
    after it (its tensors' shapes and bytes, and how many tokens they hold)."""

    recorded: Recorded
    position: int
    full_row: np.ndarray  # (B, C): the uncached forward's output at `position`
    cache_shapes: tuple[tuple[int, ...], ...] = ()
    cache_bytes: int | None = None
    cache_tokens: int | None = None
    cache_dtype: str = ""


@dataclass(frozen=True, eq=False)
class RecordedDecode:
    """A decode run: the style of the cache, the prefill's length, the full forward's
    output (B, T, C), and each step as recorded (fewer than asked when a step raised)."""

    style: CacheStyle
    prefill: int
    full: np.ndarray
    steps: tuple[RecordedStep, ...]


def style_of(module: nn.Module) -> CacheStyle:
    """The module's KV cache as its forward's signature shows it (Refused: one line)."""
    methods = frozenset(name for name in dir(type(module)) if callable(getattr(type(module), name, None)))
    return cache_style(module.forward, f"{type(module).__name__}.forward", methods)


def decode_refusal(module: nn.Module, *, cross: bool, batch: bool) -> str:
    """Why `--decode` cannot run with `--context` (cross) or `--batch` on this module, in one
    line: from what its forward's signature shows of its cache and its masks."""
    import inspect

    name = f"{type(module).__name__}.forward"
    try:
        params = set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = set()
    try:
        style: CacheStyle | None = style_of(module)
    except Refused:
        style = None
    if cross:
        if style is None:
            return (f"--decode with --context: {name} keeps no KV cache: the context's keys "
                    f"and values are made again from the context at every call, so a decode "
                    f"step has nothing cached to show (--context alone shows every query "
                    f"against the context at once, the rows a decoder computes one by one)")
        return (f"--decode with --context is not built: {name} takes a KV cache "
                f"({style.parameter}) beside its context, and mha-tui does not yet decode a "
                f"cross-attention against it (the context's keys and values made once, read "
                f"back at every step); explain it with --context alone")
    if style is None:
        return (f"--decode with --batch: {name} keeps no KV cache (--decode needs one, and "
                f"--batch alone shows the padded rows)")
    if style.kind in ("start_pos", "input_pos"):
        return (f"--decode with --batch: {name} writes its cache at one {style.parameter} for "
                f"every row, so rows of different lengths cannot each add their next token "
                f"at their own position; decode one sentence")
    if not params & {*PADDING_PARAMETERS}:
        return (f"--decode with --batch: {name} takes no padding mask beside its cache, so a "
                f"shorter row's <pad> keys would stay in the cache, visible to its new tokens; "
                f"decode one sentence")
    return ("--decode with --batch is not built: decoding padded rows needs them padded on "
            "the left with a position per row (as Hugging Face's generate does), and --batch "
            "pads on the right; decode one sentence")


def decode_prompt(steps: int, T: int) -> int:
    """The prefill's length for `steps` decode steps of a T-token sentence (ValueError when
    nothing would be left to prefill)."""
    if not 1 <= steps < T:
        raise ValueError(f"--decode {steps}: the sentence has {T} tokens; decode between 1 and "
                         f"{T - 1} of them (at least one token is the prompt)")
    return T - steps


# ---------------------------------------------------------------- how each style is called


def _result_output(result: object) -> torch.Tensor:
    """A forward's output: the tensor, or the first element of a tuple or list."""
    import torch

    if isinstance(result, tuple | list) and result:
        result = result[0]
    if not isinstance(result, torch.Tensor):
        raise Refused(f"the forward returned {type(result).__name__}, not a tensor (or a tuple "
                      "whose first element is one)")
    return result


def _present(result: object, style: CacheStyle) -> object:
    """The cache a forward of the "passed" style returned: the element after its output, or,
    when that is None, the first one after it that is not (Hugging Face's BART, Marian and
    Whisper return (attn_output, attn_weights, past_key_value), attn_weights None unless
    output_attentions)."""
    if isinstance(result, tuple | list) and len(result) >= 2:
        found = next((item for item in result[1:] if item is not None), None)
        if found is not None:
            return found
    raise Refused(f"the forward returned no cache after its output (with {style.parameter} and "
                  f"{'use_cache=True' if style.use_cache else 'no use_cache'}): return "
                  "(output, (keys, values))")


def full_call(style: CacheStyle) -> Callable[[nn.Module, torch.Tensor], object]:
    """The uncached forward over the whole sentence (a cache kept in the module is then
    written from position 0, as its authors' prompt call does)."""
    import torch

    def call(module: nn.Module, x: torch.Tensor) -> object:
        if style.kind == "start_pos":
            return module(x, **{style.parameter: 0})
        if style.kind == "input_pos":
            return module(x, **{style.parameter: torch.arange(x.shape[1])})
        return module(x, **({"use_cache": False} if style.use_cache else {}))

    return call


def cached_call(style: CacheStyle, past: object, start: int
                ) -> Callable[[nn.Module, torch.Tensor], object]:
    """A forward against the cache: the new tokens start at position `start`; `past` is the
    cache a "passed" style returned last (None before the prefill)."""
    import torch

    switch = {"use_cache": True} if style.use_cache else {}

    def call(module: nn.Module, x: torch.Tensor) -> object:
        if style.kind == "passed":
            return module(x, **{style.parameter: past}, **switch)
        if style.kind == "start_pos":
            return module(x, **{style.parameter: start}, **switch)
        if style.kind == "input_pos":
            return module(x, **{style.parameter: torch.arange(start, start + x.shape[1])}, **switch)
        return module(x, **switch)

    return call


def reset(module: nn.Module, style: CacheStyle) -> None:
    """Empty a cache kept in the module with its own method (Raschka's reset_cache())."""
    if style.reset:
        getattr(module, style.reset)()


# ---------------------------------------------------------------- the module's state


def _state(module: nn.Module) -> list[tuple[nn.Module, str, object, bool]]:
    """Every tensor and number a module (and its submodules) keeps besides its parameters:
    what a cache kept in the module is made of. (submodule, name, a copy, is a buffer)."""
    import torch

    kept: list[tuple[nn.Module, str, object, bool]] = []
    for sub in module.modules():
        for name, buffer in sub._buffers.items():  # registered buffers (None until filled)
            kept.append((sub, name, None if buffer is None else buffer.detach().clone(), True))
        for name, value in vars(sub).items():
            if name.startswith("_") or isinstance(value, torch.nn.Parameter):
                continue
            if isinstance(value, torch.Tensor):
                kept.append((sub, name, value.detach().clone(), False))
            elif isinstance(value, bool | int | float) or value is None:
                kept.append((sub, name, value, False))
    return kept


def _live(module: nn.Module) -> dict[tuple[int, str], object]:
    """The tensors the module keeps besides its parameters, as they are now (no copy)."""
    import torch

    out: dict[tuple[int, str], object] = {}
    for sub in module.modules():
        for name, buffer in sub._buffers.items():
            out[(id(sub), name)] = buffer
        for name, value in vars(sub).items():
            if not name.startswith("_") and isinstance(value, torch.Tensor) and \
                    not isinstance(value, torch.nn.Parameter):
                out[(id(sub), name)] = value
    return out


def _restore(state: list[tuple[nn.Module, str, object, bool]]
             ) -> dict[tuple[int, str], tuple[object, int]]:
    """Put the kept state back (fresh copies); returns each tensor put back with its
    version counter, so that what the run then writes or replaces can be told."""
    import torch

    installed: dict[tuple[int, str], tuple[object, int]] = {}
    for sub, name, value, buffer in state:
        copy = value.clone() if isinstance(value, torch.Tensor) else value
        if buffer:
            sub._buffers[name] = copy  # type: ignore[assignment]
        else:
            sub.__dict__[name] = copy
        if isinstance(copy, torch.Tensor):
            # `_version` counts in-place writes; torch has no public reader (tracing/__init__.py)
            installed[(id(sub), name)] = (copy, copy._version)
    return installed


def _changed(installed: dict[tuple[int, str], tuple[object, int]], module: nn.Module
             ) -> list[torch.Tensor]:
    """The module's tensors the step wrote into or replaced: its cache (a cache allocated up
    front is written in place even where the new numbers equal the old)."""
    import torch

    out = []
    for key, value in _live(module).items():
        if not isinstance(value, torch.Tensor):
            continue
        before = installed.get(key)
        if before is None or before[0] is not value or before[1] != value._version:
            out.append(value)
    return out


def _tensors(value: object) -> list[torch.Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):  # a cache kept as {"k": keys, "v": values}
        return [t for item in value.values() for t in _tensors(item)]
    return []


def _cache_size(tensors: list[torch.Tensor], tokens: int
                ) -> tuple[tuple[tuple[int, ...], ...], int | None, int | None, str]:
    """The cache's shapes, bytes, and how many tokens' room it holds: the axis that is
    `tokens` long (a cache that grows), else its longest (one allocated up front)."""
    if not tensors:
        return (), None, None, ""
    shapes = tuple(tuple(t.shape) for t in tensors)
    total = sum(t.element_size() * t.numel() for t in tensors)
    first = shapes[0]
    room = tokens if tokens in first[1:] else max(first[1:], default=tokens)
    batch = first[0] if len(first) > 1 else 1
    return shapes, total, room * batch, str(tensors[0].dtype).removeprefix("torch.")


# ---------------------------------------------------------------- the run


def record_decode(module: nn.Module, x: torch.Tensor, tokens: Sequence[str], steps: int, *,
                  config: Config, embedding: nn.Embedding | None = None,
                  ids: torch.Tensor | None = None, style: CacheStyle | None = None,
                  fresh: bool = True) -> RecordedDecode:
    """The full forward over x (B, T, C), the prefill of its first T - steps tokens, then
    each of the last `steps` tokens recorded as a forward of its own against the cache.
    tokens: the T tokens; config: the run's (each step's is made from it: the new token
    as the sentence, the ones before it `cached`). fresh: run the full forward first (the
    check's second run skips it: its cache must be emptied by the module's own reset).
    Raises Refused (one line) when the forward keeps no cache mha-tui can find."""
    import torch

    style = style or style_of(module)
    T = int(x.shape[1])
    prefill = decode_prompt(steps, T)
    with torch.no_grad():
        full = _result_output(full_call(style)(module, x)).detach().float()  # (B, T, C)
        reset(module, style)
        result = cached_call(style, None, 0)(module, x[:, :prefill])
    past = _present(result, style) if style.kind == "passed" else None
    recorded: list[RecordedStep] = []
    for position in range(prefill, T):
        before = _state(module)
        returned: list[object] = []
        installed: list[dict[tuple[int, str], tuple[object, int]]] = [{}]
        step = cached_call(style, past, position)

        def call(m: nn.Module, inp: torch.Tensor, step: Any = step, before: Any = before,
                 returned: list[object] = returned, installed: Any = installed) -> object:
            installed[0] = _restore(before)  # a second run of the step starts from the same cache
            result = step(m, inp)
            returned[:] = [result]
            return result

        step_config = replace(config, sentence=tokens[position], cached=tuple(tokens[:position]),
                              batch=(), context="", context_labels=(), vocabulary=config.vocab)
        one = slice(position, position + 1)
        got = record_forward(module, None if embedding is not None else x[:, one],
                             [tokens[position]], call=call, embedding=embedding,
                             ids=None if ids is None else ids[:, one], config=step_config)
        if not returned or got.recording.error is not None:
            recorded.append(RecordedStep(got, position, full[:, position].numpy()))
            break
        if style.kind == "passed":
            past = _present(returned[0], style)
            cache = _tensors(past)
        else:
            cache = _changed(installed[0], module)
        shapes, size, room, dtype = _cache_size(cache, position + 1)
        recorded.append(RecordedStep(got, position, full[:, position].numpy(), shapes, size,
                                     room, dtype))
    return RecordedDecode(style, prefill, full.numpy(), tuple(recorded))
