"""`--hf` with `--decode N`: a causal LM's decode steps against its own KV cache (Hugging
Face's `Cache`, a DynamicCache), one layer's attention recorded at each step.

The prompt (the sentence but its last N tokens) fills the model's cache in one forward; each
of the last N tokens is then run alone against it, as `generate` runs it, with the tracer on
the layer's attention. Each step is compared with the same row of the full, uncached forward
(the attention module's output, seen by a hook) and with the model's own attention weights
(`output_attentions`); the cache's bytes are measured from its tensors and said as
layers x 2 x kv-heads x d_h x dtype size per token.

Imported only for `--hf` (torch and transformers). Never import rich, textual or typer here.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..load.hf import HfError, Loaded, check_layer, first_line
from ..records import Check, DecodeStep, ModuleInfo, Trace
from ..tracing.hf_layers import run_forward
from .decode import step_checks
from .hf import POSITION_KINDS, Session, _attention_stages
from .hf_input import input_stage

RTOL, ATOL = 1e-4, 1e-5


def _cache_keyword(model: Any) -> str:
    """The forward's name for the cache: `cache` (transformers 5), else `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _returned_cache(output: Any) -> Any:
    for name in ("cache", "past_key_values"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    raise HfError("the model returned no KV cache with use_cache=True; --decode needs one")


def _cache_tensors(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (keys, values) as the Cache object holds them."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers
                if getattr(layer, "keys", None) is not None]
    return list(zip(getattr(cache, "key_cache", []), getattr(cache, "value_cache", []),
                    strict=False))


def cache_words(cache: Any, tokens: int) -> tuple[Check, int, tuple[tuple[int, ...], ...], str]:
    """The checkpoint's cache after a step: its bytes measured, and the formula
    layers x 2 x kv-heads x d_h x dtype size per token said beside them."""
    pairs = _cache_tensors(cache)
    total = sum(t.element_size() * t.numel() for pair in pairs for t in pair)
    keys = pairs[0][0]  # (B, h_kv, t, d_h)
    kv_heads, d_h, size = int(keys.shape[1]), int(keys.shape[-1]), keys.element_size()
    per_token = len(pairs) * 2 * kv_heads * d_h * size * int(keys.shape[0])
    dtype = str(keys.dtype).removeprefix("torch.")
    measured = total // max(tokens, 1)
    check = Check(f"the model's KV cache ({type(cache).__name__}) after this step: {len(pairs)} "
                  f"layers x 2 (K and V) x {kv_heads} KV heads x d_h {d_h} x {size} bytes "
                  f"({dtype}) = {per_token} bytes per token; measured {total} bytes for "
                  f"{tokens} tokens = {measured} per token", measured == per_token)
    shapes = tuple(tuple(t.shape) for pair in pairs[:1] for t in pair)
    return check, total, shapes, dtype


def decode_trace(loaded: Loaded, sentence: str, layer: int, steps: int, *,
                 ascii_only: bool = False) -> Trace:
    """The last `steps` tokens of the sentence decoded one at a time against the model's
    cache; the first step's Trace holds every step's (`Trace.steps`)."""
    from ..tracing import record

    check_layer(loaded, layer)
    session = Session(loaded, sentence, ascii_only=ascii_only, one_layer=True)
    ids, tokens = list(session.ids), session.tokens
    T = len(ids)
    if not 1 <= steps < T:
        raise HfError(f"--decode {steps}: the sentence has {T} tokens for this tokenizer; decode "
                      f"between 1 and {T - 1} of them (at least one token is the prompt)")
    model, prefill = loaded.model, T - steps
    keyword = _cache_keyword(model)
    attention = loaded.attention(layer)
    path = loaded.attention_path(layer)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        full = run_forward(loaded, ids, [layer]).layers[layer].output  # (B, T, C), uncached
        try:
            prompt = model(input_ids=torch.tensor([ids[:prefill]]), use_cache=True)
        except (TypeError, ValueError, RuntimeError) as error:  # a forward that keeps no cache
            raise HfError(f"{loaded.info.name}: its forward does not fill a KV cache with "
                          f"use_cache=True ({type(error).__name__}: {first_line(error)}); "
                          "--decode needs one") from None
        cache = _returned_cache(prompt)
    base = session.config(layer)
    traces = []
    for index, position in enumerate(range(prefill, T)):
        result: Any = None

        def around(call: Any) -> Any:
            nonlocal result
            result = record(call, {path: attention})
            if result.error is not None:
                raise HfError(f"{loaded.info.name}: the model's forward raised "
                              f"{type(result.error).__name__}: {first_line(result.error)}")
            return result.value

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = run_forward(loaded, [ids[position]], [layer], around, extra={
                keyword: cache, "use_cache": True, "output_attentions": True})
        cache = _returned_cache(run.value)
        assert base.model is not None
        config = replace(base, model=replace(base.model, tokens=(tokens[position],),
                                             ids=(ids[position],)),
                         cached=tuple(tokens[:position]))
        recording = result.recordings[path]
        stages = _attention_stages(config, recording, run.layers[layer], attention)
        inside = next((stage.title for stage in stages if stage.kind in POSITION_KINDS), "")
        first = input_stage(loaded, run, layer, positions_inside=inside)
        got = torch.from_numpy(recording.snapshot(recording.output).values).double()
        want = full[:, position:position + 1].double()
        max_diff = float((got - want).abs().max())
        equal = bool(torch.allclose(got, want, rtol=RTOL, atol=ATOL))
        cost, total, shapes, dtype = cache_words(cache, position + 1)
        step = DecodeStep(index=index, steps=steps, position=position, prefill=prefill,
                          style=f"the model's own {type(cache).__name__}, passed in as {keyword}",
                          full_row=want[:, 0].float().numpy(), max_diff=max_diff, equal=equal,
                          cache_bytes=None, cache_tokens=position + 1, cache_shapes=shapes,
                          cache_dtype=dtype)
        said = [*step_checks(step), cost]
        weights = _own_weights(run.value, layer)
        softmax = next((s for s in stages if s.kind == "softmax" and s.tensors), None)
        if weights is not None and softmax is not None:
            recorded = np.asarray(softmax.tensors[-1].values)
            same = recorded.shape == weights.shape and bool(np.array_equal(recorded, weights))
            said.append(Check(f"the weights equal the model's own attention weights at this step "
                              f"(output_attentions, layer {layer}, shape {weights.shape}): "
                              f"equal = {same}", same))
        last = stages[-1]
        stages = (*stages[:-1], replace(last, checks=(*last.checks, *said)))
        module = ModuleInfo(class_name=recording.module_class, file=recording.module_file)
        traces.append(Trace(config=config, stages=(first, *stages), module=module,
                            recording=recording, step=replace(step, cache_bytes=total)))
    return replace(traces[0], steps=tuple(traces))


def _own_weights(output: Any, layer: int) -> np.ndarray | None:
    attentions = getattr(output, "attentions", None)
    if not attentions or attentions[layer] is None:
        return None
    return attentions[layer].detach().float().numpy()
