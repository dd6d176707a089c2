"""Write the benchmark's table into the manual's Performance page (docs/performance.md).

Everything from the "# Performance" heading to the next "## " heading (the whole page) is
replaced by the text below, the run's header line and its table: running the benchmark again
replaces it again, so the page holds exactly one table, the one the last run printed.
"""

from __future__ import annotations

from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
HEADING = "# Performance"

INTRO = """\
`make bench` (or `.venv/bin/python benchmarks/bench.py [--runs N] [--check] [--no-page]`)
measures everything against `python -c "import torch"` in the same run, interleaving the
floor with each command round by round (medians over the rounds), and writes the table
below into this page (`--check` exits 1 when a target is missed; `--no-page` only
prints it). Startup figures are whole processes; the app runs in a 100x32 pseudo-terminal
and reports its first paint and first values through marks it writes when `MHA_TUI_MARKS`
is set; "key -> repaint" is timed inside the app (from the key's handler to the end of the
next screen refresh), "written to the terminal" from writing the key to the pseudo-terminal
to the end of the output it causes, beside a bare Textual app in the same harness. The
bench byte-compiles mha-tui's modules first, as `pip install` does (the floor's torch is
read from its own `.pyc` files). The tracing rows come from `benchmarks/trace_overhead.py`
(the mygpt module at GPT-2 small's sizes, in one process, over the plain forward;
TorchLens's `trace` beside it when the `[bench]` extra is installed), by the wall clock
and in CPU time with one thread; on a
machine others are using, the CPU-time rows are the ones to compare. The `--hf` rows use
a GPT-2 with GPT-2 small's shapes and random weights, built offline by
`benchmarks/hf_rows.py`; those at the shapes of Llama-3.2-1B, Llama-3.2-3B and Llama-3-8B
use checkpoints `benchmarks/hf_shapes.py` builds once into `~/.cache/mha-tui-bench` (bf16
safetensors, random weights; the 8B's all zero, a sparse file), each explained once streamed
and once with `--no-stream`, beside transformers' own bf16 forward with `output_attentions`
on the same 12 tokens (`--only hf_shapes` runs them alone). `--only hf_70b`, never part of
the default run, explains layer 40 of a Llama-3-70B-shaped checkpoint (all zero, 30 sparse
shards of 5 GB, as published) streamed and compares its peak with the estimate `--hf` checks
before loading; measured once on the shared 2-core machine (load about 6.5): 3,025 MiB
(2,580 MiB in the forward) in 668 s, against an estimate of 3,854 MiB; layer 79's forward
took 1,403 s and peaked at 2,605 MiB. Peak memory is each process's own `ru_maxrss`.

`--only hf_shapes`, 2026-11-28 12:09 UTC, commit c80b4c8, one run each, load average 2.3 to
2.8 (a test run beside it), 12 tokens:

| shape, layer | streamed (the default) | `--no-stream` | transformers' bf16 forward, `output_attentions` |
| --- | ---: | ---: | ---: |
| Llama-3.2-1B, 8 | 557 MiB, 12.1 s | 2,799 MiB, 15.7 s | 2,714 MiB, 12.2 s |
| Llama-3.2-3B, 14 | 660 MiB, 13.4 s | 6,596 MiB, 20.0 s | 6,488 MiB, 23.2 s |
| Llama-3-8B (sparse), 16 | 948 MiB, 24.0 s | not run | not run (15 GiB of weights) |

Last run:"""

HOW = """\
How these are reached:
- `--help`/`--version` import neither torch nor textual (a test checks), and Typer is kept
  below the release that pulls in pydantic; a finished transcript exits with `os._exit` after
  flushing, skipping torch's interpreter teardown; the plain transcript never loads Pygments.
- The app imports no torch, NumPy or Pygments before its first frame and loads the trace in
  a worker thread, started once the waiting screen is painted (Python runs one thread at a
  time: the import started earlier delayed the first frames more than it brought the values
  forward); each (stage, view, width) is rendered once into lines, cached, and pre-rendered
  in a thread started after the next frame, so a step only repaints the visible lines.
- The `mha-tui` process opens the app with CPython's garbage collector paused
  (`collector.py`): starting up makes several hundred thousand long-lived objects (Textual,
  the app, then torch in the loading thread) and next to no garbage, and each pass over the
  collector's oldest generation walked all of them holding the GIL (~40 ms before the first
  frame, ~200 ms of torch's import in the app, against ~120 ms in the floor's). It runs
  again, with what the start made frozen out of its passes (`gc.freeze`), before a
  module's own code runs, and in any case once the first forward is done.
- A step is one frame on the terminal: the footer greys its keys in the step's own frame
  (Footer's own update waits for the footer's next idle and came in a second frame, 17-33 ms
  later at Textual's 60 frames a second), and a stage as tall as the pane's overflow hands
  its length to the scrollbar without a layout pass of the whole screen.
- Tracing (`tracing/torch_ops.py`) runs every op unchanged and keeps its output copy-on-write
  (`tracing/snapshots.py`): a tensor is copied only before an op may write into it or hand
  it outside torch, or when something outside the recording can still reach it; the rest of
  the recording are read-only views of the module's own tensors. The forward runs once: a
  second call (the "out equals the module's own forward" check) happens only when the first
  drew random numbers or wrote into its parameters, buffers or input. No reference cycle
  is made while recording, so a recording is freed by its reference count, not by the
  garbage collector.
- The recogniser's checks recompute each product at the operands' own precision (float32)
  and only a product that misses the tolerance again in float64, so every check still
  means what it says; counts and comparisons take one pass each, and the scores' spread is
  NumPy's float64 std bit for bit without a float64 copy of the scores (`ops/numeric.py`).
- While the recogniser and the judge recompute products, NumPy's BLAS runs on the calling
  thread alone (`pipeline/threads.py`, threadpoolctl): torch's OpenMP threads and
  OpenBLAS's are two pools that keep spinning after each call, and on two cores they took
  turns at the same cores (a trace burned several times the CPU time it needs).
- The JSON transcript is streamed into its temporary file tensor by tensor (a slice of at
  most a million values at a time); its float32 text comes from orjson, and the values the
  two spell differently (tiny or huge ones, -inf) are nans in a copy, so that orjson's
  `null`s mark their places and NumPy's own text goes there (`write/floats.py`): the bytes are
  NumPy's `astype(str)`.
- The text transcript formats a matrix's values in one `%` for all its columns (--full),
  each row in one `%`, and hands Rich its plain lines 16 at a time; without colour it checks
  that every line fits instead of letting Rich crop each (a transcript with a line too wide
  is drawn again, cropped). The `mha-tui` command draws it with Python's cycle collector
  off (drawing makes no reference cycle; the collector's passes over the millions of cell
  texts were a quarter of a --full transcript), and imports torch with the collector paused
  until the module is built, as the app does (`collector.py`).
- `--hf` refuses what the checkpoint's own files decide before importing torch or
  transformers (`load/hf_files.py`, `load/hf_tokens.py`): a missing model, config.json or
  tokenizer, a sentence longer than the model's positions, no tokens, `--layer` out of
  range, from config.json and a token count read from tokenizer.json with `tokenizers`,
  counted as the transformers tokenizer `--hf` runs with counts it (its class rebuilt from
  the file: GPT-2's, GPT-NeoX's, Llama's, Qwen2's, Gemma's, T5's, RoBERTa's, BERT's,
  or tokenizer.json as it is; a test proves the count equal over every family of
  `tests/hf_families.py`). A sentence that surely fits is only bounded, from tokenizer.json
  without its vocabulary.
  Where the files do not decide it (another tokenizer class, a slow-only tokenizer, a field
  missing, a special token in the sentence, another transformers major version, an unknown
  model type), transformers decides after its import, as before. It records every layer
  only while they fit in memory (see `--hf`).
- Grading a class (`grade/`) imports torch and mha-tui once, in a fork server that also
  runs one whole check of a tutorial's module (torch's first ops, every lazy import) and then
  freezes its objects out of the collector's reach; each submission is a fork of it, in a
  bubblewrap sandbox of its own (about 0.07 s to build), two at a time on two cores. A class
  of 20 correct submissions took 0.10 x the torch import per submission, sandbox included,
  against 0.56 x when each was a new Python process importing torch (2026-11-28, same
  machine and hour).

What limits the rows that are hard to meet (profiles, 2026-11-23):
- First values in the app and every transcript start with `import torch` (the floor) and
  then build, trace and draw; the tracing rows above are what mha-tui adds to the forward.
- Key -> repaint: with the lines cached, the app's own work per step is about 1 ms; the
  rest is Textual's compositor: every visible line of the stage and the rail goes through
  its style pipeline again (~300 `Strip`s a frame), then about 12 KB are written.
- First paint: importing Textual (its `textual.app` alone brings the command palette's
  module) and Typer is most of it; then four layout passes before the stage pane has its
  width and the waiting line."""


def section(header: str, table: list[str], missed: list[str]) -> str:
    parts = [HEADING, "", INTRO, "", header, "", *table, ""]
    if missed:
        parts += [f"Missed in this run: {'; '.join(missed)}.", ""]
    parts += [HOW, ""]
    return "\n".join(parts)


def write_performance(page: Path, header: str, table: list[str], missed: list[str]) -> None:
    """Replace the page's Performance section (or add it at the end) with this run's."""
    text = page.read_text(encoding="utf-8")
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == HEADING), None)
    new = section(header, table, missed).split("\n")
    if start is None:
        lines += ["", *new]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        lines[start:end] = new
    tmp = page.with_name(page.name + ".bench-tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    tmp.replace(page)
