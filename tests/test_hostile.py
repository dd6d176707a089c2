"""Hostile and odd input: shown literally and safely, or refused with one clear line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from mha_tui.app.explain import ExplainApp
from mha_tui.config import Config
from mha_tui.pipeline import run_trace
from mha_tui.render.options import RenderOptions
from mha_tui.render.text import label, printable
from mha_tui.write.destination import opened, resolve
from mha_tui.write.dump import to_json, to_text

from .conftest import run_cli

MARKUP = ["[bold]", "[/]", "[link=file:///etc/passwd]x[/link]", "[red]", "[on", "\\[x]"]
CONTROLS = ["\x1b[2J", "\x1b]0;pwned\x07", "a\x00b", "c\x9bd", "e\x7ff", "\x08\x0c"]
UNICODE = ["猫", "注意力", "👩‍👩‍👧", "🇫🇷", "e\u0301", "zero\u200bwidth", "\u202eevil",
           "שלום", "مرحبا", "ｗｉｄｅ"]
ESC_OR_C1 = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def hostile_sentence(tokens: list[str]) -> str:
    return " ".join(tokens)


@pytest.mark.parametrize("token", MARKUP + CONTROLS + UNICODE)
def test_printable_is_literal_and_has_no_control_bytes(token: str) -> None:
    shown = printable(token)
    assert not ESC_OR_C1.search(shown)
    if not ESC_OR_C1.search(token) and "\u202e" not in token and "\u200b" not in token:
        assert shown == token  # nothing but controls is ever changed


def test_stand_ins_are_visible() -> None:
    assert printable("\x1b[2J") == "␛[2J"
    assert printable("\x1b]0;x\x07") == "␛]0;x␇"
    assert printable("c\x9bd") == "c\\x9bd"
    assert printable("\u202eevil") == "\\u202eevil"
    assert printable("\udcff") == "\\udcff"


def test_long_labels_are_cut_by_cell_width_with_an_ellipsis() -> None:
    assert label("x" * 50).plain == "x" * 11 + "…"
    wide = label("猫" * 20)
    assert cell_len(wide.plain) <= 12 and wide.plain.endswith("…")
    assert label("x" * 50, ascii_only=True).plain.endswith("~")


@pytest.fixture(scope="module")
def hostile_trace():
    tokens = MARKUP + CONTROLS + UNICODE + ["L" * 80]
    return run_trace(Config(hostile_sentence(tokens), embed_dim=8, num_heads=2))


def test_transcript_shows_markup_literally_and_no_raw_controls(hostile_trace) -> None:
    text = to_text(hostile_trace, RenderOptions(full=True), width=400)
    for token in MARKUP:
        assert token[:12] in text
    assert "␛[2J" in text and "␛]0;pwned␇" in text
    assert not ESC_OR_C1.search(text.replace("\n", ""))
    assert "L" * 11 + "…" in text and "L" * 13 not in text


def test_columns_stay_aligned_with_wide_and_zero_width_tokens(hostile_trace) -> None:
    text = to_text(hostile_trace, RenderOptions(full=True), width=400)
    block = text[text.index("\nx  shape"):text.index("checks", text.index("\nx  shape"))]
    rows = [line for line in block.splitlines() if re.search(r"-?\d\.\d{4}\s*$", line)]
    assert len(rows) == len(hostile_trace.config.tokens)
    # every value column ends at the same terminal cell in every row
    ends = {tuple(m.end() + cell_len(line[:m.start()]) - m.start()
                  for m in re.finditer(r"-?\d\.\d{4}", line)) for line in rows}
    assert len(ends) == 1


def test_json_keeps_tokens_whole(hostile_trace) -> None:
    data = json.loads(to_json(hostile_trace))
    assert data["config"]["tokens"] == list(hostile_trace.config.tokens)
    assert "L" * 80 in data["config"]["tokens"]


async def test_app_shows_hostile_tokens_without_escape_bytes(hostile_trace) -> None:
    app = ExplainApp(hostile_trace.config, trace=hostile_trace, start="softmax")
    async with app.run_test(size=(120, 40)) as pilot:
        for key in ["home", "right", "right", "right", "4", "w", "7", "8", "end"]:
            await pilot.press(key)
            screen = app.export_screenshot()
            assert "\x1b" not in screen and not ESC_OR_C1.search(screen.replace("\n", ""))
        await pilot.press("home")
        screen = app.export_screenshot()
        assert "[link=file" in screen and "[bold]" in screen and "␛[2J" in screen


def test_undecodable_argv_is_refused() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mha_tui", "explain", b"caf\xff"],
                            capture_output=True)
    assert result.returncode == 2
    assert result.stderr == b"mha-tui: error: the sentence is not valid UTF-8 text\n"


def test_hostile_tokens_through_the_cli_are_literal() -> None:
    sentence = "[bold]x[/] \x1b[2J \x1b]0;t\x07 [link=file:///etc/passwd]y[/link] 猫 👩‍👩‍👧"
    result = run_cli("explain", sentence, "--dump", "-", "--embed-dim", "8")
    assert result.returncode == 0 and result.stderr == b""
    out = result.stdout.decode("utf-8")
    assert "[bold]x[/]" in out and "␛[2J" in out and "\x1b" not in out
    js = run_cli("explain", sentence, "--dump", "-", "--format", "json", "--embed-dim", "8")
    assert json.loads(js.stdout)["config"]["tokens"][1] == "\x1b[2J"


def test_ascii_transcript_is_pure_ascii_for_any_tokens() -> None:
    result = run_cli("explain", "猫 \x1b[2J 👩‍👩‍👧 e\u0301 !", "--dump", "-", "--ascii",
                     env={"LANG": "C", "PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0 and result.stderr == b""
    result.stdout.decode("ascii")
    assert b"\\u732b" in result.stdout  # the cat, escaped rather than dropped


def _write(path: Path, text: str) -> None:
    with opened(resolve(str(path))) as out:
        out.write(text.encode("utf-8"))


def test_failed_dump_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    target.write_text("old transcript\n")
    with pytest.raises(UnicodeEncodeError):
        _write(target, "half of a new one \udcff never finished")
    assert target.read_text() == "old transcript\n"
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_written_transcript_gets_ordinary_permissions(tmp_path: Path) -> None:
    import os

    fresh = tmp_path / "fresh.txt"
    old_mask = os.umask(0o022)
    try:
        _write(fresh, "x\n")
    finally:
        os.umask(old_mask)
    assert fresh.stat().st_mode & 0o777 == 0o644
    kept = tmp_path / "kept.txt"
    kept.write_text("old\n")
    kept.chmod(0o640)
    _write(kept, "new\n")
    assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_text() == "new\n"


def test_refused_run_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    result = run_cli("explain", "a b c", "--heads", "3", "--dump", str(target))
    assert result.returncode == 2 and not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_gpt2_small_sizes_stay_bounded_in_text_and_complete_in_json() -> None:
    config = Config(" ".join(f"w{i}" for i in range(64)), embed_dim=768, num_heads=12)
    trace = run_trace(config)
    text = to_text(trace, RenderOptions())
    assert len(text.splitlines()) < 1500
    assert "4 of 12 heads shown" in text
    data = json.loads(to_json(trace))
    weights = next(s for s in data["stages"] if s["id"] == "softmax")["tensors"]["weights"]
    values = np.array(weights["values"], dtype=np.float32)
    assert values.shape == (1, 12, 64, 64)
    assert np.array_equal(values, trace.stage("softmax").tensor("weights").values)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    head_dim=st.integers(1, 6), num_heads=st.integers(1, 6), seq_len=st.integers(1, 12),
    seed=st.integers(0, 2**32), causal=st.booleans(),
)
def test_trace_invariants_hold_for_any_shape(head_dim: int, num_heads: int, seq_len: int,
                                             seed: int, causal: bool) -> None:
    config = Config(" ".join(f"t{i % 5}" for i in range(seq_len)), embed_dim=head_dim * num_heads,
                    num_heads=num_heads, seed=seed, causal=causal)
    trace = run_trace(config)
    masked = trace.stage("mask").tensor("scores").values
    weights = trace.stage("softmax").tensor("weights").values
    assert weights.shape == (1, num_heads, seq_len, seq_len)
    assert np.allclose(weights.sum(-1), 1, atol=1e-5)
    above = np.triu(np.ones((seq_len, seq_len), dtype=bool), 1)
    if causal:
        assert np.isneginf(masked[..., above]).all() and (weights[..., above] == 0).all()
    else:
        assert np.isfinite(masked).all()
    assert all(c.ok is not False for s in trace.stages for c in s.checks)
    json.loads(to_json(trace), parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))


async def test_gpt2_small_with_512_tokens_opens_and_steps() -> None:
    """768 x 12 heads, 512 tokens: every stage draws a bounded window, cold cache."""
    trace = run_trace(Config(" ".join(f"w{i}" for i in range(512)), embed_dim=768, num_heads=12,
                             max_seq_len=512))
    app = ExplainApp(trace.config, trace=trace)
    app._cache_disabled = True
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        for _ in range(10):
            await pilot.press("right")
            await pilot.pause()
            shown = app.query_one("#main").plain
            assert len(shown.splitlines()) < 400
        assert "showing 16 of 512 rows" in shown and "torch.equal = True" in shown


@pytest.mark.parametrize("args", [
    ("--hf", "./[red]nope\x07"),  # load/hf_files.py's refusal quoted the path as given
    ("--hf", "\u202eevil"),
    ("--dump", "no\x1bdir/x.txt"),  # destination's refusal too
])
def test_every_refusal_line_shows_control_characters_as_escapes(args: tuple[str, str]) -> None:
    """Whichever message carries the user's text, the one stderr line has no raw control
    or format character (trial 2, finding 18)."""
    result = run_cli("explain", "I love AI !", *args)
    err = result.stderr.decode()
    assert result.returncode == 2 and result.stdout == b""
    assert err.startswith("mha-tui: error: ") and err.count("\n") == 1
    assert not ESC_OR_C1.search(err.rstrip("\n")) and "\u202e" not in err
    assert repr(args[1])[1:-1] in err  # the path itself, its characters made visible
