"""`mha-tui heads`: one run of a whole model on a sentence, every head of every layer.

Runs the model's own forward once with the tracer on every layer's attention module, and
keeps each layer's attention weights as its softmax returned them (the recorded op's output:
nothing recomputed); scores every head from them (`mha_tui.roles`); reads the model's
next-token predictions from its logits. With an ablation, runs the forward a second time
with one head removed: a forward pre-hook on the attention's output projection (W_O, GPT-2's
c_proj, o_proj, out_proj) sets that head's slice of its input, d_h channels, to zero or to
its mean over the positions. The module itself is never edited.

Used for `--model induction` (`load.trained`) and `--hf` (`load.hf`): anything with the
`load.hf.Loaded` shape. Never import rich, textual or typer here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from ..load.hf import HfError, Loaded, check_layer, tokenize
from ..ops.vocab import SOFTMAXES
from ..records import Recording, Ref
from ..roles import Ablation, ModelView, Predictions, copyable_positions, head_roles

# Where an attention module keeps its output projection, across this model and the families
# transformers ships (GPT-2: c_proj; Llama, Mistral: o_proj; BART, OPT: out_proj; BERT: dense).
PROJECTION_NAMES = ("W_O", "c_proj", "o_proj", "out_proj", "dense", "o", "out_lin", "proj")
METHODS = ("zero", "mean")


def model_view(loaded: Loaded, sentence: str, *, ascii_only: bool = False,
               ablate: tuple[int, int] | None = None, method: str = "zero") -> ModelView:
    """The whole model on the sentence: every layer's weights, scores and labels, its
    predictions, and (ablate) the predictions with one head removed. Refusals: HfError."""
    ids, tokens = tokenize(loaded, sentence, ascii_only=ascii_only)
    info = loaded.info
    if ablate is not None:
        layer, head = ablate
        check_layer(loaded, layer)
        if not 0 <= head < info.num_heads:
            raise HfError(f"--ablate {layer}.{head}: head {head} is out of range: {info.name} has "
                          f"{info.num_heads} heads a layer, 0 to {info.num_heads - 1}")
        if method not in METHODS:
            raise HfError(f"--ablate-with {method!r}: choose one of {', '.join(METHODS)}")
        if info.encoder:
            raise HfError(f"--ablate compares next-token predictions, and {info.name} is an "
                          f"encoder: it predicts no next token")
    from ..tracing import record

    paths = [loaded.attention_path(layer) for layer in range(info.n_layers)]
    roots = {path: loaded.attention(layer) for layer, path in enumerate(paths)}
    batch = torch.tensor([ids])  # (B, T)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        result = record(lambda: loaded.model(input_ids=batch, use_cache=False), roots)
    if result.error is not None:
        raise HfError(f"{info.name}: the model's forward raised {type(result.error).__name__}: "
                      f"{str(result.error).strip().splitlines()[0] if str(result.error).strip() else ''}")
    weights = tuple(_weights(result.recordings[path], path, len(ids)) for path in paths)
    roles = tuple(head_roles(w, ids, layer) for layer, w in enumerate(weights))
    predictions = None if info.encoder else _predictions(loaded, result.value, ids, ascii_only)
    ablation = None
    if ablate is not None and predictions is not None:
        layer, head = ablate
        projection, hook = _ablating(loaded, layer, head, method)
        with torch.no_grad():
            logits = loaded.model(input_ids=batch, use_cache=False)
        hook.remove()
        ablation = Ablation(layer, head, method, f"{paths[layer]}.{projection}",
                            _predictions(loaded, logits, ids, ascii_only))
    return ModelView(name=info.name, class_name=info.class_name, tokens=tokens, ids=tuple(ids),
                     weights=weights, roles=roles, sources=tuple(paths), predictions=predictions,
                     ablation=ablation, encoder=info.encoder)


def _weights(recording: Recording, path: str, T: int) -> np.ndarray:
    """The layer's attention weights (h, T, T): the output of the last softmax it ran."""
    found = [op for op in recording.ops if op.name in SOFTMAXES and op.outputs]
    for op in reversed(found):
        values = recording.snapshot(Ref("op", op=op.index)).values
        if values.ndim == 4 and values.shape[-2:] == (T, T):
            return np.asarray(values[0], dtype=np.float32)  # (h, T, T), batch row 0
        if values.ndim == 3 and values.shape[-2:] == (T, T):
            return np.asarray(values, dtype=np.float32)  # (h, T, T) or (1, T, T)
    raise HfError(f"{path} computed no softmax of shape (h, {T}, {T}) that mha-tui could see "
                  f"(a fused kernel keeps its weights inside); heads needs the weights")


def _logits(value: Any) -> torch.Tensor:
    logits = value if isinstance(value, torch.Tensor) else getattr(value, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise HfError("the model's forward returned no logits; heads reads next-token predictions")
    return logits


def _predictions(loaded: Loaded, value: Any, ids: list[int], ascii_only: bool) -> Predictions:
    logits = _logits(value)[0].double()  # (T, vocab)
    target = torch.tensor(ids[1:])  # (T-1,)
    loss = float(torch.nn.functional.cross_entropy(logits[:-1], target)) if len(ids) > 1 else 0.0
    probabilities = torch.softmax(logits, dim=-1)  # (T, vocab)
    top = probabilities.argmax(dim=-1)  # (T,)
    copyable = copyable_positions(ids)
    right = [int(top[t]) == ids[t + 1] for t in copyable]
    return Predictions(
        loss=loss, top=tuple(int(i) for i in top), top_words=_words(loaded, top.tolist(), ascii_only),
        top_probability=tuple(float(probabilities[t, i]) for t, i in enumerate(top.tolist())),
        copyable=copyable, accuracy=sum(right) / len(right) if right else None)


def _words(loaded: Loaded, ids: list[int], ascii_only: bool) -> tuple[str, ...]:
    from ..load.hf import readable_token

    tokenizer = loaded.tokenizer
    known = getattr(tokenizer, "vocab", None)
    if isinstance(known, tuple):  # --model induction: the sentence's own words, else #id
        return tuple(known[i] if i < len(known) else f"#{i}" for i in ids)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    byte_level = type(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
                      ).__name__ == "ByteLevel"
    return tuple(readable_token(str(p), byte_level=byte_level, ascii_only=ascii_only) for p in pieces)


def _ablating(loaded: Loaded, layer: int, head: int, method: str
              ) -> tuple[str, torch.utils.hooks.RemovableHandle]:
    """A forward pre-hook on layer's output projection that removes one head's slice."""
    attention = loaded.attention(layer)
    info = loaded.info
    for name in PROJECTION_NAMES:
        projection = getattr(attention, name, None)
        if isinstance(projection, nn.Module):
            break
    else:
        raise HfError(f"{loaded.attention_path(layer)} has no output projection mha-tui knows "
                      f"(looked for {', '.join(PROJECTION_NAMES)}); --ablate needs one")
    d_h = info.head_dim
    start, end = head * d_h, (head + 1) * d_h

    def remove(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        context = args[0]  # (B, T, h * d_h): the heads side by side
        if context.shape[-1] != info.num_heads * d_h:
            raise HfError(f"the input to {name} is {context.shape[-1]} wide, not h * d_h = "
                          f"{info.num_heads * d_h}: mha-tui cannot find head {head}'s slice")
        changed = context.clone()  # the model's own tensor is left as it was
        if method == "zero":
            changed[..., start:end] = 0
        else:
            changed[..., start:end] = context[..., start:end].mean(dim=-2, keepdim=True)
        return (changed, *args[1:])

    hook: Callable[..., Any] = remove
    return name, projection.register_forward_pre_hook(hook)
