"""A Hugging Face model's forward, run once, with hooks on each layer's input (`--hf`).

`run_forward` runs the model's own forward on the tokenizer's ids and keeps, with forward
hooks, where each attention layer's input comes from: every embedding and layer norm the
model calls before its first block (token, position, token-type embeddings, BERT's
embeddings.LayerNorm), the residual stream entering the block, the layer norm's output, and
the attention module's own output. Hooks only keep references to the tensors the model made; the tracer
(`tracing.record`, passed in as `around`) records the attention forwards during the same run.

It records: it neither loads (the model comes from `mha_tui.load.hf`) nor recognises (the
stages are built in `mha_tui.pipeline.hf`). Never import rich, textual, typer or transformers.
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from ..load.hf_error import HfError


class LayeredModel(Protocol):
    """A loaded model and its blocks, as `mha_tui.load.hf.Loaded` holds them."""

    model: nn.Module
    blocks: Sequence[nn.Module]

    def attention(self, layer: int) -> nn.Module: ...


@dataclass(frozen=True)
class Line:
    """A statement of the model's own code that called a submodule: file, line, text."""

    file: str
    line: int
    text: str


_TORCH_DIR = os.path.dirname(torch.__file__)


def _caller() -> Line:
    """The first frame outside torch: the model's line that called the hooked module."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return Line("", 0, "")
    file, line = frame.f_code.co_filename, frame.f_lineno
    return Line(file, line, linecache.getline(file, line).strip())


@dataclass(eq=False)
class LayerInput:
    """Where one attention layer's input came from, as the model computed it (no grad)."""

    residual: torch.Tensor  # (B, T, C) the residual stream entering the block
    residual_line: Line  # the model's line that called the block
    attention_input: torch.Tensor  # (B, T, C) what the attention module received
    norm_name: str | None  # the block's layer norm whose output that is
    norm: nn.Module | None
    norm_line: Line | None
    # (B, T, C) what that norm read: the block's input, or in a decoder layer's
    # cross-attention the stream after the layer's self-attention; None with no norm
    norm_input: torch.Tensor | None
    attention_line: Line  # the block's line that called the attention module
    output: torch.Tensor  # (B, T, C) the attention module's own output
    weights: torch.Tensor | None  # (B, h, T, T) the attention weights it returned


@dataclass(eq=False)
class EmbeddingCall:
    """An embedding module the model called before its first block, and what it returned."""

    path: str  # the module's path in the model, e.g. transformer.wpe
    module: nn.Embedding
    output: torch.Tensor  # (B, T, C)
    line: Line  # the model's line that called it
    tokens: bool  # its table is the model's input embeddings (get_input_embeddings)


@dataclass(eq=False)
class NormCall:
    """A layer norm the model called before its first block (BERT's embeddings.LayerNorm)."""

    path: str
    module: nn.Module
    input: torch.Tensor  # (B, T, C)
    output: torch.Tensor  # (B, T, C)
    line: Line


@dataclass(eq=False)
class ForwardRun:
    """The model's own forward on the ids, and what the hooks saw."""

    ids: torch.Tensor  # (B, T)
    embeddings: tuple[EmbeddingCall, ...]  # in the order the model called them
    embedding_norms: tuple[NormCall, ...]  # in the order the model called them
    embedded: torch.Tensor  # (B, T, C) what entered the first block
    embedded_line: Line
    layers: dict[int, LayerInput]
    value: Any = None  # what the model's forward returned


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    value = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(value, torch.Tensor):
        raise HfError("the attention layer was not called with a hidden-states tensor; "
                      "mha-tui cannot explain this model")
    return value


def is_norm(path: str, module: nn.Module) -> bool:
    """A layer norm, by its class (LayerNorm, RMSNorm, T5LayerNorm) or GPT-2's ln_ names."""
    return "norm" in type(module).__name__.lower() or path.rsplit(".", 1)[-1].startswith("ln")


def run_forward(loaded: LayeredModel, ids: Sequence[int], layers: Sequence[int],
                around: Callable[[Callable[[], Any]], Any] | None = None,
                forward: Callable[[torch.Tensor], Any] | None = None, *,
                extra: dict[str, Any] | None = None) -> ForwardRun:
    """Run the model's own forward once; hooks keep every named layer's input and output.

    around(call) runs call() (the model's forward) and may watch it (the tracer): the model
    is never run twice. Hooks only keep references to the tensors the model made.
    forward(ids): how the model is called on the ids (B, T) (default
    `model(input_ids=ids, use_cache=False)`; an encoder-decoder's decoder gets them as
    decoder_input_ids beside the encoder's output). extra: more keywords for the model's
    forward (a decode step's cache, use_cache=True).
    """
    model = loaded.model
    seen: dict[str, tuple[Any, Line]] = {}
    handles = []

    def after(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            seen.setdefault(key, (output, _caller()))
            if args:
                seen.setdefault(f"{key}.input", (args[0], _caller()))
        return hook

    def before(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen.setdefault(key, (_hidden(args, kwargs), _caller()))
        return hook

    # Every embedding and layer norm outside the layers, as called before block 0: what the
    # first block's input is made of (the first stage finds how from the values).
    token_table = model.get_input_embeddings().weight
    in_blocks = {id(sub) for block in loaded.blocks for sub in block.modules()}
    started: list[bool] = []
    embeddings: list[EmbeddingCall] = []
    embedding_norms: list[NormCall] = []

    def embedding(path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not started and isinstance(output, torch.Tensor):
                embeddings.append(EmbeddingCall(path, module, output, _caller(),  # type: ignore[arg-type]
                                                module.weight is token_table))
        return hook

    def norm_before(path: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not started and args and isinstance(args[0], torch.Tensor) and isinstance(
                    output, torch.Tensor):
                embedding_norms.append(NormCall(path, module, args[0], output, _caller()))
        return hook

    for path, module in model.named_modules():
        if id(module) in in_blocks:
            continue
        if isinstance(module, nn.Embedding):
            handles.append(module.register_forward_hook(embedding(path)))
        elif path and is_norm(path, module):
            handles.append(module.register_forward_hook(norm_before(path)))
    handles.append(loaded.blocks[0].register_forward_pre_hook(before("embedded"), with_kwargs=True))
    handles.append(loaded.blocks[0].register_forward_pre_hook(
        lambda module, args: started.append(True)))
    norms: dict[int, list[tuple[str, nn.Module]]] = {}
    for layer in layers:
        block = loaded.blocks[layer]
        attention = loaded.attention(layer)
        handles.append(block.register_forward_pre_hook(before(f"residual{layer}"), with_kwargs=True))
        handles.append(attention.register_forward_pre_hook(before(f"input{layer}"), with_kwargs=True))
        handles.append(attention.register_forward_hook(after(f"output{layer}")))
        # The norm whose output the attention receives: a child of the block (GPT-2's ln_1)
        # or deeper (T5's layer.0.layer_norm), never one inside the attention itself.
        inside = {id(sub) for sub in attention.modules()}
        norms[layer] = [(name, child) for name, child in block.named_modules()
                        if name and id(child) not in inside and is_norm(name, child)]
        for name, child in norms[layer]:
            handles.append(child.register_forward_hook(after(f"norm{layer}.{name}")))
    batch = torch.tensor([list(ids)])  # (B, T)

    def call() -> Any:
        if forward is not None:
            return forward(batch)
        return model(input_ids=batch, **{"use_cache": False, **(extra or {})})

    try:
        with torch.no_grad():
            value = call() if around is None else around(call)
    finally:
        for handle in handles:
            handle.remove()

    run_layers = {}
    for layer in layers:
        attention_input, attention_line = seen[f"input{layer}"]
        norm_name, norm, norm_line, norm_input = None, None, None, None
        for name, child in norms[layer]:
            output, line = seen.get(f"norm{layer}.{name}", (None, None))
            if output is attention_input:
                norm_name, norm, norm_line = name, child, line
                norm_input = seen.get(f"norm{layer}.{name}.input", (None, None))[0]
        output = seen[f"output{layer}"][0]
        out, weights = (output[0], output[1] if len(output) > 1 else None) if isinstance(
            output, tuple) else (output, None)
        run_layers[layer] = LayerInput(
            residual=seen[f"residual{layer}"][0], residual_line=seen[f"residual{layer}"][1],
            attention_input=attention_input, norm_name=norm_name, norm=norm, norm_line=norm_line,
            norm_input=norm_input if isinstance(norm_input, torch.Tensor) else None,
            attention_line=attention_line, output=out,
            weights=weights if isinstance(weights, torch.Tensor) else None)
    if not any(call.tokens for call in embeddings):
        raise HfError("the model's forward never looked its tokens up in its input embeddings "
                      "before the first layer; mha-tui cannot explain this model")
    return ForwardRun(
        ids=batch, embeddings=tuple(embeddings), embedding_norms=tuple(embedding_norms),
        embedded=seen["embedded"][0], embedded_line=seen["embedded"][1], layers=run_layers,
        value=value,
    )
