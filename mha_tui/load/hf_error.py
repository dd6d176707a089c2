"""The one error of `--hf`: a model, tokenizer or layer mha-tui cannot use.

Its own module so that the loader (`load/hf.py`) and the recorder of a model's layers
(`tracing/hf_layers.py`) raise the same error without the tracer importing the loader
(which imports transformers). Imports nothing.
"""


class HfError(ValueError):
    """A model, tokenizer or layer mha-tui cannot use; the message is one line for the learner."""
