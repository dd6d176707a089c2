"""A Hugging Face model's forward, run once, with hooks on each layer's input (`--hf`).

`run_forward` runs the model's own forward on the tokenizer's ids and keeps, with forward
hooks, where each attention layer's input comes from: the token and position embeddings,
the residual stream entering the block, the layer norm's output, and the attention module's
own output. Hooks only keep references to the tensors the model made; the tracer
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


class Layers(Protocol):
    """A loaded model and its layers, as `mha_tui.load.hf.Loaded` holds them."""

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
    attention_line: Line  # the block's line that called the attention module
    output: torch.Tensor  # (B, T, C) the attention module's own output
    weights: torch.Tensor | None  # (B, h, T, T) the attention weights it returned


@dataclass(eq=False)
class ForwardRun:
    """The model's own forward on the ids, and what the hooks saw."""

    ids: torch.Tensor  # (B, T)
    token_embeddings: torch.Tensor  # (B, T, C)
    token_line: Line
    token_name: str
    position_embeddings: torch.Tensor | None  # (B, T, C), None when positions are rotary
    position_line: Line | None
    position_name: str | None
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


def _position_embedding(loaded: Layers) -> tuple[str, nn.Module] | None:
    for path, module in loaded.model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        if isinstance(module, nn.Embedding) and leaf in ("wpe", "embed_positions",
                                                          "position_embeddings"):
            return path, module
    return None


def _module_path(model: nn.Module, target: nn.Module) -> str:
    return next((path for path, module in model.named_modules() if module is target), "")


def run_forward(loaded: Layers, ids: Sequence[int], layers: Sequence[int],
                around: Callable[[Callable[[], Any]], Any] | None = None) -> ForwardRun:
    """Run the model's own forward once; hooks keep every named layer's input and output.

    around(call) runs call() (the model's forward) and may watch it (the tracer): the model
    is never run twice. Hooks only keep references to the tensors the model made.
    """
    model = loaded.model
    seen: dict[str, tuple[Any, Line]] = {}
    handles = []

    def after(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            seen.setdefault(key, (output, _caller()))
        return hook

    def before(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen.setdefault(key, (_hidden(args, kwargs), _caller()))
        return hook

    token_module = model.get_input_embeddings()
    handles.append(token_module.register_forward_hook(after("tokens")))
    positions = _position_embedding(loaded)
    if positions is not None:
        handles.append(positions[1].register_forward_hook(after("positions")))
    handles.append(loaded.blocks[0].register_forward_pre_hook(before("embedded"), with_kwargs=True))
    norms: dict[int, list[tuple[str, nn.Module]]] = {}
    for layer in layers:
        block = loaded.blocks[layer]
        attention = loaded.attention(layer)
        handles.append(block.register_forward_pre_hook(before(f"residual{layer}"), with_kwargs=True))
        handles.append(attention.register_forward_pre_hook(before(f"input{layer}"), with_kwargs=True))
        handles.append(attention.register_forward_hook(after(f"output{layer}")))
        norms[layer] = [(name, child) for name, child in block.named_children()
                        if "norm" in type(child).__name__.lower() or name.startswith("ln")]
        for name, child in norms[layer]:
            handles.append(child.register_forward_hook(after(f"norm{layer}.{name}")))
    batch = torch.tensor([list(ids)])  # (B, T)

    def call() -> Any:
        return model(input_ids=batch, use_cache=False)

    try:
        with torch.no_grad():
            value = call() if around is None else around(call)
    finally:
        for handle in handles:
            handle.remove()

    run_layers = {}
    for layer in layers:
        attention_input, attention_line = seen[f"input{layer}"]
        norm_name, norm, norm_line = None, None, None
        for name, child in norms[layer]:
            output, line = seen.get(f"norm{layer}.{name}", (None, None))
            if output is attention_input:
                norm_name, norm, norm_line = name, child, line
        output = seen[f"output{layer}"][0]
        out, weights = (output[0], output[1] if len(output) > 1 else None) if isinstance(
            output, tuple) else (output, None)
        run_layers[layer] = LayerInput(
            residual=seen[f"residual{layer}"][0], residual_line=seen[f"residual{layer}"][1],
            attention_input=attention_input, norm_name=norm_name, norm=norm, norm_line=norm_line,
            attention_line=attention_line, output=out,
            weights=weights if isinstance(weights, torch.Tensor) else None)
    position = seen.get("positions")
    return ForwardRun(
        ids=batch, token_embeddings=seen["tokens"][0], token_line=seen["tokens"][1],
        token_name=_module_path(model, token_module),
        position_embeddings=None if position is None else position[0],
        position_line=None if position is None else position[1],
        position_name=None if positions is None else positions[0],
        embedded=seen["embedded"][0], embedded_line=seen["embedded"][1], layers=run_layers,
        value=value,
    )
