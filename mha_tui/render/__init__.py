"""How a stage and its tensors are drawn: pure Rich renderables, shared by the app, the
transcripts (text, JSON, SVG, HTML, Markdown) and the notebook, so they cannot drift apart.

Values are formatted from the recorded arrays; nothing is recomputed. User text (tokens)
enters only as `Text`, after `text.printable()`, never as markup. Import from the modules:

- `options`: `RenderOptions` (how to draw) and `ASCII_GLYPHS`;
- `text`: user text made safe (`printable`, `label`);
- `values`: head colours, value ramps, one value's text;
- `matrix`: `Axis`, `Matrix` (one matrix that fits the width, the cursor's cell);
- `tensor`: one tensor's matrices and meta line (`TensorView`, `matrix_cell`, `tensor_index`);
- `code`: a stage's source wrapped and highlighted (`wrap_code`, `Code`);
- `stage`: one stage as the transcript prints it and the app lays it out (`stage_view`,
  `stage_screen`, `stage_box`, `pending_screen`, `labelled`);
- `header`: the sentence, tokens and sizes, the model's and the module's lines;
- `why`: how one number was made (`why_view`).

This package imports nothing itself. Never import torch, textual or typer here.
"""
