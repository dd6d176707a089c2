"""What stages and verdicts say, word by word (issue 15, item 5: the recogniser's part).

Op stage titles read like the code that ran; an error stage claims no shape and no name it
does not have; a tensor mha-tui stacked from per-head modules says so and gives each head's
strides; checks and captions are grammatical; a NOT-equivalent verdict never prints
"Different but equivalent" and never shows a failing row as `max diff 0`; the missing W_O
is named at the line that returned the output; no dim is a `d0, d1` fallback where the
stage knows its dims.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.config import MODEL_NAMES, Config, Source
from mha_tui.pipeline import checked
from mha_tui.records.request import Request

from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)

FIXTURES = Path(__file__).parent / "fixtures"
UNSOUND = FIXTURES / "unsound"
SENTENCE = "I love AI !"
runner = CliRunner()

MODULE_STYLES = [
    f"{FIXTURES / 'check_variants.py'}:{name}"
    for name in ("FusedMaskFirst", "WhereMinusBillion", "SplitScale", "SdpaMaskArgument")
] + [
    f"{FIXTURES / 'nanogpt_attn.py'}:CausalSelfAttention",
    f"{FIXTURES / 'einsum_attn.py'}:EinsumAttention",
    f"{FIXTURES / 'rotary_attn.py'}:RotaryAttention",
    "torch.nn:MultiheadAttention",
]
EVERY_MODULE = [f"model:{m}" for m in MODEL_NAMES] + MODULE_STYLES


def traced(spec: str):
    config = Config(SENTENCE)
    source = Source(model=spec[6:]) if spec.startswith("model:") else Source(module=spec)
    run, _ = checked(Request(config, source))
    return run(config)


def short(spec: str) -> str:
    return spec.rsplit("/", 1)[-1]


# ---------------------------------------------------------------------------- op and error


def test_op_stage_titles_say_the_role_then_read_like_the_code() -> None:
    """An op stage is titled by its place in the dataflow, then its code as written and its
    line: `torch.zeros(3, 3)`, not `torch._VariableFunctionsClass.zeros (3, 3)`; a tuple of
    tensors is not `(TensorArg(index=0), ...)`."""
    from mha_tui.kinds.op import code_of

    trace = traced(f"{FIXTURES / 'odd_ops.py'}:OddOps")
    ops = [stage for stage in trace.stages if stage.kind == "op"]
    titles = [code_of(stage.title) for stage in ops]
    assert "torch.zeros(3, 3)" in titles, titles
    assert "torch.ones(4, 2)" in titles, titles
    assert any(t.startswith("torch.cat(") and "dim=-1" in t for t in titles), titles
    for stage in ops:
        assert stage.title.startswith("A transform of "), stage.title
        assert stage.title.endswith(f", line {stage.source.line}"), stage.title
    for title in titles:
        assert "_VariableFunctionsClass" not in title and "TensorArg" not in title, title


def test_an_indexed_assignment_is_shown_as_its_line_writes_it() -> None:
    """Meta's KV-cache write is `self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk`,
    not `to.setitem((:1, 0:6), out)` (the cache named by the op that made it): the kv_cache
    stage shows both lines as written, and no op stage is left for them."""
    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
    spec = f"{FIXTURES / 'public' / 'meta_llama.py'}:MetaLlamaAttention"
    run, _ = checked(Request(config, Source(module=spec)))
    trace = run(config)
    cache = trace.stage("kv_cache")
    for line in ("self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk",
                 "self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv"):
        assert line in cache.code.splitlines(), cache.code
    assert not [s.title for s in trace.stages if s.kind == "op" and "setitem" in s.title]


def test_the_error_stage_claims_no_shape_and_no_name_it_has_not() -> None:
    """The forward stopped: no `-> ()` output shape, and the last tensor it recorded (made
    by `torch.ones(4, 2)` on the failing line) is not called `bad`, which was never
    assigned."""
    trace = traced(f"{FIXTURES / 'odd_ops.py'}:OddOps")
    error = trace.stages[-1]
    assert error.kind == "error"
    assert "-> ()" not in error.transition, error.transition
    assert "-> ()" not in error.dims_transition, error.dims_transition
    for record in error.tensors:
        assert not record.name.endswith(": bad") and record.name != "bad", record.name


def test_the_error_stage_names_the_failing_line() -> None:
    trace = traced(f"{FIXTURES / 'odd_ops.py'}:OddOps")
    source = (FIXTURES / "odd_ops.py").read_text().splitlines()
    error = trace.stages[-1]
    assert error.kind == "error" and error.source is not None
    assert "grid @ torch.ones(4, 2)" in source[error.source.line - 1]


# ---------------------------------------------------------------------------- strides


@pytest.mark.parametrize("model", ["many-eyes", "raschka-wrapper"])
def test_stacked_heads_say_so_and_give_each_heads_strides(model: str) -> None:
    """A per-head module's tensors are h separate (B, T, .) tensors that mha-tui stacked to
    (B, h, T, .): three strides for a 4-d shape is wrong; say who stacked them, and give
    each head's own strides."""
    stacked = 0
    for stage in traced(f"model:{model}").stages:
        for record in stage.tensors:
            if len(record.strides) == len(record.shape):
                continue
            stacked += 1
            assert "stacked by mha-tui" in record.caption, (stage.id, record.name, record.caption)
            for head in range(record.shape[1]):
                assert f"head {head}" in record.caption, (stage.id, record.name, record.caption)
    assert stacked, "no stacked tensor found: the test looks at the wrong thing"


# ---------------------------------------------------------------------------- grammar


@pytest.mark.parametrize("spec", EVERY_MODULE, ids=short)
def test_checks_and_captions_are_grammatical(spec: str) -> None:
    """"out equals x @ W" (one name); "each equal" for several; no "scores's"."""
    for stage in traced(spec).stages:
        for check in stage.checks:
            assert not re.match(r"^[\w.]+ equal ", check.label), (stage.id, check.label)
        for record in stage.tensors:
            assert "s's " not in record.shares_with, (stage.id, record.shares_with)


# ---------------------------------------------------------------------------- dims


FALLBACK = re.compile(r"d\d+")
RECOGNISED = {"embed", "project", "view", "transpose", "scores", "scale", "mask", "softmax",
              "attend", "concat", "w_o", "dropout"}


@pytest.mark.parametrize("spec", EVERY_MODULE, ids=short)
def test_no_dim_is_a_fallback_where_the_stage_knows_its_dims(spec: str) -> None:
    """tests/test_trace.py's test_token_axes_and_dims_are_labelled only compared lengths, and
    the builder falls back to `d0, d1, ...` whenever they differ: it could not fail. Every
    stage of a recognised kind knows B, T, C, h and d_h: none of its axes, nor its shape
    line's, may be a fallback name."""
    for stage in traced(spec).stages:
        if stage.kind not in RECOGNISED:
            continue
        names = [*stage.dims_in, *stage.dims_out]
        for record in stage.tensors:
            assert len(record.dims) == len(record.shape), (stage.id, record.name)
            names += record.dims
        fallbacks = [n for n in names if FALLBACK.fullmatch(n)]
        assert not fallbacks, (stage.id, stage.dims_transition,
                               [(r.name, r.dims) for r in stage.tensors])


# ---------------------------------------------------------------------------- check's words


def _check(*specs: str, extra: tuple[str, ...] = ()) -> str:
    result = runner.invoke(app, ["check", *specs, "--width", "200", *extra])
    return result.output


def test_a_not_equivalent_verdict_never_says_different_but_equivalent(tmp_path: Path) -> None:
    """A module with biases (a legitimate difference) and an extra line at the end (the
    mistake): the biases are still said, but not as "Different but equivalent"."""
    from .attention_sources import Style, Tamper, source

    text, _ = source(Style(bias=True), Tamper("out", "add"))
    path = tmp_path / "biased.py"
    path.write_text(text)
    output = _check(f"{path}:MultiHeadAttention")
    assert "NOT equivalent" in output
    assert "biases" in output
    assert "Different but equivalent" not in output


@pytest.mark.parametrize("name", ["sliding_window", "fully_masked_row"])
def test_a_failing_row_never_shows_max_diff_0(name: str) -> None:
    """A ✗ mask row whose recomputed difference is 0 (it masks the wrong entries, each to
    -inf as it should) says what failed instead of a `0` that reads like a pass."""
    output = _check(f"{UNSOUND / name}.py:MultiHeadAttention")
    failing = [line for line in output.splitlines() if line.startswith("✗")]
    assert failing, output
    for line in failing:
        columns = line.split()
        assert columns[2] not in ("0", "0.0", "0.0e+00"), line


def test_the_missing_w_o_is_named_at_the_return_line() -> None:
    """The heads merged over two lines, the second the `return`: the missing W_O belongs
    after the return's expression, not after the merge's first line."""
    from .test_check import judged, marked_line

    path = UNSOUND / "no_oproj.py"
    verdict = judged(f"{path}:MultiHeadAttention")
    assert verdict.diagnosis.kind == "no_output_projection"
    assert verdict.diagnosis.line == marked_line(path)


NOT_SCALED = "Nothing scaled these scores"


@pytest.mark.parametrize("spec", [f"{FIXTURES / 'mistakes' / 'no_scale.py'}:MultiHeadAttention",
                                  *EVERY_MODULE])
def test_softmax_says_when_nothing_scaled_the_scores(spec: str) -> None:
    """A forward with no scale stage (a learner's forgotten / sqrt(d_h), GPT-Neo by design)
    is said to feed softmax unscaled scores, with the √d_h it did not divide by; a module that
    scales (in its own line, inside baddbmm or inside the fused op) is not."""
    trace = traced(spec)
    softmax = next((s for s in trace.stages if s.kind == "softmax"), None)
    if softmax is None:  # the fused op: its expansion has its own scale
        return
    scaled = any(s.kind == "scale" for s in trace.stages)
    assert (NOT_SCALED in softmax.note) is not scaled, (short(spec), softmax.note)
    if not scaled:
        assert "not divided by √d_h = 1.414 (d_h = 2)" in softmax.note


def test_gpt_neo_is_said_not_to_scale() -> None:
    from .test_families import hf_trace

    assert NOT_SCALED in hf_trace("gpt-neo", 1).stage("softmax").note
    assert NOT_SCALED not in hf_trace("llama", 0).stage("softmax").note


def test_a_difference_line_says_equivalent_once() -> None:
    """`Different but equivalent: multiplies by d_h ** -0.5 ...`, not `...: equivalent` again."""
    output = _check(f"{FIXTURES / 'check_variants.py'}:SplitScale")
    lines = [line for line in output.splitlines() if "equivalent: " in line]
    assert lines and all(line.count("equivalent") == 1 for line in lines), lines


@pytest.mark.parametrize("ref", ["mechanisms/meta_llama.py:Attention",
                                 "public/meta_llama.py:MetaLlamaAttention"])
def test_one_line_that_binds_three_projections_names_each_by_its_target(ref: str) -> None:
    """`xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)`: K is xk and V is xv (they were all
    `xq`, then `xq (2)`, `xq (3)`)."""
    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
    path, cls = ref.split(":")
    init = (("dim", 16), ("n_heads", 4)) if path.startswith("public") else ()
    run, _ = checked(Request(config, Source(module=f"{FIXTURES / path}:{cls}", init=init)))
    project = run(config).stage("project")
    names = [t.name for t in project.tensors if t.shape[-1] != 16 or t.name.startswith("x")]
    assert [n for n in names if n.startswith("x")] == ["xq", "xk", "xv"], names


def test_a_cat_of_a_tuple_arguments_first_tensor_is_titled_as_written() -> None:
    """#27: `torch.cat((past_kv[0], k), dim=1)` with past_kv a forward argument (a tuple of
    the cached keys and values) was titled `torch.cat((past_kv, k), dim=1)`."""
    import torch
    from torch import nn

    from mha_tui.notebook import trace_of

    class Past(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W_k = nn.Linear(4, 4)

        def forward(self, x, past_kv):
            k = self.W_k(x)  # (B, T, C)
            k = torch.cat((past_kv[0], k), dim=1)  # (B, 2 + T, C)
            return k * 2

    cached = (torch.randn(1, 2, 4), torch.randn(1, 2, 4))
    traced = trace_of(Past(), torch.randn(1, 3, 4), call=lambda m, x: m(x, cached))
    from mha_tui.kinds.op import code_of

    assert "torch.cat((past_kv[0], k), dim=1)" in [code_of(stage.title) for stage in traced.stages
                                                   if stage.kind == "op"]
    assert [name for name, _ in traced.recording.inputs] == ["x", "past_kv[0]", "past_kv[1]"]


def test_every_kinds_title_has_one_home_read_without_numpy() -> None:
    """Each title in stages.TITLES belongs to a registered kind that is not one of the eleven
    (whose titles are their StageInfo's), and title_of reads any of them with neither NumPy
    nor torch imported (the app's rail and --stage need titles before a module runs)."""
    import subprocess
    import sys

    from mha_tui import stages
    from mha_tui.kinds import registry

    assert stages.TITLES and set(stages.TITLES) <= set(registry.BY_KIND) - set(stages.STAGE_IDS)
    code = ("import sys; from mha_tui.stages import TITLES, STAGE_IDS, title_of; "
            "titles = [title_of(k) for k in (*TITLES, *STAGE_IDS)]; "
            "print(len(set(titles)), sorted({'numpy', 'torch'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split(" ", 1) == [str(len(stages.TITLES) + 11), "[]\n"]
