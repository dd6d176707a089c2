"""The transcript: pinned by golden files, deterministic, strict JSON, bounded unless --full."""

from __future__ import annotations

import ctypes
import html
import io
import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import Config
from mha_tui.pipeline import run_trace
from mha_tui.render.options import RenderOptions
from mha_tui.write.dump import to_json, to_text, write_json, write_values

from .conftest import ROOT, default_trace, run_cli

GOLDEN = Path(__file__).parent / "golden"
ANSI = re.compile(rb"\x1b\[")


def test_text_transcript_matches_golden() -> None:
    """Regenerate with `make golden` only after reading the diff."""
    assert to_text(default_trace(), RenderOptions()) == (GOLDEN / "default.txt").read_text("utf-8")


def test_ascii_transcript_matches_golden_and_is_ascii() -> None:
    text = to_text(default_trace(), RenderOptions(ascii=True))
    assert text == (GOLDEN / "default-ascii.txt").read_text("utf-8")
    text.encode("ascii")


def test_transcript_carries_the_stages_in_order() -> None:
    text = (GOLDEN / "default.txt").read_text("utf-8")
    positions = [text.index(f"{i}/11 {sid}  ") for i, sid in enumerate(
        ["embed", "project", "view", "transpose", "scores", "scale", "mask", "softmax",
         "attend", "concat", "w_o"], start=1)]
    assert positions == sorted(positions)
    for stage in default_trace().stages:
        assert stage.transition in text
        for line in stage.code.splitlines():
            assert line in text


def test_text_shows_the_modules_numbers() -> None:
    """Every number printed for `out` is the module's value at 4 decimals."""
    text = (GOLDEN / "default.txt").read_text("utf-8")
    out = default_trace().stage("w_o").tensor("out").values[0]
    block = text[text.rindex("out  shape"):]
    for token, row in zip(["I", "love", "AI", "!"], out, strict=True):
        line = next(li for li in block.splitlines() if li.strip().startswith(token + " "))
        assert [float(v) for v in line.split()[1:]] == [round(float(v), 4) for v in row]


def test_same_bytes_whatever_the_terminal_and_locale() -> None:
    plain = run_cli("explain", "I love AI !", "--dump", "-")
    assert plain.returncode == 0 and plain.stderr == b""
    odd = run_cli("explain", "I love AI !", "--dump", "-",
                  env={"COLUMNS": "37", "LINES": "5", "TERM": "dumb", "NO_COLOR": "1",
                       "FORCE_COLOR": "1", "LANG": "C", "LC_ALL": "C",
                       "PYTHONIOENCODING": "ascii"})
    assert odd.returncode == 0 and odd.stderr == b""
    assert odd.stdout == plain.stdout == (GOLDEN / "default.txt").read_bytes()
    assert not ANSI.search(plain.stdout)


def test_color_flag_adds_ansi_and_width_is_respected() -> None:
    colored = run_cli("explain", "I love AI !", "--dump", "-", "--color")
    assert ANSI.search(colored.stdout)
    narrow = run_cli("explain", "I love AI !", "--dump", "-", "--width", "60")
    lines = narrow.stdout.decode("utf-8").splitlines()
    assert max(len(li) for li in lines) <= 60 < max(len(li) for li in
                                                    (GOLDEN / "default.txt").read_text().splitlines())


def test_large_tensors_are_elided_with_a_summary_unless_full() -> None:
    config = Config(" ".join(f"w{i}" for i in range(40)), embed_dim=64, num_heads=8)
    trace = run_trace(config)
    short = to_text(trace, RenderOptions())
    full = to_text(trace, RenderOptions(full=True), width=400)
    assert "showing 12 of 40 rows, 10 of 64 columns" in short
    assert "min " in short and "mean " in short
    assert "showing" not in full and "heads shown" not in full
    assert len(full) > 5 * len(short)
    # heads beyond the first few are summarised, not drawn
    assert "4 of 8 heads shown" in short


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_and_complete() -> None:
    data = _strict(to_json(default_trace()))
    assert data["config"] == {
        "sentence": "I love AI !", "tokens": ["I", "love", "AI", "!"],
        "vocab": ["I", "love", "AI", "!"], "ids": [0, 1, 2, 3], "embed_dim": 4,
        "num_heads": 2, "head_dim": 2, "seed": 0, "causal": True, "max_seq_len": 64,
    }
    stages = data["stages"]
    assert [s["id"] for s in stages][:3] == ["embed", "project", "view"]
    for stage in stages:
        assert {"id", "title", "code", "explanation", "tensors"} <= stage.keys()
        for tensor in stage["tensors"].values():
            assert {"shape", "dims", "strides", "contiguous", "values"} <= tensor.keys()
    masked = next(s for s in stages if s["id"] == "mask")["tensors"]["scores"]["values"]
    assert masked[0][0][0][1] == "-inf"
    out = next(s for s in stages if s["id"] == "w_o")["tensors"]["out"]["values"]
    expected = default_trace().stage("w_o").tensor("out").values
    assert np.array_equal(np.array(out, dtype=np.float32), expected)


def test_json_is_never_elided() -> None:
    config = Config(" ".join(f"w{i}" for i in range(30)), embed_dim=32, num_heads=4)
    data = _strict(to_json(run_trace(config)))
    weights = next(s for s in data["stages"] if s["id"] == "softmax")["tensors"]["weights"]
    assert np.array(weights["values"]).shape == (1, 4, 30, 30)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_dump_to_a_file(tmp_path: Path, fmt: str) -> None:
    target = tmp_path / f"t.{fmt}"
    result = run_cli("explain", "I love AI !", "--dump", str(target), "--format", fmt)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"" and result.stderr == b""
    assert target.read_bytes() == run_cli("explain", "I love AI !", "--dump", "-", "--format", fmt).stdout
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


# ---------------------------------------------------------------- where --dump writes
# Every case runs the real command. Nothing here touches /dev itself: device nodes are
# made in a temporary folder.

DEFAULT_TEXT = (GOLDEN / "default.txt").read_bytes()


def _dump(target: str, *extra: str, **kwargs) -> subprocess.CompletedProcess[bytes]:
    return run_cli("explain", "I love AI !", "--dump", target, *extra, **kwargs)


def test_symlink_is_followed_and_its_target_replaced_in_its_own_folder(tmp_path: Path) -> None:
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    target = real_dir / "t.txt"
    target.write_text("old\n")
    link = link_dir / "t.txt"
    link.symlink_to(target)
    result = _dump(str(link))
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == DEFAULT_TEXT
    assert sorted(p.name for p in real_dir.iterdir()) == ["t.txt"]
    assert sorted(p.name for p in link_dir.iterdir()) == ["t.txt"]


def test_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "made.txt")
    assert _dump(str(link)).returncode == 0
    assert link.is_symlink() and (tmp_path / "made.txt").read_bytes() == DEFAULT_TEXT


def test_fifo_is_written_through_to_its_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def reader() -> None:
        with open(fifo, "rb") as handle:
            received.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    result = _dump(str(fifo))
    thread.join(30)
    assert result.returncode == 0, result.stderr
    assert received == [DEFAULT_TEXT]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_character_device_is_written_through_and_stays_a_device(tmp_path: Path) -> None:
    null = os.stat("/dev/null")  # only read: the node is made in tmp_path
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, null.st_rdev)
    result = _dump(str(node), "--format", "json")
    assert result.returncode == 0, result.stderr
    info = os.lstat(node)
    assert stat.S_ISCHR(info.st_mode) and info.st_rdev == null.st_rdev
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


def test_dev_fd_is_written_through_the_descriptor() -> None:
    read_end, write_end = os.pipe()
    received: list[bytes] = []

    def reader() -> None:
        with os.fdopen(read_end, "rb") as handle:
            received.append(handle.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    result = subprocess.run(
        [sys.executable, "-m", "mha_tui", "explain", "I love AI !", "--dump",
         f"/dev/fd/{write_end}"], capture_output=True, pass_fds=(write_end,), env=full_env,
        cwd=ROOT, timeout=120)
    os.close(write_end)
    thread.join(30)
    assert result.returncode == 0, result.stderr
    assert received == [DEFAULT_TEXT] and result.stdout == b""


def test_dev_fd_not_open_is_refused() -> None:
    result = _dump("/dev/fd/97")
    assert result.returncode == 2
    assert result.stderr == b"mha-tui: error: --dump /dev/fd/97: file descriptor 97 is not open\n"


def _without_root_overrides() -> None:
    """In the child before exec: drop root's power to ignore permissions (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH) from the bounding set, so that a read-only folder is read-only."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_writable_file_in_a_read_only_folder_is_rewritten_in_place(tmp_path: Path) -> None:
    """As root, folder permissions do not bite: the command runs without those powers."""
    run_as = {"preexec_fn": _without_root_overrides} if os.geteuid() == 0 else {}
    folder = tmp_path / "ro"
    folder.mkdir()
    target = folder / "t.txt"
    target.write_text("an older, longer transcript\n" * 1000)
    target.chmod(0o666)
    inode = target.stat().st_ino
    folder.chmod(0o555)
    try:
        full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
        result = subprocess.run([sys.executable, "-m", "mha_tui", "explain", "I love AI !",
                                 "--dump", str(target)], capture_output=True, env=full_env,
                                cwd=ROOT, timeout=120, **run_as)
    finally:
        folder.chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == DEFAULT_TEXT
    assert target.stat().st_ino == inode
    assert [p.name for p in folder.iterdir()] == ["t.txt"]


@pytest.mark.parametrize("name", ["absent/", "a-file/"])
def test_trailing_slash_never_writes_the_bare_name(tmp_path: Path, name: str) -> None:
    (tmp_path / "a-file").write_text("keep me\n")
    result = run_cli("explain", "I love AI !", "--dump", f"{tmp_path}/{name}")
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1, err
    assert "names a folder" in err
    assert not (tmp_path / "absent").exists()
    assert (tmp_path / "a-file").read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_long_name_that_fits_is_written(tmp_path: Path) -> None:
    target = tmp_path / ("n" * 250)  # the temporary name beside it must fit too
    result = _dump(str(target))
    assert result.returncode == 0, result.stderr
    assert target.read_bytes() == DEFAULT_TEXT


# ---------------------------------------------------------------- JSON: numbers and text


def _reference_values(values: np.ndarray) -> str:
    """The values line as the first implementation built it: NumPy's astype(str), nested."""
    text = values.astype(str)
    if values.dtype.kind == "f":
        finite = np.isfinite(values)
        text = np.where(finite, text, np.char.add(np.char.add('"', text), '"'))

    def nest(block: np.ndarray) -> str:
        if block.ndim <= 1:
            return "[" + ",".join(block.reshape(-1).tolist()) + "]"
        return "[" + ",".join(nest(row) for row in block) + "]"

    return nest(text)


SPECIAL = [0.0, -0.0, 1.0, 0.5, 0.1, 1e-4, 9.99e-5, 1e-5, 999999.94, 1e6, 123456789.0,
           16777217.0, 3.4028235e38, 1e-45, 1.2e-38, 1e-13, 1e13, np.inf, -np.inf, np.nan]


def test_float_text_is_numpys_shortest_round_trip_text() -> None:
    """orjson with NumPy's spellings against NumPy itself: random bit patterns (every exponent),
    ordinary activations, round decimals and the edges of each notation."""
    rng = np.random.default_rng(0)
    samples = np.concatenate([
        rng.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        (rng.standard_normal(300_000) * 0.3).astype(np.float32),
        (np.arange(0, 20_000) / 1000).astype(np.float32),
        np.array(SPECIAL + [10.0**k for k in range(-14, 14)], dtype=np.float32),
    ])
    for shape in [(len(samples),), (2, len(samples) // 2)]:
        values = samples[: int(np.prod(shape))].reshape(shape)
        out = io.BytesIO()
        write_values(values, out)
        assert out.getvalue().decode("ascii") == _reference_values(values)


def test_float_text_of_masked_scores_and_every_kind_of_special() -> None:
    """The shapes the transcript writes (4-D scores, a mask's -inf beside tiny values and
    zeros, several kinds of non-finite value in one tensor) against NumPy itself, whole and
    written a slice of the first axis at a time."""
    from mha_tui.write import dump

    rng = np.random.default_rng(3)
    scores = (rng.standard_normal((2, 3, 40, 40)) * 10.0 ** rng.integers(-9, 9, (2, 3, 40, 40))
              ).astype(np.float32)
    scores[..., np.triu_indices(40, 1)[0], np.triu_indices(40, 1)[1]] = -np.inf
    scores[0, 1, :5, :5] = 0.0
    mixed = scores.copy()
    mixed[1, 2, 3, :7] = [np.nan, np.inf, -np.inf, -0.0, 1e-40, 3.4e38, -1e-5]
    only_inf = np.where(np.isinf(scores), scores, np.float32(0.5))
    for values in (scores, mixed, only_inf, scores[:, :, :, :1], scores[0, 0, 0]):
        whole = io.BytesIO()
        write_values(values, whole)
        assert whole.getvalue().decode("ascii") == _reference_values(values)
        sliced = io.BytesIO()
        limit = dump._SLICE
        try:
            dump._SLICE = 100  # one row of 40 values at a time
            write_values(values, sliced)
        finally:
            dump._SLICE = limit
        assert sliced.getvalue() == whole.getvalue()


def test_drawing_leaves_no_reference_cycle() -> None:
    """The `mha-tui` command draws a text transcript with the cycle collector off
    (`collector.off`): only because drawing leaves nothing for it to find."""
    import gc

    from mha_tui.collector import off as collector_paused

    trace = run_trace(Config("I love AI ! I", embed_dim=8, num_heads=2))
    to_text(trace, RenderOptions())  # caches (lru_cache) filled before counting
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for opts, color in ((RenderOptions(full=True), False), (RenderOptions(), True),
                            (RenderOptions(ascii=True), False)):
            to_text(trace, opts, width=60, color=color)
        assert gc.collect() == 0
        with collector_paused():  # and it leaves the collector as it found it
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        if enabled:
            gc.enable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() == enabled


@pytest.mark.parametrize("opts", [RenderOptions(), RenderOptions(full=True),
                                  RenderOptions(full=True, ascii=True)])
def test_text_drawn_uncropped_is_the_text_rich_crops(monkeypatch, opts: RenderOptions) -> None:
    """Without colour, to_text draws without Rich's crop and checks that every line fits;
    where one does not (a width of 12), it draws again, cropped as Rich crops. The bytes are
    the cropped drawing's at every width."""
    from mha_tui.write import dump

    trace = run_trace(Config("猫 が I love AI ! e\u0301", embed_dim=16, num_heads=4))
    uncropped = dump._drawn(trace, opts, 12, False, 0, None, crop=False)
    assert not dump._fits(uncropped, 12)  # at 12 the drawing is cropped
    for width in (12, 40, 100):
        fast = to_text(trace, opts, width=width)
        with monkeypatch.context() as patch:
            patch.setattr(dump, "_fits", lambda text, width: False)  # always drawn cropped
            assert to_text(trace, opts, width=width) == fast


@pytest.mark.parametrize("shape", [(), (1,), (3, 1), (2, 3, 4), (1, 2, 1, 3), (2, 0)])
def test_values_nest_like_json(shape: tuple[int, ...]) -> None:
    values = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 2.5
    out = io.BytesIO()
    write_values(values, out)
    assert json.loads(out.getvalue()) == values.tolist()


def test_json_is_streamed_tensor_by_tensor() -> None:
    """No single write holds the document: a 64-token, C=256 trace in writes of a few MB."""
    trace = run_trace(Config(" ".join(f"w{i}" for i in range(64)), embed_dim=256, num_heads=8))

    class Sink(io.BytesIO):
        largest = 0

        def write(self, data) -> int:
            Sink.largest = max(Sink.largest, len(data))
            return super().write(data)

    sink = Sink()
    write_json(trace, sink)
    assert len(sink.getvalue()) > 4 * Sink.largest
    assert sink.getvalue().decode("utf-8") == to_json(trace)
    assert _strict(sink.getvalue().decode("utf-8"))["config"]["embed_dim"] == 256


HIDDEN = ["\x7f", "\x85", "\x9b", "\u202e", "\u2066", "\u200b", "\ufeff", "\u00ad", "\u2028",
          "\U000110bd"]


def test_json_escapes_what_the_text_transcript_makes_visible() -> None:
    tokens = ["a" + ch + "b" for ch in HIDDEN] + ["猫", "👩\u200d👩\u200d👧", "e\u0301"]
    sentence = " ".join(tokens)  # \x85 and \u2028 are whitespace: they split tokens too
    trace = run_trace(Config(sentence, embed_dim=4, num_heads=2))
    text = to_json(trace)
    for ch in HIDDEN:
        assert ch not in text
    assert "a\\u009bb" in text and "a\\u202eb" in text and "a\\ud804\\udcbdb" in text
    assert "猫" in text and "👩\u200d👩\u200d👧" in text  # ordinary text stays readable
    data = _strict(text)  # and reads back to the same strings
    assert data["config"]["sentence"] == sentence
    assert data["config"]["tokens"] == list(trace.config.tokens)


def test_json_escapes_exactly_the_characters_printable_shows() -> None:
    """One rule for both transcripts: escaped in JSON iff made visible in the text."""
    from mha_tui.render.text import printable

    sample = [chr(c) for c in [*range(0x7F, 0xB0), *range(0x2000, 0x2070), 0xFEFF, 0xFFFB,
                               0xE0001, 0xE0041, 0x110BD, 0x1D173, 0x0600, 0x061C]]
    trace = run_trace(Config("x", embed_dim=4, num_heads=2))
    for ch in sample:
        object.__setattr__(trace.config, "sentence", f"x{ch}")  # the sentence is user text
        shown_in_text = printable(ch) != ch
        escaped_in_json = ch not in to_json(trace)
        if ch not in "\u2028\u2029":
            assert escaped_in_json == shown_in_text, hex(ord(ch))


def test_ascii_json_is_pure_ascii_and_reads_back() -> None:
    result = run_cli("explain", "猫 \x9b \u202eevil !", "--dump", "-", "--format", "json",
                     "--ascii")
    assert result.returncode == 0 and result.stderr == b""
    result.stdout.decode("ascii")
    assert _strict(result.stdout.decode())["config"]["tokens"] == ["猫", "\x9b", "\u202eevil", "!"]


# ---------------------------------------------------------------- options that meet --dump


def test_stage_starts_the_transcript_at_that_stage() -> None:
    text = run_cli("explain", "I love AI !", "--dump", "-", "--stage", "softmax")
    assert text.returncode == 0 and text.stderr == b""
    out = text.stdout.decode()
    assert out.startswith("sentence I love AI !")
    assert "8/11 softmax" in out and "7/11 mask" not in out and "1/11 embed" not in out
    golden = DEFAULT_TEXT.decode()
    assert out[out.index("8/11 softmax"):] == golden[golden.index("8/11 softmax"):]
    js = run_cli("explain", "I love AI !", "--dump", "-", "--format", "json", "--stage", "attend")
    assert [s["id"] for s in _strict(js.stdout.decode())["stages"]] == ["attend", "concat", "w_o"]


def test_text_only_options_with_json_are_named_not_refused() -> None:
    plain = run_cli("explain", "I love AI !", "--dump", "-", "--format", "json")
    odd = run_cli("explain", "I love AI !", "--dump", "-", "--format", "json", "--width", "5",
                  "--color", "--full")
    assert odd.returncode == 0 and odd.stdout == plain.stdout
    err = odd.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("mha-tui: note: ")
    assert "--full" in err and "--width and --color do not apply" in err


CRASH = f"{ROOT}/tests/fixtures/crash_attn.py:CrashingAttention"
RAISED = ("the module's forward raised RuntimeError at crash_attn.py line 23: view size is not "
          "compatible with input tensor's size and stride (at least one dimension spans across "
          "two contiguous subspaces). Use .reshape(...) instead")


@pytest.mark.parametrize("suffix", ["txt", "json", "md", "svg", "html"])
def test_a_forward_that_raises_writes_the_transcript_up_to_its_error(tmp_path: Path,
                                                                      suffix: str) -> None:
    """#27: a module that raised has been explained: `--dump notes.md` holds every stage
    before the error and the error stage (torch's message, the line, what the line read), in
    every format; exit 1, and one line on stderr says the module raised and where the
    transcript ends. (Before: exit 1 and nothing written.)"""
    notes = tmp_path / f"notes.{suffix}"
    notes.write_text("my old notes\n")
    result = run_cli("explain", "I love AI !", "--module", CRASH, "--dump", str(notes))
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode() == (f"mha-tui: {RAISED}; the transcript written to --dump "
                                      f"{notes} ends at its error (stage 10/10)\n")
    written = notes.read_text()
    assert [p.name for p in tmp_path.iterdir()] == [notes.name]  # no temporary file left
    flat = html.unescape(written).replace("\xa0", " ")
    for words in ("view size is not compatible", "forgot .contiguous()", "RuntimeError at line 23",
                  "context.transpose(1, 2)"):
        assert words in flat or words in " ".join(flat.split()), words
    if suffix == "json":
        stages = json.loads(written)["stages"]
        assert [s["kind"] for s in stages][-1] == "error" and len(stages) == 10
        assert stages[-1]["tensors"], "what the failing line read"


def test_a_forward_that_raises_writes_to_stdout_too_and_every_stage_is_there() -> None:
    """The text transcript on stdout: the nine stages before the error, then the error."""
    result = run_cli("explain", "I love AI !", "--module", CRASH, "--dump", "-")
    assert result.returncode == 1
    text = result.stdout.decode()
    titles = [line.split("  ·  ")[0] for line in text.splitlines() if "  ·  " in line]
    assert titles[-1] == "10/10 error" and len(titles) == 10
    assert "the transcript written to standard output ends at its error" in result.stderr.decode()


def test_a_forward_that_raises_then_mha_tui_fails_writes_nothing(tmp_path: Path, monkeypatch,
                                                                capsys) -> None:
    """mha-tui's own failure (here: out of memory while drawing) still writes nothing and
    leaves the destination as it was, whatever the module did."""
    import mha_tui.write.dump
    from mha_tui import cli

    def exhausted(*args, **kwargs):
        raise MemoryError()

    keep = tmp_path / "keep.txt"
    keep.write_text("my notes\n")
    monkeypatch.setattr(mha_tui.write.dump, "to_text", exhausted)
    monkeypatch.setattr(sys, "argv", ["mha-tui", "explain", "I love AI !", "--module", CRASH,
                                      "--dump", str(keep)])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 1
    assert keep.read_text() == "my notes\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    assert capsys.readouterr().err.startswith("mha-tui: error: ran out of memory")


def test_the_docs_quoted_transcript_is_the_start_of_the_golden_file() -> None:
    """The manual (docs/explain.md) quotes the beginning of tests/golden/default.txt: every
    line of it, in order."""
    page = Path(ROOT, "docs", "explain.md").read_text("utf-8")
    after = page.split("The beginning of `tests/golden/default.txt`", 1)[1]
    quoted = after.split("```\n", 2)[1]
    assert quoted.count("\n") >= 4
    assert (GOLDEN / "default.txt").read_text("utf-8").startswith(quoted)


def test_float_text_falls_back_to_numpy_when_orjson_cannot_be_mapped(monkeypatch) -> None:
    """Where orjson's nulls cannot be matched one to one with the values NumPy spells
    otherwise, the values go through NumPy itself: the bytes stay NumPy's."""
    from mha_tui.write import floats

    values = np.array([[1e-5, 0.5, -np.inf], [2e7, np.nan, 3.0]], dtype=np.float32)
    assert floats.float32_json(values) is not None  # each null matched in order

    class OneNullShort:  # orjson as if it had written one of the four values otherwise
        OPT_SERIALIZE_NUMPY = floats.orjson.OPT_SERIALIZE_NUMPY

        @staticmethod
        def dumps(array: np.ndarray, option: int) -> bytes:
            return orjson.dumps(array, option=option).replace(b"null", b"0.5", 1)

    import orjson

    monkeypatch.setattr(floats, "orjson", OneNullShort)
    assert floats.float32_json(values) is None
    out = io.BytesIO()
    write_values(values, out)
    assert out.getvalue().decode("ascii") == _reference_values(values)


def test_a_json_extension_chooses_json_and_a_refused_format_names_the_format(tmp_path: Path
                                                                            ) -> None:
    """`--dump notes.json` writes JSON (as .svg writes SVG); where a format cannot be written,
    the refusal names the format, whether --format or the extension chose it."""
    target = tmp_path / "notes.json"
    result = run_cli("explain", "I love AI !", "--dump", str(target))
    assert result.returncode == 0, result.stderr
    assert json.loads(target.read_text())["stages"][0]["id"] == "embed"
    for extra in (["--quiz", "--dump", str(tmp_path / "q.svg")],
                  ["--quiz", "--dump", "-", "--format", "svg"]):
        refused = run_cli("explain", "I love AI !", *extra)
        assert refused.returncode == 2
        assert refused.stderr.decode() == ("mha-tui: error: --quiz writes a worksheet as text, "
                                           "JSON or Markdown, not svg\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json"]
