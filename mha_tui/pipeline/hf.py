"""`--hf`: one model, one sentence, every layer: load -> trace -> recognise, by layer.

`Session` tokenizes the sentence (`load.hf`), runs the model's forward once with the tracer
on each layer's attention and hooks on its input (`tracing.hf_layers`), and builds each
layer's stages: the first (`pipeline.hf_input.input_stage`: where the layer's input comes
from, from the model's own tensors), then the attention's by the recogniser
(`pipeline.recognition.stages_of`).
Every tensor shown is the model's own; the few checks that recompute something to compare
(a lookup, a sum, the layer norm) say so in their label.

Imported only for `--hf` (it imports torch and, through the loader, transformers).
Never import rich, textual or typer here.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ..config import MAX_SEQ_LEN, Config, ModelSource
from ..kinds import position_bias, rotary
from ..kinds.rotary.ntk import named_ntk
from ..load.hf import HfError, Loaded, all_layers_limit, check_layer, first_line, tokenize
from ..records import Check, ModuleInfo, Recorded, Recording, Stage, Trace
from ..tracing.hf_layers import ForwardRun, LayerInput, run_forward
from .hf_input import input_stage
from .recognition import stages_of

# The stages that put positions into attention, named by the first stage when no
# embedding adds positions.
POSITION_KINDS = (rotary.KIND, position_bias.KIND)


# ---------------------------------------------------------------- a sentence, every layer


class Session:
    """One model and one sentence: configs and traces by layer, each from the model's forward.

    While the sentence has at most all_layers_limit tokens, the first trace asked for runs
    the forward once and records every layer; longer sentences record only the layer asked
    for (one forward per layer visited, the previous layer's records dropped).
    """

    def __init__(self, loaded: Loaded, sentence: str, *, ascii_only: bool = False,
                 one_layer: bool = False,
                 tokens: tuple[list[int], tuple[str, ...]] | None = None) -> None:
        """one_layer: record only the layer asked for (a transcript shows one layer).
        tokens: the ids and readable pieces, when the sentence is not tokenized as a causal
        LM's input (an encoder-decoder's decoder input)."""
        self.loaded = loaded
        self.sentence = sentence
        self.ids, self.tokens = tokens or tokenize(loaded, sentence, ascii_only=ascii_only)
        self.limit = all_layers_limit(loaded.info)
        self.all_layers = len(self.ids) <= self.limit and not one_layer
        self._traces: dict[int, Trace] = {}
        self._lock = threading.Lock()

    @property
    def n_layers(self) -> int:
        return self.loaded.info.n_layers

    @property
    def note(self) -> str:
        """What the loader says of how it loaded the model (whole, not streamed: why), or ""."""
        return getattr(self.loaded, "note", "")

    def config(self, layer: int) -> Config:
        info = self.loaded.info
        model = ModelSource(
            name=info.name, class_name=info.class_name, layer=layer, n_layers=info.n_layers,
            vocab_size=info.vocab_size, tokens=self.tokens, ids=tuple(self.ids),
            all_layers_limit=self.limit, attention=self.loaded.attention_path(layer),
            encoder=info.encoder, encoder_of=info.encoder_of, dtype=info.dtype,
            stored_dtype=info.stored_dtype,
        )
        return Config(self.sentence, embed_dim=info.embed_dim, num_heads=info.num_heads,
                      max_seq_len=min(MAX_SEQ_LEN, max(len(self.ids), info.max_positions or 0)),
                      model=model)

    def forward(self) -> Callable[[torch.Tensor], Any] | None:
        """How the model's forward is called on the ids (None: `model(input_ids=ids)`)."""
        return None

    def finished(self, layer: int, run: ForwardRun, recording: Recording,
                 stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
        """Layer's stages, first stage included, with what only this kind of session can
        check added (an encoder-decoder's: hf_cross.CrossSession)."""
        return stages

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
    stream = loaded.stream

    def around(call: Callable[[], Any]) -> Any:
        nonlocal result
        # Streamed, the forward ends after the deepest recorded block (load.hf_stream).
        result = record(stream.until_stopped(call) if stream is not None else call, roots)
        if isinstance(result.error, HfError):
            raise result.error
        if result.error is not None:
            raise HfError(f"{loaded.info.name}: the model's forward raised "
                          f"{type(result.error).__name__}: {first_line(result.error)}")
        return result.value

    with warnings.catch_warnings(), (
            stream.running(session.ids, layers) if stream is not None else nullcontext()):
        warnings.simplefilter("ignore")
        run = run_forward(loaded, session.ids, layers, around, forward=session.forward())
    traces = {}
    for layer in layers:
        config = session.config(layer)
        recording = result.recordings[loaded.attention_path(layer)]
        stages = _attention_stages(config, recording, run.layers[layer], loaded.attention(layer))
        if loaded.info.rope:  # NTK rope scaling, as config.json says it
            stages = named_ntk(stages, dict(loaded.info.rope), len(session.ids))
        module = ModuleInfo(class_name=recording.module_class, file=recording.module_file)
        inside = next((stage.title for stage in stages if stage.kind in POSITION_KINDS), "")
        first = input_stage(loaded, run, layer, positions_inside=inside)
        shown = session.finished(layer, run, recording, (first, *stages))
        traces[layer] = Trace(config=config, stages=shown, module=module, recording=recording)
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
