"""pipeline.whole: a whole model (--hf, --model induction) is loaded and traced from its
Checkpoint, whatever the caller; the CLI only builds the Checkpoint."""

from __future__ import annotations

import subprocess
import sys

from mha_tui.load import trained
from mha_tui.pipeline import whole
from mha_tui.pipeline.hf import Session
from mha_tui.records.request import Checkpoint
from mha_tui.write.dump import to_json

SENTENCE = "a b c d a b c d"


def test_importing_it_imports_neither_torch_nor_transformers() -> None:
    code = ("import sys, mha_tui.pipeline.whole; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_checkpoints_layer_is_the_trace_of_that_layer() -> None:
    checkpoint = Checkpoint("induction", SENTENCE, trained=True, layer=1)
    assert whole.refused_early(checkpoint) is None  # a model trained here has no files to read
    shown = whole.session(checkpoint)
    trace = whole.traced(checkpoint, shown)
    assert trace.config.model is not None and trace.config.model.layer == 1
    by_hand = Session(trained.load("induction", SENTENCE), SENTENCE).trace(1)
    assert to_json(trace) == to_json(by_hand)


def test_the_model_view_is_the_sessions_model_on_its_sentence() -> None:
    shown = whole.session(Checkpoint("induction", SENTENCE, trained=True))
    view = whole.model_view(shown, ablate=(1, 0))
    assert view.tokens == tuple(SENTENCE.split())
    assert view.ablation is not None and (view.ablation.layer, view.ablation.head) == (1, 0)
