"""`explain --against`: the learner's module beside a reference, stage by stage.

The weights are copied by role (the reference's output is checked against check's own
reference with the same weights), stages are paired by kind, the differences are mha-tui's,
and the first stage where the two part agrees with `check`'s verdict and first wrong line.
"""

from __future__ import annotations

import io
import json
import os
import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.judge.compare import Comparison, compare, compare_tensors
from mha_tui.judge.roles import RoleCopyError, roles_of
from mha_tui.pipeline import check_source, compared
from mha_tui.records import Stage, TensorRecord, Trace

from .conftest import ROOT, run_cli, split_figures

FIXTURES = Path(__file__).parent / "fixtures"
MISTAKES = FIXTURES / "mistakes"
GOLDEN = Path(__file__).parent / "golden"
CONFIG = Config("I love AI !", embed_dim=4, num_heads=2)


def spec(name: str) -> str:
    return f"{MISTAKES / name}.py:MultiHeadAttention"


@cache
def against(mine: str, reference: str = "mygpt", *, module: bool = True) -> Comparison:
    source = Source(module=mine) if module else Source(model=mine)
    ref = Source(module=reference) if ":" in reference else Source(model=reference)
    return compared(CONFIG, source, ref)


RULE = re.compile(r"[─-]{5,}")
HEAD = re.compile(r"head \d+")


def unequal_sides(text: str) -> list[str]:
    """Where yours and the reference's matrices, drawn side by side, do not line up. A pair
    starts at its `yours ... reference` line (the reference's side starts at that column)
    and ends at mha-tui's difference; in it, a line with a rule on each side is the two
    matrices' rule: the column headers just above must name the same columns (the same
    elided, `+N`), and a head's title above one side must stand above the other."""
    lines = text.splitlines()
    problems = []
    split = None
    for i, line in enumerate(lines):
        if re.fullmatch(r"yours +reference", line.strip()):
            split = line.index("reference")
            continue
        if "difference, computed by mha-tui" in line:
            split = None
        runs = [m.start() for m in RULE.finditer(line)]
        if split is None or len(runs) != 2 or runs[1] != split or i < 2:
            continue
        header = lines[i - 1]
        if header[:split].split() != header[split:].split():
            problems.append(f"columns: {header.strip()!r}")
        for above in lines[max(0, i - 3):i]:
            if HEAD.findall(above[:split]) != HEAD.findall(above[split:]):
                problems.append(f"heads: {above.strip()!r}")
    return problems


def record(values: np.ndarray, dims: tuple[str, ...] = ("B", "h", "T", "T")) -> TensorRecord:
    return TensorRecord("t", dims, np.asarray(values, dtype=np.float32), (), True)


# ---------------------------------------------------------------- cells


def test_differences_mark_the_cells_beyond_the_tolerance() -> None:
    """Equal -inf and equal NaN agree; float32 rounding stays within the tolerance; the
    largest difference between two numbers and its index."""
    ref = np.array([[0.5, -np.inf], [np.nan, 2.0]])
    mine = np.array([[0.5 + 1e-7, -np.inf], [np.nan, 2.75]])
    pair = compare_tensors(record(mine, ("T", "T")), record(ref, ("T", "T")))
    assert pair.differs.tolist() == [[False, False], [False, True]]
    assert pair.max_diff == pytest.approx(0.75) and pair.at == (1, 1)
    assert pair.count == 1 and pair.agree is False and pair.mismatches == ()


def test_a_cell_that_is_a_number_on_one_side_only_is_said_not_measured() -> None:
    """-inf (blocked) in one, a number (kept) in the other, or NaN against a number: counted
    by what each side holds, first cell given, never an `inf` difference; the largest
    difference is between numbers only."""
    mine = np.array([[-np.inf, 1.0, np.nan], [-np.inf, 2.0, 0.0]])
    ref = np.array([[0.5, -np.inf, 1.0], [0.25, 2.5, 0.0]])
    pair = compare_tensors(record(mine, ("T", "T")), record(ref, ("T", "T")))
    assert pair.differs.tolist() == [[True, True, True], [True, True, False]]
    assert pair.max_diff == pytest.approx(0.5) and pair.at == (1, 1)
    assert [(m.yours, m.reference, m.count, m.first) for m in pair.mismatches] == [
        ("-inf", "a number", 2, (0, 0)), ("a number", "-inf", 1, (0, 1)),
        ("NaN", "a number", 1, (0, 2))]
    assert np.isnan(pair.diff[0]).all() and not np.isinf(pair.diff).any()


def test_a_mask_value_does_not_widen_the_tolerance() -> None:
    """A scores tensor masked with finfo.min (Llama, every HF model) or -1e9: the tolerance
    is taken from its numbers, not from the mask value, so a kept cell that differs by 0.7
    differs (it was 3.4e34 wide: no cell of a masked tensor could differ)."""
    low = float(np.finfo(np.float32).min)
    for fill in (low, -1e9):
        ref = np.array([[0.5, fill], [1.0, 2.0]])
        mine = np.array([[0.5, fill], [1.0, 2.7]])
        pair = compare_tensors(record(mine, ("T", "T")), record(ref, ("T", "T")))
        assert pair.differs.tolist() == [[False, False], [False, True]], fill
        assert pair.agree is False and pair.max_diff == pytest.approx(0.7, abs=1e-6)


def test_layouts_that_differ_only_by_axes_of_one_are_laid_over_each_other() -> None:
    """(T, B, C) against (B, T, C) for B = 1 is compared; (h, T, d) against (T, h, d) is not."""
    values = np.arange(8.0).reshape(1, 4, 2)
    pair = compare_tensors(record(values.reshape(4, 1, 2), ("T", "B", "C")),
                           record(values, ("B", "T", "C")))
    assert pair.agree is True
    other = compare_tensors(record(np.zeros((2, 4, 2)), ("h", "T", "d_h")),
                            record(np.zeros((4, 2, 2)), ("T", "h", "d_h")))
    assert other.agree is None and "shapes differ" in other.note


def stage(kind: str, value: float) -> Stage:
    """A hand-built stage whose result is a (1, 1, 2, 2) tensor full of `value`."""
    result = record(np.full((1, 1, 2, 2), value))
    return Stage(kind, kind, "", "", (1, 1, 2, 2), (1, 1, 2, 2), ("B", "h", "T", "T"),
                 ("B", "h", "T", "T"), (result,), kind=kind)


def rows_of(mine: list[tuple[str, float]], theirs: list[tuple[str, float]]) -> Comparison:
    config = Config("a b")
    return compare(Trace(config, tuple(stage(*s) for s in mine)),
                   Trace(config, tuple(stage(*s) for s in theirs)),
                   mine_label="mine", theirs_label="theirs")


def test_rows_follow_the_reference_and_part_for_good_only() -> None:
    """Hand-built stages: paired by what they hold first, the others by kind in the
    reference's order; a stage of the learner's alone sits after its predecessor; a
    difference that agrees again later is no parting; a step the learner left out, followed
    by a difference, is where they part."""
    moved = rows_of([("scores", 1), ("mask", 3), ("scale", 4), ("softmax", 5)],
                    [("scores", 1), ("scale", 2), ("mask", 3), ("softmax", 5)])
    assert [(r.kind, r.status) for r in moved.rows] == [
        ("scores", "agree"), ("scale", "reference"), ("mask", "agree"), ("scale", "mine"),
        ("softmax", "agree")]
    assert moved.parting is None
    left_out = rows_of([("scores", 1), ("op", 9), ("mask", 3), ("softmax", 6)],
                       [("scores", 1), ("scale", 2), ("mask", 3), ("softmax", 5)])
    assert [(r.kind, r.status) for r in left_out.rows] == [
        ("scores", "agree"), ("op", "mine"), ("scale", "reference"), ("mask", "agree"),
        ("softmax", "differ")]
    assert left_out.parted.kind == "softmax"  # they agreed again at mask: the parting is later
    missing = rows_of([("scores", 1), ("mask", 7), ("softmax", 6)],
                      [("scores", 1), ("scale", 2), ("mask", 3), ("softmax", 5)])
    assert missing.parted.kind == "scale" and missing.parted.mine is None
    raised = rows_of([("scores", 1), ("error", 0)], [("scores", 1), ("scale", 2)])
    assert raised.parted.kind == "error" and raised.parted.status == "mine"


def test_the_same_steps_in_another_order_are_paired_by_what_they_hold() -> None:
    """#27: Raschka masks, then scales; nanoGPT scales, then masks. Both reach the same
    numbers at softmax's input (here 3): mask and scale are paired by kind and marked
    `reordered`, not wrong, with the two orders in words; a softmax over the wrong axis
    after them parts at softmax (before: at mask, paired by position within the kind)."""
    scale_first = [("scores", 1), ("scale", 2), ("mask", 3), ("softmax", 5)]
    mask_first = [("scores", 1), ("mask", 4), ("scale", 3), ("softmax", 5)]
    c = rows_of(scale_first, mask_first)
    assert [(r.kind, r.status) for r in c.rows] == [
        ("scores", "agree"), ("mask", "reordered"), ("scale", "reordered"), ("softmax", "agree")]
    assert c.parting is None
    assert c.rows[1].order == ("yours scale, then mask; the reference mask, then scale: the "
                               "same numbers after both (at softmax's input)")
    wrong_axis = rows_of([*scale_first[:3], ("softmax", 6)], mask_first)
    assert wrong_axis.parted.kind == "softmax" and wrong_axis.parted.status == "differ"
    other_steps = rows_of([("scores", 1), ("op", 3), ("softmax", 5)], mask_first)
    assert [r.status for r in other_steps.rows if r.kind in ("mask", "scale")] == [
        "reference", "reference"]  # not the same steps: no order to speak of


def test_mygpt_against_raschka_marks_nothing_wrong() -> None:
    """The real modules: mygpt (scale, then mask) against raschka (mask, then scale) with
    mygpt's weights copied in; the header says the order differs, and no row differs."""
    from rich.console import Console

    from mha_tui.render.compare import comparison_header
    from mha_tui.render.options import RenderOptions

    c = compared(Config("I love AI !"), Source(model="mygpt"), Source(model="raschka"))
    statuses = {r.kind: r.status for r in c.rows}
    assert statuses["mask"] == statuses["scale"] == "reordered"
    assert "differ" not in statuses.values() and c.parting is None
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(comparison_header(c, RenderOptions()))
    header = " ".join(console.export_text().split())
    assert "a different but equivalent order: yours scale, then mask; the reference mask, then " \
           "scale" in header


# ---------------------------------------------------------------- weights by role


@pytest.mark.parametrize("reference", ["mygpt", "many-eyes", "torch.nn:MultiheadAttention"])
def test_a_correct_module_never_parts_from_the_reference(reference: str) -> None:
    """mygpt against itself, against per-head modules, against nn.MultiheadAttention (a
    fused in_proj_weight, scale before the scores): the weights copied in by role, the
    output the same, no parting stage."""
    c = against("mygpt", reference, module=False)
    assert c.parting is None, [(r.kind, r.status) for r in c.rows]
    assert c.rows[-1].status == "agree" or c.rows[-1].mine is None
    outputs = next(r for r in c.rows if r.kind == "w_o")
    assert outputs.status == "agree"
    mine_roles, their_roles = roles_of(c.mine, 2), roles_of(c.theirs, 2)
    for role in "qkv":
        np.testing.assert_array_equal(getattr(mine_roles, role)[0], getattr(their_roles, role)[0])


def test_the_references_numbers_are_its_own_forward_with_the_copied_weights() -> None:
    """The reference's output equals check's reference (mygpt, weights copied in by role,
    run by tracing.rerun) on the same x: an independent run of the copy."""
    from mha_tui.tracing.rerun import reference_output

    c = against(spec("no_scale"))
    x = dict(c.mine.recording.inputs)["x"].values
    expected = reference_output(x, roles_of(c.mine, 2), 2, True)
    got = c.theirs.recording.snapshot(c.theirs.recording.output).values
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_stages_are_paired_by_kind_not_position() -> None:
    """raschka-wrapper masks before it scales and has no view, transpose or W_O: every
    pair holds two stages of one kind; the reference's own stages are shown as such."""
    c = against("raschka-wrapper", module=False)
    assert all(r.mine.kind == r.theirs.kind for r in c.rows if r.mine and r.theirs)
    only = {r.kind: r.status for r in c.rows if r.mine is None or r.theirs is None}
    assert only == {"view": "reference", "transpose": "reference", "w_o": "reference"}
    assert c.parting is None  # scale and mask differ in between, then rejoin at softmax


def test_weights_that_cannot_be_copied_by_role_are_refused() -> None:
    """A bias the reference has no place for: one line, naming it."""
    with pytest.raises(RoleCopyError, match="Q projection has a bias"):
        compared(CONFIG, Source(model="course"), Source(model="mygpt"))


# ---------------------------------------------------------------- agrees with check

# fixture -> check's verdict, said by compare too: the first stage where they part
PARTING = ["scale_sqrt_c", "no_scale", "single_view", "softmax_axis", "mask_reversed",
           "mask_missing", "merge_no_transpose", "dropout_active", "crash"]


@pytest.mark.parametrize("name", PARTING)
def test_they_part_where_check_finds_the_first_wrong_line(name: str) -> None:
    """The parting stage is check's first wrong stage, and its line check's line (for a
    stage the learner left out, one of the learner's two lines it would go between: check
    blames the scores line for a missing scale, the softmax line for a missing mask)."""
    verdict = check_source(CONFIG, Source(module=spec(name)))
    first_wrong = next(row for row in verdict.stages if row.ok is False)
    c = against(spec(name))
    parted = c.parted
    assert parted is not None
    assert parted.kind == first_wrong.kind
    if parted.mine is not None:
        assert parted.mine.source.line == verdict.diagnosis.line
    else:  # left out: between two of the learner's stages
        lines = {s.source.line for s in c.neighbours(c.parting) if s is not None}
        assert verdict.diagnosis.line in lines
    assert "differ" not in [r.status for r in c.rows[:c.parting]]


def test_where_values_say_otherwise_than_check() -> None:
    """Three mistakes compare shows otherwise than check, said here so it is not hidden:
    a mask computed and then discarded (its numbers agree; the softmax, fed the unmasked
    scores, is where the values part) and a declared but unused W_O (the reference's W_O
    becomes the identity, as check's reference does, so the numbers agree to the end)."""
    discarded = against(spec("mask_discarded"))
    assert discarded.parted.kind == "softmax"
    assert [r.status for r in discarded.rows if r.kind == "mask"] == ["agree"]
    # masked after the softmax: the same stage (mask), but the learner's masked_fill of the
    # weights is no mask stage to the recogniser, an op of its own after the softmax: that
    # op's line is check's line
    late = against(spec("mask_after_softmax"))
    verdict = check_source(CONFIG, Source(module=spec("mask_after_softmax")))
    assert late.parted.kind == "mask" == verdict.diagnosis.stage
    [op] = [r for r in late.rows if r.status == "mine"]
    assert op.kind == "op" and op.mine.source.line == verdict.diagnosis.line
    unused = against(spec("no_output_projection"))
    assert unused.parting is None
    assert [r.status for r in unused.rows if r.kind == "w_o"] == ["reference"]


# ---------------------------------------------------------------- a NumPy module

NUMPY = FIXTURES / "numpy_attn.py"


@pytest.mark.parametrize("mine", [Source(model="blueprint"), Source(model="blueprint-einsum"),
                                  Source(module=f"{NUMPY}:NumpyAttention"),
                                  Source(module=f"{NUMPY}:PerHeadWeights")],
                         ids=["blueprint", "blueprint-einsum", "numpy", "per-head"])
@pytest.mark.parametrize("reference", ["mygpt", "many-eyes"])
def test_a_numpy_module_against_a_torch_reference(mine: Source, reference: str) -> None:
    """A NumPy module (x is (T, C), its own embedding table) beside a torch reference: the
    reference reads the same x, gets the learner's weights by role, and its output is the
    NumPy blueprint's computation with those weights (an independent float64 run); a
    correct module never parts."""
    from mha_tui.judge.numpy_reference import reference_output

    c = compared(CONFIG, mine, Source(model=reference))
    assert not c.mine.batched and c.theirs.batched
    x_mine = dict(c.mine.recording.inputs)["x"].values
    x_ref = dict(c.theirs.recording.inputs)["x"].values
    assert x_mine.shape == (4, 4) and np.array_equal(x_ref[0], x_mine)
    assert any("your Q rows" in line for line in c.weights)
    got = c.theirs.recording.snapshot(c.theirs.recording.output).values[0]
    expected = reference_output(x_mine, roles_of(c.mine, 2), 2, True)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert c.parting is None
    assert all(row.status in ("agree", "mine", "reference") for row in c.rows), \
        [(row.kind, row.status) for row in c.rows]


def test_a_numpy_module_parts_where_check_finds_its_first_wrong_line() -> None:
    """ScaledBySqrtC divides by sqrt(C): they part at scale, check's first wrong stage and
    line; the differing cells are marked on both sides (yours drawn without its batch axis)
    and in mha-tui's difference."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import comparison_text

    source = Source(module=f"{NUMPY}:ScaledBySqrtC")
    verdict = check_source(CONFIG, source)
    first_wrong = next(row for row in verdict.stages if row.ok is False)
    c = compared(CONFIG, source, Source(model="mygpt"))
    assert c.parting is not None and c.parted is not None
    assert c.parted.kind == first_wrong.kind == "scale"
    assert c.parted.mine is not None and c.parted.mine.source.line == first_wrong.line
    text = comparison_text(c, RenderOptions(), width=100)
    scale = text[text.index("\n6/11 scale"):text.index("\n7/11 mask")]
    half = next(line.index("reference") for line in scale.splitlines()
                if line.startswith("yours ") and line.rstrip().endswith("reference"))
    rows = [line for line in scale.splitlines() if re.match(r"\s*(I|love) +\*?-?\d", line)]
    assert rows and all("*" in line[:half] and "*" in line[half:] for line in rows[:4])
    assert unequal_sides(text) == []


def test_the_cli_compares_a_numpy_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    done = run_cli("explain", "I love AI !", "--model", "blueprint", "--against", "mygpt",
                   "--dump", "-")
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode("utf-8")
    assert "yours      blueprint" in text and "they never part" in text
    assert "T=4 C=4" in text and "B=1" not in text  # yours has no batch axis


# ---------------------------------------------------------------- --dump


def test_text_comparison_matches_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regenerate with `make golden` only after reading the diff."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import comparison_text

    monkeypatch.chdir(ROOT)
    c = compared(CONFIG, Source(module="tests/fixtures/mistakes/no_scale.py:MultiHeadAttention"),
                 Source(model="mygpt"))
    text = comparison_text(c, RenderOptions())
    assert text == (GOLDEN / "against-no-scale.txt").read_text("utf-8")
    assert "they part at 6/11 scale: only in the reference" in text
    assert "difference, computed by mha-tui" in text


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("name", ["correct", "no_scale", "mask_reversed", "softmax_axis",
                                  "dropout_active"])
def test_both_sides_show_the_same_columns_and_heads_at_any_width(name: str, width: int) -> None:
    """The dump at --width 80, 100 and 120: each side half the width, the two matrices of a
    pair elided alike (the columns the wider numbers leave room for), heads level."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import comparison_text

    for decimals in (2, 4, 6):
        text = comparison_text(against(spec(name)), RenderOptions(decimals=decimals), width=width)
        assert text.count("head 0") >= 2
        assert unequal_sides(text) == [], (decimals, unequal_sides(text)[:3])


@pytest.mark.parametrize(("mine", "reference"), [
    ("mask_reversed", "mygpt"), ("single_view", "mygpt"), ("crash", "mygpt"),
    ("mygpt", "many-eyes"), ("mygpt", "raschka")])
def test_a_wrap_never_splits_a_figure(mine: str, reference: str) -> None:
    """At any width, the largest difference stays with its words (`the largest, 0`, never a
    `0` on a line of its own), and an index (`at [0, 1, 2, 0]`, the cells that differ) or a
    shape (`(1, 4, 2, 2)`, in a side's metadata, caption, note or error) is never cut in two."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import comparison_text

    c = against(spec(mine), reference) if mine != "mygpt" else against(mine, reference, module=False)
    for width in (*range(60, 131, 7), 80, 100, 120):
        for decimals in (2, 6):
            text = comparison_text(c, RenderOptions(decimals=decimals), width=width)
            assert split_figures(text) == [], (width, decimals, split_figures(text)[:3])


def test_each_sides_line_names_its_file_or_mha_tuis_lookup_and_wraps_under_its_code() -> None:
    """The embed row's line is mha-tui's own lookup (the same x for both), never a file of
    mha-tui's named like the learner's; a code line too long for the width goes on under
    the code, not under `yours`."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import comparison_text

    text = comparison_text(against(spec("no_scale")), RenderOptions(), width=80)
    embed = text[text.index("\n1/11 embed"):text.index("\n2/11 project")]
    assert "yours      mha-tui's lookup: x = embedding(ids)" in embed
    assert "reference  mha-tui's lookup: x = embedding(ids)" in embed
    assert "__init__.py" not in text
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("yours      no_scale.py"))
    assert lines[start + 1].startswith(" " * 11) and lines[start + 1].strip()


def test_the_comparison_at_80_columns_matches_golden(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dump - --width 80`: a 4-wide matrix does not fit twice in 80 columns, so the two
    sides are stacked, each whole (they were side by side, each eliding a column).
    Regenerate with `make golden` only after reading the diff."""
    monkeypatch.chdir(ROOT)
    done = run_cli("explain", "I love AI !", "--module",
                   "tests/fixtures/mistakes/softmax_axis.py:MultiHeadAttention", "--against",
                   "mygpt", "--width", "80", "--dump", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode("utf-8") == (GOLDEN / "against-softmax-axis-80.txt").read_text("utf-8")
    assert unequal_sides(done.stdout.decode("utf-8")) == []


def test_a_correct_module_against_per_head_modules_matches_golden() -> None:
    """mygpt against many-eyes, in ASCII: no parting; view and transpose only in yours.
    Regenerate with `make golden` only after reading the diff."""
    done = run_cli("explain", "I love AI !", "--against", "many-eyes", "--ascii", "--dump", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (GOLDEN / "against-many-eyes-ascii.txt").read_bytes()
    text = done.stdout.decode("ascii")
    assert "they never part" in text and "only in yours" in text


def test_the_cli_writes_the_comparison_as_json(tmp_path: Path) -> None:
    """Both sides' own tensors, mha-tui's difference (which cells, the largest, where)."""
    out = tmp_path / "c.json"
    done = run_cli("explain", "I love AI !", "--module", spec("softmax_axis"), "--against",
                   "mygpt", "--dump", str(out), "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["parting"]["kind"] == "softmax"
    row = data["rows"][data["parting"]["row"]]
    assert row["status"] == "differ" and row["yours"]["source"]["line"] > 0
    pair = row["tensors"][0]
    mine, theirs = np.array(pair["yours"]["values"]), np.array(pair["reference"]["values"])
    differing = np.array(pair["difference"]["differing"])
    assert pair["difference"]["computed_by"] == "mha-tui"
    assert differing.shape == mine.shape and differing.sum() == pair["difference"]["cells_differing"]
    assert pair["difference"]["max"] == pytest.approx(float(np.abs(mine - theirs).max()), rel=1e-6)


@pytest.mark.parametrize(("args", "words"), [
    (["--against", "nosuch"], "is neither a tutorial's module"),
    (["--model", "course", "--against", "mygpt"], "has a bias"),
    (["--against", "mygpt", "--format", "svg"], "text or JSON"),
    (["--against", "mygpt", "--hf", "gpt2"], "does not apply with --hf"),
    (["--against", "blueprint"], "the reference must be a torch module"),
    (["--against", "tests/fixtures/numpy_attn.py:NumpyAttention"],
     "NumpyAttention is NumPy code: the reference must be a torch module"),
    (["--against", "missing_file.py:Attention"], "--against: missing_file.py"),
    (["--against", "tests/fixtures/numpy_attn.py:MultiHeadAttention"], "no nn.Module class"),
])
def test_bad_against_is_one_line_and_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    """One line on stderr, exit 2, no traceback, nothing written."""
    out = tmp_path / "out.txt"
    done = run_cli("explain", "I love AI !", *args, "--dump", str(out))
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists() and os.listdir(tmp_path) == []


def test_marked_cells_keep_every_column_where_it_was() -> None:
    """A marked cell gets MARK in the gap just before its number; nothing moves, and a
    layout the marks cannot be placed in says so (0)."""
    import io

    from mha_tui.render.matrix import MARK
    from mha_tui.render.options import RenderOptions
    from mha_tui.render.tensor import mark_cells, tensor_matrices
    from mha_tui.write.dump import transcript_console

    values = np.arange(16, dtype=np.float32).reshape(1, 4, 4) / 7
    tensor = TensorRecord("x", ("B", "T", "C"), values, (16, 4, 1), True)
    cells = np.zeros((1, 4, 4), dtype=bool)
    cells[0, 1, 2] = cells[0, 3, 0] = True

    def drawn(mark: bool) -> list[str]:
        matrices = tensor_matrices(tensor, CONFIG, RenderOptions())
        if mark:
            assert mark_cells(matrices, tensor, cells) == 2
        buffer = io.StringIO()
        transcript_console(buffer, 80, False).print(matrices[0])
        return buffer.getvalue().splitlines()

    plain, marked = drawn(False), drawn(True)
    changed = [(a, b) for a, b in zip(plain, marked, strict=True) if a != b]
    assert len(changed) == 2
    for before, after in changed:
        assert len(before) == len(after) and after.count(MARK) == 1
        at = after.index(MARK)
        assert before[at] == " " and after.replace(MARK, " ") == before
    odd = TensorRecord("y", ("a", "b"), np.zeros((2, 2), dtype=np.float32), (2, 1), True)
    assert mark_cells(tensor_matrices(odd, CONFIG, RenderOptions()), odd,
                      np.ones((2, 2), dtype=bool)) == 0


def test_a_forward_that_raises_is_named_with_torchs_words_on_either_side(tmp_path: Path) -> None:
    """Yours raises: its error row says what raised, in torch's words. The reference raises:
    the refusal gives the error, the file and the line, not "The forward raised RuntimeError"
    alone."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import comparison_text

    path = tmp_path / "raises.py"
    path.write_text("import torch.nn as nn\n\n\nclass MultiHeadAttention(nn.Module):\n"
                    "    def __init__(self, embed_dim, num_heads):\n        super().__init__()\n"
                    "        self.W = nn.Linear(3, 4)\n\n"
                    "    def forward(self, x):\n        return self.W(x)\n")
    words = "mat1 and mat2 shapes cannot be multiplied (4x4 and 3x4)"
    text = comparison_text(against(f"{path}:MultiHeadAttention"), RenderOptions())
    assert f"your module's forward raised RuntimeError: {words}" in text
    with pytest.raises(RoleCopyError) as refused:
        compared(CONFIG, Source(model="mygpt"), Source(module=f"{path}:MultiHeadAttention"))
    assert str(refused.value) == (f"--against {path}:MultiHeadAttention's own forward raised "
                                  f"RuntimeError at raises.py line 10: {words}")
