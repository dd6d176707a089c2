"""`--hf` with `--context`: layer L of an encoder-decoder's decoder, traced like any `--hf` layer.

`CrossSession` is `pipeline.hf.Session` on an encoder-decoder (`load.hf_seq2seq`): the
sentence is the decoder's input and the context the encoder's. The encoder runs once, as
the model's own forward runs it (`model.get_encoder()(input_ids=...)`), and the decoder's
forward gets its output (`encoder_outputs`), the decoder ids and `output_attentions=True`:
the recorded cross-attention reads its keys and values from that very tensor. The stages are
the recogniser's, as for every layer; this module adds what only an encoder-decoder has to
check: the encoder's output in the first stage (the keys' and values' source), and that the
softmax stage's weights are the model's own `cross_attentions[L]` (or
`decoder_attentions[L]` for the decoder's self-attention).

Imported only for `--hf` (torch, and transformers through the loader). Never import rich,
textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..config import MAX_SEQ_LEN, Config
from ..load.hf import all_layers_limit
from ..load.hf_seq2seq import Seq2SeqLoaded, decoder_input, encoder_input
from ..records import Check, Recording, Stage
from ..tracing.hf_layers import ForwardRun
from .hf import Session
from .hf_input import record


class CrossSession(Session):
    """An encoder-decoder, a decoder sentence and a context: configs and traces by layer."""

    def __init__(self, loaded: Seq2SeqLoaded, sentence: str, context: str, *,
                 ascii_only: bool = False, one_layer: bool = False) -> None:
        """one_layer: record only the layer asked for (a transcript shows one layer)."""
        super().__init__(loaded, sentence, ascii_only=ascii_only, one_layer=one_layer,
                         tokens=decoder_input(loaded, sentence, ascii_only=ascii_only))
        self.seq2seq = loaded
        self.context = context
        self.context_ids, self.context_tokens = encoder_input(loaded, context,
                                                              ascii_only=ascii_only)
        longest = max(len(self.ids), len(self.context_ids))
        self.limit = all_layers_limit(loaded.info)
        self.all_layers = longest <= self.limit and not one_layer
        self._encoded: Any = None

    def config(self, layer: int) -> Config:
        config = super().config(layer)
        cross = self.seq2seq.cross
        longest = max(len(self.ids), len(self.context_ids), config.max_seq_len)
        return replace(config, max_seq_len=min(MAX_SEQ_LEN, longest),
                       context=self.context if cross else "",
                       context_labels=self.context_tokens if cross else ())

    def forward(self) -> Callable[[torch.Tensor], Any]:
        """The encoder runs first, alone (its embeddings are not the decoder's input); the
        decoder's forward then reads its output, as the whole model's forward would."""
        model = self.seq2seq.model
        with torch.no_grad():
            self._encoded = model.get_encoder()(input_ids=torch.tensor([self.context_ids]))

        def call(ids: torch.Tensor) -> Any:
            return model(encoder_outputs=self._encoded, decoder_input_ids=ids,  # (B, T_q)
                         use_cache=False, output_attentions=True)
        return call

    def finished(self, layer: int, run: ForwardRun, recording: Recording,
                 stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
        encoded = self._encoded.last_hidden_state  # (B, T_k, C)
        first, *rest = stages
        first = self._with_encoder(first, recording, encoded)
        outputs = run.value
        own = (outputs.cross_attentions if self.seq2seq.cross else outputs.decoder_attentions)
        which = "cross_attentions" if self.seq2seq.cross else "decoder_attentions"
        for index, stage in enumerate(rest):
            if stage.kind != "softmax":
                continue
            weights = own[layer]  # (B, h, T_q, T_k)
            shown = next((t for t in stage.tensors if t.values.shape == tuple(weights.shape)),
                         None)
            same = shown is not None and bool(torch.equal(torch.from_numpy(shown.values),
                                                          weights))
            check = Check(f"these weights are the model's own {which}[{layer}] (its forward with "
                          f"output_attentions=True, eager): torch.equal = {same}", same)
            rest[index] = replace(stage, checks=(*stage.checks, check))
        return (first, *rest)

    def _with_encoder(self, first: Stage, recording: Recording, encoded: torch.Tensor
                      ) -> Stage:
        """The first stage with the encoder's output on the context: what the cross-attention's
        keys and values are made from (the decoder's self-attention does not read it)."""
        T_k = len(self.context_ids)
        name = type(self.seq2seq.model).__name__
        tensors = (*first.tensors,
                   record("encoder(context_ids)", encoded, ("B", "T_k", "C"),
                          caption=f"the encoder's output on the {T_k} context tokens"))
        checks = first.checks
        if self.seq2seq.cross:
            second = [snap for key, snap in recording.inputs
                      if snap.ndim == 3 and tuple(snap.shape) == tuple(encoded.shape)
                      and key != recording.inputs[0][0]]
            same = bool(second) and bool(torch.equal(torch.from_numpy(second[0].values), encoded))
            checks = (*checks, Check(
                f"the cross-attention's second input (its keys' and values' source) is the "
                f"encoder's output on the context: torch.equal = {same}", same))
            said = (f"{name} is an encoder-decoder: the sentence is the decoder's input (the "
                    f"labels shifted right, the decoder start token first) and the context, "
                    f"{T_k} tokens, the encoder's. This layer's cross-attention takes its "
                    f"queries from the decoder's stream above and its keys and values from the "
                    f"encoder's output on the context.")
        else:
            said = (f"{name} is an encoder-decoder: the sentence is the decoder's input and "
                    f"the context, {T_k} tokens, the encoder's. This is the decoder's "
                    f"self-attention: it reads only the decoder's stream (the encoder's output "
                    f"enters in the layer's cross-attention, --attention cross).")
        return replace(first, tensors=tensors, checks=checks,
                       explanation=f"{first.explanation} {said}")
