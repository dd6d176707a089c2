"""`mha-tui check`: the mistake catalogue, the equivalent variants, hypothesis, the CLI.

Every fixture in tests/fixtures/mistakes/ holds one classic mistake on the line marked
`# MISTAKE`: the judge must call the module not equivalent, put the diagnosis on that line,
and say which mistake it is from the numbers. Every tutorial module and every legitimate
variant must be judged equivalent, end to end included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.config import MODEL_NAMES, Config, Source
from mha_tui.pipeline import check_source

from .conftest import ROOT

FIXTURES = Path(__file__).parent / "fixtures"
MISTAKES = FIXTURES / "mistakes"
SENTENCE = "I love AI !"

# fixture -> (diagnosis kind, the stage kind that is wrong)
CATALOGUE = {
    "scale_sqrt_c": ("scaled_by_sqrt_C", "scale"),
    "no_scale": ("not_scaled", "scale"),
    "single_view": ("split_without_transpose", "view"),
    "softmax_axis": ("softmax_wrong_axis", "softmax"),
    "mask_reversed": ("mask_reversed", "mask"),
    "mask_missing": ("mask_missing", "mask"),
    "mask_discarded": ("mask_missing", "mask"),
    "mask_after_softmax": ("mask_after_softmax", "mask"),
    "merge_no_transpose": ("merge_without_transpose", "concat"),
    "no_output_projection": ("no_output_projection", "w_o"),
    "dropout_active": ("dropout_active", "dropout"),
    "crash": ("crash", "error"),
    "v_is_q": ("role_shared", "attend"),
    "k_is_q": ("role_shared", "scores"),
}

VARIANTS = [
    f"{FIXTURES / 'check_variants.py'}:{name}"
    for name in ("FusedMaskFirst", "WhereMinusBillion", "SplitScale", "SdpaMaskArgument")
] + [
    f"{FIXTURES / 'nanogpt_attn.py'}:CausalSelfAttention",
    f"{FIXTURES / 'einsum_attn.py'}:EinsumAttention",
    f"{MISTAKES / 'correct.py'}:MultiHeadAttention",
    "torch.nn:MultiheadAttention",
]


def marked_line(path: Path) -> int:
    lines = path.read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.endswith("# MISTAKE"))


def judged(spec: str | None = None, *, model: str = "mygpt", C: int = 4, h: int = 2,
           sentence: str = SENTENCE, seed: int = 0, causal: bool = True):
    config = Config(sentence, embed_dim=C, num_heads=h, seed=seed, causal=causal)
    source = Source(module=spec) if spec else Source(model=model)
    return check_source(config, source)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_each_mistake_is_found_on_its_line(name: str) -> None:
    """One mistake each: not equivalent, the right diagnosis, its line, its stage first."""
    path = MISTAKES / f"{name}.py"
    kind, stage = CATALOGUE[name]
    verdict = judged(f"{path}:MultiHeadAttention")
    assert not verdict.equivalent
    assert verdict.diagnosis is not None
    assert verdict.diagnosis.kind == kind, verdict.diagnosis
    assert verdict.diagnosis.line == marked_line(path)
    assert os.path.samefile(verdict.diagnosis.file, path)
    first_wrong = next(row for row in verdict.stages if row.ok is False)
    assert first_wrong.kind == stage
    assert first_wrong.line == marked_line(path)


def test_one_mistake_is_reported_once() -> None:
    """Stages after the wrong one are judged from their own input: they stay right."""
    verdict = judged(f"{MISTAKES / 'single_view.py'}:MultiHeadAttention")
    wrong = [row.kind for row in verdict.stages if row.ok is False]
    assert wrong == ["view"]
    assert verdict.end_to_end is not None and verdict.end_to_end.ok is False


def test_diagnoses_are_computed_from_the_numbers() -> None:
    """The scale diagnosis quotes the measured ratio; the mask one counts entries."""
    scale = judged(f"{MISTAKES / 'scale_sqrt_c.py'}:MultiHeadAttention", C=12, h=3)
    assert "0.2887" in scale.diagnosis.message  # 1/sqrt(12), measured
    assert "sqrt(h) = 1.7321" in scale.diagnosis.message
    mask = judged(f"{MISTAKES / 'mask_reversed.py'}:MultiHeadAttention", sentence="a b c d e")
    assert "15 entries" in mask.diagnosis.message  # 5 tokens: the diagonal and below
    dropout = judged(f"{MISTAKES / 'dropout_active.py'}:MultiHeadAttention")
    assert "two runs of the forward on the same input differ" in dropout.diagnosis.message


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_every_tutorial_module_is_equivalent(model: str) -> None:
    verdict = judged(model=model)
    assert verdict.equivalent, verdict.diagnosis
    assert verdict.diagnosis is None
    assert all(row.ok is not False for row in verdict.stages)
    assert verdict.end_to_end is not None and verdict.end_to_end.ok, verdict.end_to_end


@pytest.mark.parametrize("spec", VARIANTS, ids=lambda s: s.rsplit(":", 1)[-1])
def test_legitimate_variants_are_equivalent(spec: str) -> None:
    verdict = judged(spec)
    assert verdict.equivalent, verdict.diagnosis
    assert verdict.end_to_end is not None and verdict.end_to_end.ok, verdict.end_to_end


@pytest.mark.parametrize(("spec", "said"), [
    (f"{FIXTURES / 'check_variants.py'}:FusedMaskFirst", "before scaling"),
    (f"{FIXTURES / 'check_variants.py'}:FusedMaskFirst", "fused (C, 3C)"),
    (f"{FIXTURES / 'check_variants.py'}:FusedMaskFirst", "d_h ** -0.5"),
    (f"{FIXTURES / 'check_variants.py'}:WhereMinusBillion", "-1e+09 instead of -inf"),
    (f"{FIXTURES / 'check_variants.py'}:WhereMinusBillion", "biases"),
    (f"{FIXTURES / 'check_variants.py'}:SplitScale", "2 steps"),
    (f"{FIXTURES / 'nanogpt_attn.py'}:CausalSelfAttention", "scaled_dot_product_attention"),
    (f"{FIXTURES / 'einsum_attn.py'}:EinsumAttention", "einsum"),
    (f"{FIXTURES / 'einsum_attn.py'}:EinsumAttention", "x @ W"),
    ("torch.nn:MultiheadAttention", "baddbmm"),
])
def test_differences_are_said(spec: str, said: str) -> None:
    """What the module does differently is named, and called equivalent."""
    verdict = judged(spec)
    assert any(said in d and "equivalent" in d for d in verdict.differences), verdict.differences


def test_per_head_modules_and_no_projection_are_said() -> None:
    verdict = judged(model="raschka-wrapper")
    assert any("no output projection" in d for d in verdict.differences)
    assert any("its own module" in d for d in verdict.differences)


def test_no_causal_judges_against_unmasked_attention() -> None:
    assert judged(model="course", causal=False).equivalent
    verdict = judged(f"{MISTAKES / 'correct.py'}:MultiHeadAttention", causal=False)
    assert not verdict.equivalent  # it masks with its own buffer whatever --no-causal says
    assert verdict.diagnosis.kind == "mask_unexpected"


def test_a_judgement_that_fails_is_a_row_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module no rule foresaw: the row says it was not judged, the rest stands."""
    from mha_tui.kinds import softmax

    def broken(j: object) -> list:
        raise IndexError("no such axis")

    monkeypatch.setattr(softmax, "judge", broken)
    verdict = judged(model="course")
    row = next(r for r in verdict.stages if "could not read" in r.checked)
    assert row.ok is None and "IndexError: no such axis" in row.checked
    assert verdict.equivalent


def test_the_numbers_behind_the_verdicts() -> None:
    """Equal infinities are equal, NaN where NaN is expected is equal, a scale is a ratio."""
    import numpy as np

    from mha_tui.ops.numeric import blocked, close, max_diff, ratio
    from mha_tui.ops.vocab import softmax

    inf = float("inf")
    assert max_diff(np.array([-inf, 1.0]), np.array([-inf, 1.0])) == 0.0
    assert max_diff(np.array([np.nan]), np.array([np.nan])) == 0.0
    assert max_diff(np.array([np.nan]), np.array([0.0])) == inf
    assert max_diff(np.zeros(2), np.zeros(3)) == inf
    assert blocked(np.array([-inf, -1e9, np.finfo(np.float32).min, -5.0, 0.0])).tolist() == [
        True, True, True, False, False]
    assert ratio(np.array([1.0, -inf, 2.0]), np.array([2.0, -inf, 4.0])) == 0.5
    assert close(softmax(np.array([[0.0, -inf]])), np.array([[1.0, 0.0]]))[0]
    assert not close(np.array([1.0]), np.array([1.001]))[0]


# ---------------------------------------------------------------------------- hypothesis

sizes = st.tuples(st.sampled_from([(4, 2), (6, 3), (8, 2), (8, 4), (6, 2), (12, 3)]),
                  st.integers(2, 6), st.integers(0, 2**31))
quick = settings(max_examples=8, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


def _sentence(T: int) -> str:
    return " ".join(f"w{i}" for i in range(T))


@quick
@given(sizes)
def test_a_correct_module_is_always_equivalent(case) -> None:
    (C, h), T, seed = case
    verdict = judged(f"{MISTAKES / 'correct.py'}:MultiHeadAttention", C=C, h=h, seed=seed,
                     sentence=_sentence(T))
    assert verdict.equivalent, verdict.diagnosis


@quick
@given(sizes, st.sampled_from(sorted(CATALOGUE)))
def test_a_mistaken_module_is_never_equivalent(case, name: str) -> None:
    """h >= 2 and T >= 2: every mistake in the catalogue changes the numbers there."""
    (C, h), T, seed = case
    verdict = judged(f"{MISTAKES / name}.py:MultiHeadAttention", C=C, h=h, seed=seed,
                     sentence=_sentence(T))
    assert not verdict.equivalent
    assert verdict.diagnosis.kind == CATALOGUE[name][0]


# ---------------------------------------------------------------------------- the CLI

runner = CliRunner()


def test_cli_exit_codes_and_table() -> None:
    good = runner.invoke(app, ["check", f"{MISTAKES / 'correct.py'}:MultiHeadAttention"])
    assert good.exit_code == 0, good.output
    assert "equivalent" in good.output and "✓" in good.output
    bad = runner.invoke(app, ["check", f"{MISTAKES / 'softmax_axis.py'}:MultiHeadAttention"])
    assert bad.exit_code == 1
    assert "✗" in bad.output and "softmax_wrong_axis" in bad.output
    assert f":{marked_line(MISTAKES / 'softmax_axis.py')}" in bad.output


def test_cli_json_for_graders() -> None:
    result = runner.invoke(app, ["check", f"{MISTAKES / 'no_scale.py'}:MultiHeadAttention",
                                 "--format", "json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert set(data) >= {"module", "equivalent", "stages", "diagnosis"}
    assert data["equivalent"] is False
    assert data["diagnosis"]["kind"] == "not_scaled"
    assert data["diagnosis"]["line"] == marked_line(MISTAKES / "no_scale.py")
    for stage in data["stages"]:
        assert set(stage) == {"kind", "ok", "max_diff", "file", "line", "checked"}


def test_cli_several_modules_one_row_each() -> None:
    specs = [f"{MISTAKES / n}.py:MultiHeadAttention" for n in ("correct", "mask_reversed")]
    result = runner.invoke(app, ["check", *specs, "--model", "course", "--format", "json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert [d["equivalent"] for d in data] == [True, False, True]
    table = runner.invoke(app, ["check", *specs])
    assert table.exit_code == 1
    assert "mask_reversed" in table.output and table.output.count("✓") == 1


def test_cli_class_for_every_file() -> None:
    """An instructor's folder: FILE.py without a class takes --class."""
    files = [str(MISTAKES / f"{n}.py") for n in ("correct", "no_scale")]
    result = runner.invoke(app, ["check", *files, "--class", "MultiHeadAttention",
                                 "--format", "json"])
    assert result.exit_code == 1
    assert [d["equivalent"] for d in json.loads(result.stdout)] == [True, False]


def test_cli_all_equivalent_exits_0() -> None:
    result = runner.invoke(app, ["check", "--model", "raschka", "--format", "json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["equivalent"] is True


@pytest.mark.parametrize("args", [
    ["check"],
    ["check", "no_such_file.py:MultiHeadAttention"],
    ["check", "not a spec"],
    ["check", "my_attn.py"],
    ["check", "--model", "course", "--heads", "3"],
    ["check", "--model", "course", "--width", "10"],
    ["check", "--model", "course", "--sentence", ""],
])
def test_cli_usage_errors_exit_2(args: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "mha_tui", *args], capture_output=True,
                            text=True, env={**os.environ, "_TYPER_FORCE_DISABLE_TERMINAL": "1"})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_a_module_that_cannot_load_among_several_is_a_failing_row(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def oops(:\n")
    result = runner.invoke(app, ["check", f"{broken}:MultiHeadAttention", "--model", "course",
                                 "--format", "json"])
    assert result.exit_code == 3  # could not judge (exit 2 is kept for usage errors)
    data = json.loads(result.stdout)
    assert data[0]["diagnosis"]["kind"] == "load_error" and data[1]["equivalent"]
    assert [d["verdict"] for d in data] == ["could not judge", "equivalent"]


def test_paths_are_shown_literally_and_safely(tmp_path: Path) -> None:
    """A file name with a control character reaches the terminal as a visible stand-in."""
    odd = tmp_path / "odd\x1bname.py"
    odd.write_text((MISTAKES / "softmax_axis.py").read_text())
    result = runner.invoke(app, ["check", f"{odd}:MultiHeadAttention", "--width", "200"])
    assert result.exit_code == 1
    assert "\x1b" not in result.output


def test_the_judge_imports_no_torch() -> None:
    """The judge room reads records: judging and reporting never need torch."""
    code = ("import sys, mha_tui.judge, mha_tui.judge.report; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'textual' not in sys.modules and 'typer' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------- the app


async def _loaded(app, pilot) -> None:
    """Until the worker has traced (and judged): the app is then fully drawn."""
    for _ in range(600):
        if app.trace is not None:
            break
        await pilot.pause(0.05)
    await pilot.pause()


async def test_app_check_marks_the_rail_and_shows_the_diagnosis() -> None:
    """explain --module ... --check: ✓/✗ in the rail, the judgement beside each stage."""
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.stage_view import StageView
    from mha_tui.app.widgets import StageRail
    from mha_tui.pipeline import checked
    from mha_tui.records.request import Request

    config = Config(SENTENCE)
    path = MISTAKES / "softmax_axis.py"
    run, checker = checked(Request(config, Source(module=f"{path}:MultiHeadAttention")))
    app = ExplainApp(config, loader=run, checker=checker)
    async with app.run_test(size=(120, 40)) as pilot:
        await _loaded(app, pilot)
        rail = app.query_one(StageRail)
        labels = {app.stage_ids[i]: str(rail.get_option_at_index(i).prompt)
                  for i in range(rail.option_count)}
        assert "✗" in labels["softmax"] and "✓" in labels["scores"], labels
        assert "✓" not in labels["softmax"]
        assert "✓" in labels["w_o"]  # the end-to-end difference does not mark W_O wrong
        app.stage_index = app.stage_ids.index("softmax")
        await pilot.pause()
        shown = app.query_one(StageView).plain
        assert "First wrong" in shown and "softmax_wrong_axis" in shown
        assert f":{marked_line(path)}" in shown
        app.stage_index = app.stage_ids.index("scores")
        await pilot.pause()
        shown = app.query_one(StageView).plain
        assert "check ✓" in shown and "First wrong" not in shown


async def test_app_without_check_has_no_marks() -> None:
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.widgets import StageRail
    from mha_tui.pipeline import checked
    from mha_tui.records.request import Request

    config = Config(SENTENCE)
    run, _ = checked(Request(config, Source(model="course")))
    app = ExplainApp(config, loader=run)
    async with app.run_test(size=(120, 40)) as pilot:
        await _loaded(app, pilot)
        rail = app.query_one(StageRail)
        prompts = [str(rail.get_option_at_index(i).prompt) for i in range(rail.option_count)]
        assert not any("✓" in p or "✗" in p for p in prompts)


def test_explain_check_needs_the_app() -> None:
    """--check marks the app; a transcript is `check`'s job: one line, exit 2."""
    result = subprocess.run([sys.executable, "-m", "mha_tui", "explain", SENTENCE, "--check",
                             "--dump", "-"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "mha-tui check" in result.stderr and len(result.stderr.splitlines()) == 1


def test_model_is_repeatable_and_every_model_is_listed() -> None:
    """An instructor judges several tutorials' modules at once; --help names them all."""
    result = runner.invoke(app, ["check", "--model", "course", "--model", "many-eyes",
                                 "--model", "blueprint", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [v["module"] for v in json.loads(result.output)] == ["course", "many-eyes", "blueprint"]
    help_text = " ".join(runner.invoke(app, ["check", "--help"]).output.split())
    assert "blueprint-einsum" in help_text


def test_a_row_that_could_not_load_says_why_under_it(tmp_path: Path) -> None:
    """The text table gave `load  load_error` and no reason; the reason is printed under the
    row (the same message as in JSON)."""
    (tmp_path / "mine.py").write_text("class M:\n    pass\n")
    (tmp_path / "broken.py").write_text("x = 1\ndef oops(:\n")
    result = runner.invoke(app, ["check", f"{tmp_path / 'mine.py'}:X",
                                 f"{tmp_path / 'broken.py'}:M", "--model", "course",
                                 "--width", "200"])
    assert result.exit_code == 3
    lines = result.output.splitlines()
    first = next(i for i, line in enumerate(lines) if "mine.py:X" in line)
    assert "has no 'X'; classes there: M" in lines[first + 1]
    second = next(i for i, line in enumerate(lines) if "broken.py:M" in line)
    assert "line 2: SyntaxError" in lines[second + 1]


def test_check_says_it_does_not_take_hf() -> None:
    result = subprocess.run([sys.executable, "-m", "mha_tui", "check", "--hf", "gpt2"],
                            capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "_TYPER_FORCE_DISABLE_TERMINAL": "1"})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("mha-tui: error: check does not take --hf")
    assert "explain --hf" in result.stderr and len(result.stderr.splitlines()) == 1


def test_the_text_report_has_no_trailing_spaces_when_not_a_terminal() -> None:
    """Piped or written to a file (course notes, a diff), the table's padding is not kept:
    no line ends in a space, as none of the transcripts' do."""
    for args in (["check", f"{MISTAKES / 'softmax_axis.py'}:MultiHeadAttention"],
                 ["check", "--model", "mygpt", "--model", "course"]):
        result = runner.invoke(app, args)
        assert result.exit_code in (0, 1), result.output
        lines = result.stdout.splitlines()
        assert any(line.lstrip().startswith(("stage", "submission")) for line in lines[:2])
        assert [line for line in lines if line != line.rstrip()] == []


def test_a_line_between_the_mask_and_softmax_is_blamed_not_the_mask() -> None:
    """`F.softmax(torch.relu(scores))`: the masked scores do reach softmax, through a relu
    that turns -inf into 0; the first wrong line is the relu's, in its own words, and the
    mask is not said to be discarded (it was `mask_missing` at the mask's line)."""
    path = MISTAKES / "relu_before_softmax.py"
    verdict = judged(f"{path}:MultiHeadAttention")
    assert not verdict.equivalent and verdict.diagnosis is not None
    assert verdict.diagnosis.kind == "extra_op", verdict.diagnosis
    assert verdict.diagnosis.line == marked_line(path)
    assert "torch.relu set the negative entries of the scores to 0" in verdict.diagnosis.message
    mask = next(row for row in verdict.stages if row.kind == "mask")
    assert mask.ok is None and "reach softmax" in mask.checked


def test_a_mask_that_writes_0_is_said_to_write_0_not_minus_inf() -> None:
    """`masked_fill(future, 0.0)`: the line is the mask's, and the words say what it wrote
    and why softmax still sees the future (it was an anonymous "changed the values")."""
    path = MISTAKES / "mask_fill_zero.py"
    verdict = judged(f"{path}:MultiHeadAttention")
    assert not verdict.equivalent and verdict.diagnosis is not None
    assert verdict.diagnosis.line == marked_line(path)
    assert "Tensor.masked_fill wrote 0 into 12 entries of the scores, not -inf" in \
        verdict.diagnosis.message  # 6 causal entries in each of 2 heads


def test_an_unplaced_op_is_named_as_torch_documents_it() -> None:
    """A soft-capping written wrong (tanh(s / cap) * 2 cap: no rule places it): `torch.tanh
    changed the values of the scores`, not `torch._VariableFunctionsClass.tanh`."""
    verdict = judged(f"{FIXTURES / 'unsound' / 'softcap_wrong_gain.py'}:MultiHeadAttention", C=16,
                     h=4)
    assert verdict.diagnosis is not None
    line = verdict.diagnosis.line
    # placed by its role in the dataflow first (issue 30), then what the op did
    assert verdict.diagnosis.message.startswith(
        f"a transform of the scores before softmax, line {line}: torch.tanh changed the values "
        "of the scores"), verdict.diagnosis.message
