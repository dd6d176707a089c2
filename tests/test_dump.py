"""The transcript: pinned by golden files, deterministic, strict JSON, bounded unless --full."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import Config
from mha_tui.dump import to_json, to_text
from mha_tui.render import RenderOptions
from mha_tui.tracing import run_trace

from .conftest import default_trace, run_cli

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
