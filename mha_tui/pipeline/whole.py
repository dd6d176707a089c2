"""A whole model (a `Request` whose `checkpoint` names it: `--hf PATH_OR_NAME`, `--model
induction`): what the checkpoint's files refuse before torch, then the model loaded into a
`Session` (a trace per layer, `pipeline.hf`), its decode steps, or `heads`' model view;
`trace` runs them in order.

The CLI builds the Request and comes here; it never loads a model itself. Importing this
module imports neither torch nor transformers: each step imports what it runs. Every refusal
is an `HfError` (one line). Never import rich, textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..records.request import Checkpoint, Request

if TYPE_CHECKING:
    from ..records import Trace
    from ..roles import ModelView
    from .hf import Session


def checkpoint_of(request: Request) -> Checkpoint:
    """The whole model a request names (a request for a module built here has none)."""
    if request.checkpoint is None:
        raise ValueError("pipeline.whole runs a request for a whole model (its checkpoint)")
    return request.checkpoint


def trace(request: Request, *, ascii_only: bool = False) -> Trace:
    """The request's checkpoint refused early, loaded, and its layer traced (`--decode N`:
    every step), one layer recorded: a transcript's run, in one call."""
    refused_early(request)
    return traced(request, session(request, ascii_only=ascii_only, one_layer=True),
                  ascii_only=ascii_only)


def refused_early(request: Request) -> int | None:
    """What `--hf`'s files refuse (a missing file, an unknown architecture, a layer out of
    range, too many tokens), before torch or transformers is imported; returns the
    sentence's token count (or a bound above it) when the files say one, for the memory
    estimate. A model trained here, or an encoder-decoder, is refused when it loads."""
    checkpoint = checkpoint_of(request)
    if checkpoint.trained or checkpoint.context is not None:
        return None
    from ..load.hf_files import refuse_early

    return refuse_early(checkpoint.name, checkpoint.sentence, checkpoint.layer)


def session(request: Request, *, ascii_only: bool = False, one_layer: bool = False) -> Session:
    """The model loaded (too many tokens: refused before the weights load) and its layer
    checked: a Session that traces it layer by layer. one_layer: record only the layer
    asked for (a transcript shows one layer)."""
    checkpoint = checkpoint_of(request)
    sentence = checkpoint.sentence
    from ..load.hf import check_layer
    from .hf import Session

    if checkpoint.context is not None:  # an encoder-decoder's decoder layer
        from ..load import hf_seq2seq
        from .hf_cross import CrossSession

        seq2seq = hf_seq2seq.load(checkpoint.name, checkpoint.attention, checkpoint.dtype)
        check_layer(seq2seq, checkpoint.layer)
        return CrossSession(seq2seq, sentence, checkpoint.context, ascii_only=ascii_only,
                            one_layer=one_layer)
    if checkpoint.trained:
        from ..load import trained

        loaded = trained.load(checkpoint.name, sentence)
    else:
        from ..load.hf import load

        loaded = load(checkpoint.name, sentence, stream=checkpoint.stream,
                      dtype=checkpoint.dtype)
    check_layer(loaded, checkpoint.layer)
    return Session(loaded, sentence, ascii_only=ascii_only, one_layer=one_layer)


def traced(request: Request, shown: Session, *, ascii_only: bool = False) -> Trace:
    """The Trace of the checkpoint's layer: its forward (`--decode N`: every step traced against
    the model's own cache, `pipeline.hf_decode`)."""
    checkpoint = checkpoint_of(request)
    if not checkpoint.steps:
        return shown.trace(checkpoint.layer)
    from .hf_decode import decode_trace

    return decode_trace(shown.loaded, checkpoint.sentence, checkpoint.layer,
                        checkpoint.steps, ascii_only=ascii_only)


def model_view(shown: Session, *, ascii_only: bool = False,
               ablate: tuple[int, int] | None = None, method: str = "zero") -> ModelView:
    """`heads`: every layer x head of the session's model on its sentence, and (ablate) the
    predictions with one head removed (`pipeline.heads`)."""
    from .heads import model_view as view

    return view(shown.loaded, shown.sentence, ascii_only=ascii_only, ablate=ablate,
                method=method)
