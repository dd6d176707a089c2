"""pipeline.whole: a whole model (--hf, --model induction) is loaded and traced from a
Request that names its Checkpoint, whatever the caller; the CLI only builds the Request."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mha_tui.config import Config
from mha_tui.load import trained
from mha_tui.pipeline import traced, whole
from mha_tui.pipeline.hf import Session
from mha_tui.records.request import Checkpoint, Request
from mha_tui.write.dump import to_json

SENTENCE = "a b c d a b c d"


def test_importing_it_imports_neither_torch_nor_transformers() -> None:
    code = ("import sys, mha_tui.pipeline.whole; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_checkpoints_layer_is_the_trace_of_that_layer() -> None:
    request = Request(checkpoint=Checkpoint("induction", SENTENCE, trained=True, layer=1))
    assert whole.refused_early(request) is None  # a model trained here has no files to read
    shown = whole.session(request)
    trace = whole.traced(request, shown)
    assert trace.config.model is not None and trace.config.model.layer == 1
    by_hand = Session(trained.load("induction", SENTENCE), SENTENCE).trace(1)
    assert to_json(trace) == to_json(by_hand)


def test_the_model_view_is_the_sessions_model_on_its_sentence() -> None:
    shown = whole.session(Request(checkpoint=Checkpoint("induction", SENTENCE, trained=True)))
    view = whole.model_view(shown, ablate=(1, 0))
    assert view.tokens == tuple(SENTENCE.split())
    assert view.ablation is not None and (view.ablation.layer, view.ablation.head) == (1, 0)


def test_whole_trace_is_the_checkpoints_layer_and_the_other_door_refuses_it() -> None:
    """whole.trace(Request(checkpoint=...)) is the checkpoint's layer, refused early, loaded
    and traced; pipeline.traced, which the app and the notebook import, refuses such a
    request (it never imports transformers)."""
    request = Request(checkpoint=Checkpoint("induction", SENTENCE, trained=True, layer=1))
    assert to_json(whole.trace(request)) == to_json(whole.traced(request, whole.session(request)))
    other = whole.trace(Request(checkpoint=Checkpoint("induction", SENTENCE, trained=True)))
    assert other.config.model is not None and other.config.model.layer == 0
    assert to_json(other) != to_json(whole.trace(request))
    with pytest.raises(ValueError, match=r"pipeline\.whole"):
        traced(request)


def test_a_request_names_a_module_built_here_or_a_whole_model() -> None:
    """A whole model's request has no Config (its sizes are its own): the sentence a Config
    refuses (here: more tokens than --max-seq-len) is the tokenizer's to judge. A request
    names exactly one of the two, and only one built here travels as JSON."""
    long = " ".join(["a b"] * 40)  # 80 words: above Config's --max-seq-len 64
    request = Request(checkpoint=Checkpoint("induction", long, trained=True))
    assert request.config is None
    with pytest.raises(ValueError, match="exactly one"):
        Request()
    with pytest.raises(ValueError, match="exactly one"):
        Request(Config("a b"), checkpoint=request.checkpoint)
    with pytest.raises(ValueError, match="travels as JSON"):
        request.as_json()
    with pytest.raises(ValueError, match="a whole model"):
        whole.session(Request(Config("a b")))
