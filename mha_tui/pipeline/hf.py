"""`--hf`: one model, one sentence, every layer: load -> trace -> recognise, by layer.

`Session` tokenizes the sentence (`load.hf`), runs the model's forward once with the tracer
on each layer's attention and hooks on its input (`tracing.hf_layers`), and builds each
layer's stages: the first (`input_stage`: where the layer's input comes from, from the
model's own tensors) here, the attention's by the recogniser (`pipeline.stages_of`).
Every tensor shown is the model's own; the few checks that recompute something to compare
(a lookup, a sum, the layer norm) say so in their label.

Imported only for `--hf` (it imports torch and, through the loader, transformers).
Never import rich, textual or typer here.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..config import MAX_SEQ_LEN, Config, ModelSource
from ..load.hf import HfError, Loaded, all_layers_limit, check_layer, first_line, tokenize
from ..records import Check, ModuleInfo, Recorded, Recording, Source, Stage, TensorRecord, Trace
from ..tracing.hf_layers import ForwardRun, LayerInput, Line, run_forward
from . import stages_of


def _record(name: str, t: torch.Tensor, dims: tuple[str, ...], *, kind: str = "signed",
            caption: str = "", source: tuple[str, torch.Tensor] | None = None) -> TensorRecord:
    """A window onto the model's own tensor (no copy, no recomputation)."""
    t = t.detach()
    return TensorRecord(
        name=name, dims=dims, values=t.numpy(), strides=tuple(t.stride()),
        contiguous=t.is_contiguous(),
        shares_storage=None if source is None else (
            t.untyped_storage().data_ptr() == source[1].untyped_storage().data_ptr()),
        shares_with=source[0] if source else "", kind=kind,  # type: ignore[arg-type]
        caption=caption,
    )


def _code(*lines: Line | None) -> str:
    """The model's own lines, each with the file and line number it was read from."""
    shown = [line for line in lines if line is not None and line.text]
    width = max((len(line.text) for line in shown), default=0)
    return "\n".join(f"{line.text:<{width}}  # {os.path.basename(line.file)}:{line.line}"
                     for line in shown)


def input_stage(loaded: Loaded, run: ForwardRun, layer: int) -> Stage:
    """Where layer L's attention input comes from: embeddings, residual stream, layer norm.

    Every tensor is one the model computed (captured by hooks); the checks recompute a
    lookup, a sum and the layer norm only to compare, and say so.
    """
    info, captured = loaded.info, run.layers[layer]
    T = run.ids.shape[1]
    tokens, positions = run.token_embeddings, run.position_embeddings
    token_table = loaded.model.get_input_embeddings().weight
    x = captured.attention_input
    BTC = ("B", "T", "C")
    records = [
        _record("input_ids", run.ids, ("B", "T"), kind="int",
                caption=f"the tokenizer's ids, one per token (vocabulary of {info.vocab_size})"),
        _record(f"{run.token_name}(input_ids)", tokens, BTC,
                caption=f"token embeddings: row t is row input_ids[t] of {run.token_name}.weight"),
    ]
    checks = [Check(f"row t of the token embeddings is row input_ids[t] of {run.token_name}.weight "
                    f"for all {T} tokens", torch.equal(tokens[0], token_table[run.ids[0]]))]
    if positions is not None and run.position_name is not None:
        position_table = loaded.model.get_submodule(run.position_name).weight
        records.append(_record(f"{run.position_name}(position_ids)", positions, BTC,
                               caption=f"position embeddings: row t is row t of "
                                       f"{run.position_name}.weight, whatever the token"))
        checks.append(Check(f"row t of the position embeddings is row t of "
                            f"{run.position_name}.weight, t = 0..{T - 1}",
                            torch.equal(positions.reshape(T, -1), position_table[:T])))
        summed = tokens + positions  # recomputed only for the check below
        checks.append(Check("block 0's input is token + position embeddings "
                            "(recomputed by mha-tui for this check; dropout is off in eval mode): "
                            f"torch.equal = {torch.equal(run.embedded, summed)}",
                            torch.equal(run.embedded, summed)))
    records.append(_record(f"{loaded.blocks_path}.0 input", run.embedded, BTC,
                           caption="the residual stream as it enters the first block"))
    if layer > 0:
        records.append(_record(
            f"{loaded.blocks_path}.{layer} input", captured.residual, BTC,
            caption=f"the residual stream after {layer} block{'s' if layer > 1 else ''}: "
                    f"the embeddings plus every earlier block's attention and MLP outputs"))
        checks.append(Check(
            f"spread (std) of the residual stream: {run.embedded.std().item():.4f} entering "
            f"block 0 -> {captured.residual.std().item():.4f} entering block {layer}", None))
    norm = captured.norm_name
    if norm is not None and captured.norm is not None:
        records.append(_record(f"x = {norm}(hidden_states)", x, BTC,
                               caption=f"layer {layer}'s layer norm: what the attention module "
                                       f"receives as x"))
        with torch.no_grad():
            again = captured.norm(captured.residual)  # recomputed only for the check
        checks.append(Check(f"x is {norm} applied to block {layer}'s input (recomputed by "
                            f"mha-tui for this check): torch.equal = {torch.equal(x, again)}",
                            torch.equal(x, again)))
    else:
        records.append(_record("x", x, BTC, caption="what the attention module receives"))
    source = (f"layer {layer}'s input" if norm is None
              else f"the residual stream through {norm}")
    explanation = (
        f"The tokenizer cut the sentence into {T} tokens. {run.token_name} turns each id into a "
        f"learned row of C={info.embed_dim} numbers (what the token is)"
        + (f", and {run.position_name} adds a row for its position (where it is)"
           if positions is not None else "; positions are not added here")
        + ". That sum enters block 0. Each block adds its attention and MLP outputs back onto "
          "this residual stream, so layer " + str(layer) + " reads the stream after "
        + str(layer) + f" block{'s' if layer != 1 else ''}"
        + (f"; its layer norm {norm} rescales every token's C numbers before attention sees "
           "them." if norm else ".")
    )
    return Stage(
        id="embed", title=f"Where layer {layer}'s input comes from: {source}",
        code=_code(run.token_line, run.position_line, captured.residual_line, captured.norm_line),
        explanation=explanation, shape_in=tuple(run.ids.shape), shape_out=tuple(x.shape),
        dims_in=("B", "T"), dims_out=BTC, tensors=tuple(records), checks=tuple(checks),
        kind="embed", source=_source(captured.norm_line or captured.attention_line),
    )


def _source(line: Line) -> Source:
    """The model's statement at line, as the tracer reads statements."""
    from ..tracing.torch_ops import source_at

    return source_at(line.file, line.line) if line.file else Source(file="", line=0, text="")


# ---------------------------------------------------------------- a sentence, every layer


class Session:
    """One model and one sentence: configs and traces by layer, each from the model's forward.

    While the sentence has at most all_layers_limit tokens, the first trace asked for runs
    the forward once and records every layer; longer sentences record only the layer asked
    for (one forward per layer visited, the previous layer's records dropped).
    """

    def __init__(self, loaded: Loaded, sentence: str, *, ascii_only: bool = False,
                 one_layer: bool = False) -> None:
        """one_layer: record only the layer asked for (a transcript shows one layer)."""
        self.loaded = loaded
        self.sentence = sentence
        self.ids, self.tokens = tokenize(loaded, sentence, ascii_only=ascii_only)
        self.limit = all_layers_limit(loaded.info)
        self.all_layers = len(self.ids) <= self.limit and not one_layer
        self._traces: dict[int, Trace] = {}
        self._lock = threading.Lock()

    @property
    def n_layers(self) -> int:
        return self.loaded.info.n_layers

    def config(self, layer: int) -> Config:
        info = self.loaded.info
        model = ModelSource(
            name=info.name, class_name=info.class_name, layer=layer, n_layers=info.n_layers,
            vocab_size=info.vocab_size, tokens=self.tokens, ids=tuple(self.ids),
            all_layers_limit=self.limit, attention=self.loaded.attention_path(layer),
        )
        return Config(self.sentence, embed_dim=info.embed_dim, num_heads=info.num_heads,
                      max_seq_len=min(MAX_SEQ_LEN, max(len(self.ids), info.max_positions or 0)),
                      model=model)

    def recorded(self, layer: int) -> bool:
        """Whether layer's trace is ready (moving there costs no forward pass)."""
        return layer in self._traces

    def trace(self, layer: int) -> Trace:
        check_layer(self.loaded, layer)
        with self._lock:
            if layer not in self._traces:
                layers = range(self.n_layers) if self.all_layers else [layer]
                traces = trace_layers(self.loaded, self, layers)
                if not self.all_layers:
                    self._traces.clear()
                self._traces.update(traces)
            return self._traces[layer]


def trace_layers(loaded: Loaded, session: Session, layers: Sequence[int]) -> dict[int, Trace]:
    """Run the model's forward once, recording the attention of every layer in layers."""
    from ..tracing import record

    roots = {loaded.attention_path(layer): loaded.attention(layer) for layer in layers}
    result: Any = None

    def around(call: Callable[[], Any]) -> Any:
        nonlocal result
        result = record(call, roots)
        if result.error is not None:
            raise HfError(f"{loaded.info.name}: the model's forward raised "
                          f"{type(result.error).__name__}: {first_line(result.error)}")
        return result.value

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_forward(loaded, session.ids, layers, around)
    traces = {}
    for layer in layers:
        config = session.config(layer)
        recording = result.recordings[loaded.attention_path(layer)]
        stages = _attention_stages(config, recording, run.layers[layer], loaded.attention(layer))
        module = ModuleInfo(class_name=recording.module_class, file=recording.module_file)
        traces[layer] = Trace(config=config, stages=(input_stage(loaded, run, layer), *stages),
                              module=module, recording=recording)
    return traces


def _attention_stages(config: Config, recording: Recording, captured: LayerInput,
                      attention: nn.Module) -> tuple[Stage, ...]:
    """The recogniser's stages for one layer's recorded attention forward, and a last check:
    the recorded output is the very tensor the module returned inside the model's forward."""
    n_params = sum(p.numel() for p in attention.parameters())
    stages = stages_of(Recorded(recording, config, n_params=n_params))
    if recording.output is None or not stages:
        return stages
    recorded = torch.from_numpy(recording.snapshot(recording.output).values)
    same = bool(torch.equal(recorded, captured.output))
    check = Check(f"the last tensor equals the output the attention module returned inside the "
                  f"model's forward (seen by a forward hook): torch.equal = {same}", same)
    return (*stages[:-1], replace(stages[-1], checks=(*stages[-1].checks, check)))
