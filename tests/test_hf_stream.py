"""`--hf`, streamed (load/hf_stream.py): the blocks are read from the checkpoint one at a time
as the model's own forward reaches them, and the forward ends after the layer shown.

Tiny checkpoints of several families are built here offline (tests/hf_families.py, GPT-2's
Conv1D from tests/hf_models.py, a sharded safetensors checkpoint, a `.bin` one); the streamed
transcripts must be the full load's byte for byte, and only the blocks the layer needs are
ever read. The estimate (budget.hf_*) and the refusals are checked from the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
from typer.testing import CliRunner

from mha_tui import budget
from mha_tui.cli import app
from mha_tui.load import hf
from mha_tui.load.hf_files import exact_tokens, run_shape
from mha_tui.load.hf_stream import Streamer
from mha_tui.pipeline.hf import Session
from mha_tui.render.options import RenderOptions
from mha_tui.write.dump import to_json, to_text

from .hf_families import SENTENCE, build
from .hf_models import save_llama_shaped, save_tiny_gpt2, tiny_gpt2, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
# A small launcher that forks and execs the command: its ru_maxrss is the command's own peak
# (a child of pytest would inherit pytest's).
LAUNCH = ROOT / "benchmarks" / "launch.py"

# A rotary decoder, an encoder whose checkpoint names carry its prefix (bert.), and T5's
# encoder (its embeddings tied to `shared`); GPT-2 (Conv1D, tied head) and a sharded GPT-2
# below. (Every family of hf_families.py streams the same way; these are the kinds.)
FAMILIES = ("llama", "bert", "t5")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's tiny checkpoint, GPT-2 with 3 layers, and a sharded and a .bin GPT-2."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    root = tmp_path_factory.mktemp("stream")
    found = {name: build(name, root / name) for name in FAMILIES}
    found["gpt2"] = save_tiny_gpt2(root / "gpt2")
    tokenizer = tiny_tokenizer()
    model = tiny_gpt2(len(tokenizer), n_layer=3, n_embd=32, seed=1)
    # Shards of at most 20 kB: the 3 blocks and the embeddings land in different files.
    model.save_pretrained(root / "sharded", max_shard_size="20kB")
    tokenizer.save_pretrained(root / "sharded")
    found["sharded"] = root / "sharded"
    # transformers 5 saves safetensors only: the .bin as older checkpoints ship it.
    (root / "bin").mkdir()
    model.config.save_pretrained(root / "bin")
    torch.save(model.state_dict(), root / "bin" / "pytorch_model.bin")
    tokenizer.save_pretrained(root / "bin")
    found["bin"] = root / "bin"
    return found


def _transcripts(directory: Path, layers: tuple[int, ...], *, stream: bool
                 ) -> tuple[list[str], hf.Loaded]:
    loaded = hf.load(str(directory), SENTENCE, stream=stream)
    session = Session(loaded, SENTENCE, one_layer=True)
    texts = []
    for layer in layers:
        trace = session.trace(layer)
        texts.append(to_text(trace, RenderOptions(full=True)) + to_json(trace))
    return texts, loaded


@pytest.mark.parametrize("name", [*FAMILIES, "gpt2", "sharded"])
def test_streamed_transcripts_are_the_full_loads_byte_for_byte(
        checkpoints: dict[str, Path], name: str) -> None:
    """Every layer, visited out of order (the kept block outputs are used on the way back),
    gives the full load's text (--full) and JSON transcripts, byte for byte."""
    directory = checkpoints[name]
    n_layers = hf.load(str(directory)).info.n_layers
    order = (n_layers - 1, *range(n_layers))
    full, _ = _transcripts(directory, order, stream=False)
    streamed, loaded = _transcripts(directory, order, stream=True)
    assert loaded.stream is not None and loaded.note == ""
    for layer, (want, got) in enumerate(zip(full, streamed, strict=True)):
        assert got == want, f"{name}: the transcript of visit {layer} differs"


@pytest.mark.parametrize(("name", "dtype"), [("llama", "bfloat16"), ("t5", "bfloat16"),
                                           ("gemma", "float16")])
def test_a_half_precision_checkpoint_streams_in_its_own_dtype(
        tmp_path: Path, name: str, dtype: str) -> None:
    """A checkpoint shipped in bfloat16 (float16) runs in it streamed as loaded whole (T5 keeps
    some weights in float32 when loaded whole: the streamed model must too), with the same
    transcripts byte for byte."""
    directory = build(name, tmp_path / name, dtype=dtype)
    full, whole = _transcripts(directory, (1, 0), stream=False)
    streamed, loaded = _transcripts(directory, (1, 0), stream=True)
    assert loaded.stream is not None and loaded.info.dtype == dtype
    assert {p.dtype for p in loaded.blocks[0].parameters()} == {
        p.dtype for p in whole.blocks[0].parameters()}
    assert streamed == full


def test_only_the_blocks_before_the_layer_are_read(checkpoints: dict[str, Path]) -> None:
    """Layer 1 of 3: block 1 kept, block 0 read and dropped, block 2 never read; moving to
    layer 2 reuses blocks 0 and 1's kept outputs and reads block 2 alone."""
    loaded = hf.load(str(checkpoints["sharded"]), SENTENCE, stream=True)
    stream = loaded.stream
    assert stream is not None
    blocks = loaded.blocks
    assert all(p.is_meta for block in blocks for p in block.parameters())
    assert not any(p.is_meta for p in loaded.model.get_input_embeddings().parameters())
    session = Session(loaded, SENTENCE, one_layer=True)
    session.trace(1)
    assert stream.reads == [1, 0]
    assert all(p.is_meta for p in blocks[0].parameters())  # dropped after its forward
    assert not any(p.is_meta for p in blocks[1].parameters())  # kept: the layer shown
    assert all(p.is_meta for p in blocks[2].parameters())  # never read
    session.trace(2)
    assert stream.reads == [1, 0, 2]
    assert all(p.is_meta for p in blocks[1].parameters())
    session.trace(0)
    assert stream.reads == [1, 0, 2, 0]


def test_peak_weights_are_the_embeddings_and_two_blocks(checkpoints: dict[str, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The parameters in memory, counted after every block read, never pass what lies
    outside the blocks plus two blocks."""
    loaded = hf.load(str(checkpoints["sharded"]), SENTENCE, stream=True)
    stream = loaded.stream
    assert stream is not None
    peaks: list[int] = []
    read_block = Streamer._read_block

    def counted(self: Streamer, index: int) -> None:
        read_block(self, index)
        peaks.append(self.resident_bytes())

    monkeypatch.setattr(Streamer, "_read_block", counted)
    outside = stream.resident_bytes()
    block = sum(p.numel() * p.element_size() for p in hf.load(
        str(checkpoints["sharded"])).blocks[0].parameters())
    Session(loaded, SENTENCE, one_layer=True).trace(2)
    assert len(peaks) == 3 and max(peaks) <= outside + 2 * block
    assert max(peaks) > outside + block  # two blocks at once: block 2 kept, one streamed
    # The estimate: in the stored dtype the blocks are mapped, and only the pages a forward
    # reads count, one block at a time (block 2 is mapped from the start but read last);
    # converted to another dtype (here float16), each is a copy, two at once.
    shape = run_shape(str(checkpoints["sharded"]), None, SENTENCE, None)
    assert shape is not None and shape.block_elements == (block // 4,) * 3
    mapped = budget.hf_streamed_bytes(shape, 2) - budget.hf_streamed_bytes(shape, 0)
    assert 0 < mapped < block // 2  # the kept outputs of blocks 0 and 1 only
    shape = run_shape(str(checkpoints["sharded"]), None, SENTENCE, 2)
    assert shape is not None
    converted = budget.hf_streamed_bytes(shape, 2) - budget.hf_streamed_bytes(shape, 0)
    assert converted >= block // 2  # one float16 block more


def test_a_bin_checkpoint_is_loaded_whole_and_says_so(checkpoints: dict[str, Path]) -> None:
    """A .bin is never read tensor by tensor (it is a pickle, read with weights_only=True by
    transformers): the full load, a note saying why, the same transcript."""
    streamed, loaded = _transcripts(checkpoints["bin"], (1,), stream=True)
    assert loaded.stream is None
    assert "loaded whole, not streamed" in loaded.note and ".bin" in loaded.note
    full, _ = _transcripts(checkpoints["bin"], (1,), stream=False)
    assert streamed == full


def test_the_cli_streams_and_no_stream_loads_whole(checkpoints: dict[str, Path],
                                                   tmp_path: Path) -> None:
    runner = CliRunner()
    out = {}
    for flag in ((), ("--no-stream",)):
        target = tmp_path / f"{len(flag)}.txt"
        result = runner.invoke(app, ["explain", SENTENCE, "--hf", str(checkpoints["llama"]),
                                     "--layer", "1", *flag, "--dump", str(target)])
        assert result.exit_code == 0, result.output
        out[flag] = target.read_bytes()
    assert out[()] == out[("--no-stream",)]
    result = runner.invoke(app, ["explain", SENTENCE, "--hf", str(checkpoints["bin"]),
                                 "--dump", str(tmp_path / "bin.txt")])
    assert result.exit_code == 0
    assert result.stderr.startswith("mha-tui: note: ") and "not streamed" in result.stderr


# ---------------------------------------------------------------- estimate, then refuse


def _shape(directory: str) -> budget.HfShape:
    """The run's sizes with the sentence's exact token count (the CLI counts it before it
    refuses)."""
    tokens = len(hf.load(directory).tokenizer(SENTENCE)["input_ids"])
    shape = run_shape(directory, tokens, SENTENCE)
    assert shape is not None
    return shape


def _refusal(args: list[str], monkeypatch: pytest.MonkeyPatch, *, memory: int | None = None,
             disk: int | None = None) -> str:
    if memory is not None:
        monkeypatch.setattr(budget, "available_memory",
                            lambda: budget.Available(memory, "MemAvailable in /proc/meminfo"))
    if disk is not None:
        monkeypatch.setattr(budget, "free_disk", lambda folder: disk)
    result = CliRunner().invoke(app, ["explain", SENTENCE, *args])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    stderr = result.stderr
    assert stderr.count("\n") == 1 and stderr.startswith("mha-tui: error: "), stderr
    return stderr


def test_too_little_memory_is_refused_in_one_line_with_both_figures(
        checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = str(checkpoints["sharded"])
    shape = _shape(directory)
    streamed = budget.hf_streamed_bytes(shape, 2)
    whole = budget.hf_whole_bytes(shape)
    assert streamed is not None and streamed < whole
    target = tmp_path / "never.json"
    # Between the two: --no-stream is refused, and streaming is the option that fits.
    line = _refusal(["--hf", directory, "--layer", "2", "--no-stream", "--format", "json",
                     "--dump", str(target)], monkeypatch, memory=(streamed + whole) // 2)
    assert budget.human(whole) in line and budget.human(streamed) in line
    assert "without --no-stream (streamed) it fits" in line
    assert not target.exists()
    # Below layer 2's need but above layer 0's: an earlier layer fits.
    layer0 = budget.hf_streamed_bytes(shape, 0)
    assert layer0 is not None and layer0 < streamed
    line = _refusal(["--hf", directory, "--layer", "2", "--dump", str(target)], monkeypatch,
                    memory=(layer0 + streamed) // 2)
    assert "--layer" in line and "fits" in line and budget.human(streamed) in line
    assert not target.exists()
    line = _refusal(["--hf", directory, "--dump", str(target)], monkeypatch, memory=1 << 20)
    assert "no layer or sentence fits" in line and "1.0 MiB is available" in line


def test_a_json_transcript_too_big_for_the_disk_is_refused(
        checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = str(checkpoints["llama"])
    shape = _shape(directory)
    need = budget.hf_json_bytes(shape)
    target = tmp_path / "t.json"
    line = _refusal(["--hf", directory, "--format", "json", "--dump", str(target)],
                    monkeypatch, disk=need // 2)
    assert budget.human(need) in line and budget.human(need // 2) in line
    assert not target.exists()
    # The estimate is above the real size (about 11 bytes a value, never short).
    monkeypatch.undo()
    result = CliRunner().invoke(app, ["explain", SENTENCE, "--hf", directory, "--format", "json",
                                      "--dump", str(target)])
    assert result.exit_code == 0
    size = target.stat().st_size
    assert size <= need <= 20 * size


def test_the_estimate_counts_blocks_from_the_headers(checkpoints: dict[str, Path]) -> None:
    """The files' headers give each block's elements: the model's own count, block by block."""
    for name in ("llama", "gpt2", "sharded"):
        loaded = hf.load(str(checkpoints[name]))
        shape = run_shape(str(checkpoints[name]), None, SENTENCE)
        assert shape is not None
        assert shape.block_elements == tuple(
            sum(p.numel() for p in block.parameters()) for block in loaded.blocks)
        own = {id(p): p.numel() for p in loaded.model.parameters()}
        assert shape.elements >= sum(own.values())


async def test_the_app_moves_between_streamed_layers_reading_one_block(
        checkpoints: dict[str, Path]) -> None:
    """In the app, `]` and `[` to another layer run the model's forward again with the
    blocks before it skipped (their outputs kept): only the new layer's block is read."""
    from mha_tui.app.explain import ExplainApp

    loaded = hf.load(str(checkpoints["sharded"]), SENTENCE, stream=True)
    assert loaded.stream is not None
    session = Session(loaded, SENTENCE)
    session.all_layers = False  # one layer per forward, as for a long sentence
    app = ExplainApp(session.config(1), loader=lambda config: session.trace(1), layers=session)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.trace is None:
            await pilot.pause(0.05)
        assert loaded.stream.reads == [1, 0]
        for key, layer in [("right_square_bracket", 2), ("left_square_bracket", 1)]:
            await pilot.press(key)
            while app.config.model is None or app.config.model.layer != layer:
                await pilot.pause(0.05)
        assert loaded.stream.reads == [1, 0, 2, 1]  # block 0 is never read again
    full = Session(hf.load(str(checkpoints["sharded"]), SENTENCE), SENTENCE, one_layer=True)
    for layer in (1, 2):
        assert to_json(session.trace(layer)) == to_json(full.trace(layer))


@pytest.fixture(scope="module")
def sparse_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bfloat16 Llama whose weights outweigh the interpreter: a 250 MB embedding table
    (128,000 x 1,024) and 3 blocks of 53 MB, all zero, as a sparse file (no disk)."""
    sizes = dict(vocab_size=128000, hidden_size=1024, intermediate_size=8192,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                 num_hidden_layers=3, max_position_embeddings=512, bos_token_id=0,
                 eos_token_id=0, tie_word_embeddings=False)
    return save_llama_shaped(tmp_path_factory.mktemp("sparse") / "llama", sizes, sparse=True)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "element_bytes"), [("auto", None), ("float32", 4)])
def test_the_streamed_estimate_is_a_measured_peak_with_a_margin(
        sparse_llama: Path, tmp_path: Path, dtype: str, element_bytes: int | None) -> None:
    """The CLI's streamed run of layer 2, in its own process: its peak memory (ru_maxrss)
    is below the estimate, and the estimate at most 1.35 x the peak (it counted the whole
    embedding table and two blocks before: 1.8 x). In bfloat16 the file is mapped (only the
    rows and the block read count); in float32 every weight read is a converted copy."""
    directory = str(sparse_llama)
    tokens = len(hf.load(directory).tokenizer(SENTENCE)["input_ids"])
    shape = run_shape(directory, tokens, SENTENCE, element_bytes)
    assert shape is not None
    estimate = budget.hf_streamed_bytes(shape, 2)
    assert estimate is not None
    result = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, "-I", "-S", str(LAUNCH), str(result), sys.executable, "-m", "mha_tui",
         "explain", SENTENCE, "--hf", directory, "--layer", "2", "--dtype", dtype, "--dump",
         str(tmp_path / "out.txt")], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    peak = json.loads(result.read_text())["max_rss_kib"] * 1024
    assert peak <= estimate <= 1.35 * peak, (budget.human(peak), budget.human(estimate))


def test_a_checkpoint_that_cannot_stream_is_loaded_whole_only_where_it_fits(
        checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Streaming that fails once loading has begun (a shard too big to map: torch maps each
    file whole) falls back to the full load only when the full load's estimate fits: the
    CLI's check before torch counted the run streamed."""
    from mha_tui.load import hf_stream

    directory = str(checkpoints["sharded"])
    monkeypatch.setattr(hf_stream, "build", lambda *args: "unable to mmap the file")
    whole = budget.hf_whole_bytes(_shape(directory))
    monkeypatch.setattr(budget, "available_memory",
                        lambda: budget.Available(whole - 1, "MemAvailable in /proc/meminfo"))
    with pytest.raises(hf.HfError, match=r"^--hf \S+ cannot be streamed \(unable to mmap the "
                                         r"file\), and loaded whole it needs about .* of memory"):
        hf.load(directory, SENTENCE, stream=True)
    monkeypatch.setattr(budget, "available_memory",
                        lambda: budget.Available(2 * whole, "MemAvailable in /proc/meminfo"))
    loaded = hf.load(directory, SENTENCE, stream=True)
    assert loaded.stream is None and "unable to mmap the file" in loaded.note


class _Evil:
    """What an attacker's pickle asks the unpickler to call."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("flag", [(), ("--no-stream",)])
def test_a_bin_checkpoint_that_would_run_code_is_refused(
        checkpoints: dict[str, Path], tmp_path: Path, flag: tuple[str, ...]) -> None:
    """A pytorch_model.bin is a pickle: streamed or not, it is read only by transformers'
    torch.load(weights_only=True), which refuses a pickle that calls a function (nothing runs,
    one line, exit 2); the same file unpickled the unsafe way would run it."""
    import pickle

    directory = tmp_path / "evil"
    directory.mkdir()
    for file in checkpoints["bin"].iterdir():
        if file.name != "pytorch_model.bin":
            (directory / file.name).write_bytes(file.read_bytes())
    marker = tmp_path / "pwned"
    state = torch.load(checkpoints["bin"] / "pytorch_model.bin", weights_only=True)
    state["transformer.h.0.attn.c_attn.weight"] = _Evil(marker)
    torch.save(state, directory / "pytorch_model.bin")
    target = tmp_path / "out.txt"
    result = CliRunner().invoke(app, ["explain", SENTENCE, "--hf", str(directory), *flag,
                                      "--dump", str(target)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("mha-tui: error: ") and result.stderr.count("\n") == 1
    assert not marker.exists() and not target.exists()
    pickle.loads(pickle.dumps(_Evil(marker)))  # the payload is real
    assert marker.exists()


@pytest.mark.parametrize("what", ["heads", "context"])
def test_a_whole_model_run_that_cannot_fit_is_refused_before_loading(
        checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        what: str) -> None:
    """`heads` (every layer and the predictions) and an encoder-decoder with --context load
    the whole model, not streamed: their estimate is checked before torch, like explain's,
    and a run that cannot fit is one line with both figures; with room, it runs."""
    if what == "heads":
        directory = str(checkpoints["gpt2"])
        args = ["heads", SENTENCE, "--hf", directory, "--dump", str(tmp_path / "h.txt")]
    else:
        directory = str(build("bart", tmp_path / "bart"))
        args = ["explain", SENTENCE, "--hf", directory, "--context", "A dog sat.", "--dump",
                str(tmp_path / "h.txt")]
    shape = run_shape(directory, exact_tokens(directory, SENTENCE), SENTENCE, None)
    assert shape is not None
    layers = len(shape.block_elements) if what == "heads" else 1
    need = budget.hf_whole_bytes(shape, layers=layers)
    assert need > budget.hf_whole_bytes(shape) or what == "context"  # every layer recorded
    monkeypatch.setattr(budget, "available_memory",
                        lambda: budget.Available(need // 2, "MemAvailable in /proc/meminfo"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    line = result.stderr
    assert line.count("\n") == 1 and "loads the whole model" in line, line
    assert budget.human(need // 2) in line and not (tmp_path / "h.txt").exists()
    monkeypatch.setattr(budget, "available_memory",
                        lambda: budget.Available(2 * need, "MemAvailable in /proc/meminfo"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "h.txt").stat().st_size > 0
