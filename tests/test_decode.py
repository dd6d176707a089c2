"""Decoding with a KV cache (issue #29, part 3: `--decode N`): the caches of public code
(tests/fixtures/kv_caches.py, written in GPT-2's, nanoGPT forks', Meta Llama's, gpt-fast's
and Raschka's styles) found from the forward's signature; each step traced on its own,
compared with the same row of the full, uncached forward; `check --decode` names the
classic bugs at their line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

import mha_tui
from mha_tui.config import Config, Source
from mha_tui.load.signature import Refused, cache_style
from mha_tui.notebook import text_of
from mha_tui.pipeline import verdict
from mha_tui.records.request import Expect, Request
from mha_tui.render.options import RenderOptions
from mha_tui.render.tensor import tensor_matrices
from mha_tui.why import why

from .conftest import run_cli
from .fixtures import kv_caches as kv
from .test_why_sweep import problems

TOKENS = "the cat sat on mats".split()
FILE = "tests/fixtures/kv_caches.py"

STYLES = {  # the module, the cache's kind, its parameter
    "raschka": (lambda: kv.CachedMultiHeadAttention(4, 4, 16, 2), "kept", "use_cache"),
    "gpt-2": (lambda: kv.GPT2Attention(4, 2), "passed", "layer_past"),
    "nanogpt": (lambda: kv.NanoGPTKVAttention(4, 2), "passed", "past_kv"),
    "meta llama": (lambda: kv.MetaLlamaDecoding(4, 2), "start_pos", "start_pos"),
    "gpt-fast": (lambda: kv.GPTFastDecoding(4, 2), "input_pos", "input_pos"),
    "bart (the cache third in the returned tuple)": (lambda: kv.BartDecoderAttention(4, 2),
                                                     "passed", "past_key_value"),
    "a dict cache": (lambda: kv.DictCacheAttention(4, 2), "passed", "cache"),
}


def _x() -> torch.Tensor:
    return torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(3))  # (B, T, C)


def _authors_full(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The module's uncached forward as its authors call it on a prompt, outside mha-tui."""
    with torch.no_grad():
        if isinstance(module, kv.MetaLlamaDecoding):
            return module(x, 0)
        if isinstance(module, kv.GPTFastDecoding):
            return module(x, torch.arange(x.shape[1]))
        out = module(x)
        return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("style", STYLES)
def test_each_cache_style_is_found_from_the_signature(style: str) -> None:
    make, kind, parameter = STYLES[style]
    module = make()
    methods = frozenset(n for n in dir(type(module)) if callable(getattr(type(module), n)))
    found = cache_style(module.forward, type(module).__name__, methods)
    assert (found.kind, found.parameter) == (kind, parameter)
    assert found.reset == ("reset_cache" if style == "raschka" else "")


def test_a_forward_without_a_cache_is_refused_in_one_line() -> None:
    from .fixtures.two_sequences import SelfOnly

    with pytest.raises(Refused) as refused:
        cache_style(SelfOnly(4, 2).forward, "SelfOnly.forward")
    assert "keeps no KV cache" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("style", STYLES)
def test_each_step_equals_the_same_row_of_the_full_forward(style: str) -> None:
    torch.manual_seed(0)
    module = STYLES[style][0]().eval()
    x = _x()
    full = _authors_full(module, x).numpy()  # (1, 5, 4), the authors' own call
    trace = mha_tui.trace(module, x, TOKENS, decode=2)
    assert [s.step.index for s in trace.steps] == [0, 1]
    for step, position in zip(trace.steps, (3, 4), strict=True):
        assert not step.failed, step.raised
        assert step.step.position == position and step.step.equal
        out = step.recording.snapshot(step.recording.output).values  # (1, 1, C)
        np.testing.assert_allclose(out[0, 0], full[0, position], atol=1e-5)
        weights = step.stage("softmax").tensors[-1] if style != "gpt-fast" else None
        if weights is not None:  # one new query against the cache and itself
            assert weights.values.shape[-2:] == (1, position + 1)
            matrix = tensor_matrices(weights, step.config, RenderOptions())[0]
            assert matrix.rows.labels == [TOKENS[position]]
            assert matrix.cols.labels == TOKENS[:position + 1]
        said = " ".join(c.label for c in step.stages[-1].checks)
        assert f"equals row {position} of the full, uncached forward" in said
        # K and V, C channels each, float32: the cost of a token in this module's cache
        assert f"{2 * 4 * 4} bytes per token" in said


def test_the_cache_stage_names_k_and_v_unbound_from_one_projection() -> None:
    """`q, k, v = qkv.permute(...)`: the keys joined to the cache are k (output 1 of the
    unbinding), the values v, not the line's first name."""
    trace = mha_tui.trace(kv.DictCacheAttention(4, 2).eval(), _x(), TOKENS, decode=1)
    names = [t.name for t in trace.steps[0].stage("kv_cache").tensors]
    assert names == ["k new", "k cached", "v new", "v cached"]


class LearnedMemoryKeys(torch.nn.Module):
    """Not a cache: learned memory keys and values joined to every forward's (lucidrains'
    num_mem_kv), a cat whose other operand is a parameter."""

    def __init__(self, d_model: int, n_heads: int, n_mem: int = 2) -> None:
        super().__init__()
        self.h, self.d_h = n_heads, d_model // n_heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.mem_k = torch.nn.Parameter(torch.randn(n_heads, n_mem, self.d_h))
        self.mem_v = torch.nn.Parameter(torch.randn(n_heads, n_mem, self.d_h))
        self.out = torch.nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, self.d_h).transpose(1, 2) for t in (q, k, v))
        k = torch.cat((self.mem_k.expand(B, -1, -1, -1), k), dim=2)
        v = torch.cat((self.mem_v.expand(B, -1, -1, -1), v), dim=2)
        w = (q @ k.transpose(-2, -1) / self.d_h ** 0.5).softmax(dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("style", STYLES)
def test_each_step_shows_the_cache_growing_as_a_stage(style: str) -> None:
    """The cat onto the cached keys (or the slot written into a cache allocated up front) is
    the kv_cache stage, not an anonymous op: the new token's k and v, the cache after the
    step, and a check recomputed from the recorded operands."""
    torch.manual_seed(0)
    trace = mha_tui.trace(STYLES[style][0]().eval(), _x(), TOKENS, decode=2)
    for step, position in zip(trace.steps, (3, 4), strict=True):
        stage = step.stage("kv_cache")
        assert {op.name for op in stage.ops} & {"cat", "setitem"}
        assert not [op for s in step.stages if s.kind == "op" for op in s.ops
                    if op.name in ("cat", "setitem")]
        assert [c.ok for c in stage.checks] == [True] * len(stage.checks) and stage.checks
        new, cached = stage.tensors[-2:]
        assert new.values.shape != cached.values.shape
        assert "T_k" in cached.dims or "slot" in cached.dims
        if "T_k" in cached.dims:  # joined: the cache holds every token up to this one
            assert cached.values.shape[cached.dims.index("T_k")] == position + 1
        assert f"{position} cached rows" in stage.explanation or \
            f"at slot {position}" in stage.explanation
        # why this number: every asked cell of the cache, recomputed from the recorded operands
        only = replace(step, stages=(stage,))
        assert problems(only)[0] == [] and problems(only)[1] >= 3


def test_learned_memory_keys_are_not_a_cache() -> None:
    torch.manual_seed(0)
    trace = mha_tui.trace(LearnedMemoryKeys(4, 2).eval(), _x(), TOKENS)
    assert "kv_cache" not in [s.kind for s in trace.stages]


def test_every_transcript_format_has_every_step() -> None:
    from mha_tui.write.dump import to_json
    from mha_tui.write.pictures import to_html, to_markdown, to_svg

    trace = mha_tui.trace(kv.GPT2Attention(4, 2).eval(), _x(), TOKENS, decode=3)
    text = text_of(trace)
    assert [f"decode step {i} of 3" in text for i in (1, 2, 3)] == [True] * 3
    assert "T_q=1 T_k=5 (4 cached)" in text
    document = json.loads(to_json(trace))
    assert [s["position"] for s in document["decode"]] == [2, 3, 4]
    assert all(s["equal_to_full_forward"] for s in document["decode"])
    html = to_html(trace, RenderOptions())
    assert 'id="step-3-stage-1"' in html and html.count("<header>") == 3
    assert to_markdown(trace, RenderOptions()).count("# decode step") == 3
    svg = to_svg(trace, RenderOptions())
    assert [f"decode&#160;step&#160;{i}&#160;of&#160;3" in svg for i in (1, 2, 3)] == [True] * 3


def test_a_step_that_differs_says_so_on_its_last_stage() -> None:
    trace = mha_tui.trace(kv.MaskFromZero(4, 4, 16, 2).eval(), _x(), TOKENS, decode=1)
    step = trace.steps[0]
    assert step.step.equal is False
    assert any("is NOT row 4 of the full" in c.label and c.ok is False
               for c in step.stages[-1].checks)


# ---------------------------------------------------------------- check --decode


def _verdict(cls: str, expect: Expect | None = None):
    request = Request(Config("the cat sat on mats"), Source(module=f"{FILE}:{cls}"),
                      expect or Expect(), steps=2)
    return verdict(request)


@pytest.mark.parametrize(("cls", "expect"), [
    ("CachedMultiHeadAttention", Expect()), ("GPT2Attention", Expect()),
    ("NanoGPTKVAttention", Expect()), ("MetaLlamaDecoding", Expect(rotary=True)),
    ("GPTFastDecoding", Expect(rotary=True))])
def test_a_correct_cache_is_equivalent(cls: str, expect: Expect) -> None:
    judged = _verdict(cls, expect)
    assert judged.equivalent, judged.diagnosis
    rows = [row for row in judged.stages if row.kind == "decode"]
    assert [row.ok for row in rows] == [True, True]


@pytest.mark.parametrize(("cls", "kind", "line", "expect"), [
    ("CacheOnHeads", "cache_axis", "torch.cat([self.cache_k, keys_new], dim=2)", Expect()),
    ("GPT2CacheOnHeads", "cache_axis", "key = torch.cat((past_key, key), dim=-1)", Expect()),
    ("MaskFromZero", "cache_mask_offset", "mask_bool = self.mask.bool()[:num_tokens_Q", Expect()),
    ("MetaRotaryFromZero", "cache_rotary_offset", "freqs_cis = self.freqs_cis[0:seqlen]",
     Expect(rotary=True)),
    ("CacheNotReset", "cache_not_reset", "def reset_cache(self):", Expect())])
def test_the_classic_cache_bugs_are_named_at_their_line(cls: str, kind: str, line: str,
                                                        expect: Expect) -> None:
    judged = _verdict(cls, expect)
    assert not judged.equivalent and judged.diagnosis is not None
    assert judged.diagnosis.kind == kind, judged.diagnosis.message
    with open(judged.diagnosis.file) as source:
        assert line in source.read().splitlines()[judged.diagnosis.line - 1]


def test_check_decode_from_the_command_line() -> None:
    good = run_cli("check", f"{FILE}:GPT2Attention", "--decode", "2")
    assert good.returncode == 0, good.stdout.decode() + good.stderr.decode()
    bad = run_cli("check", f"{FILE}:MaskFromZero", "--decode", "2")
    assert bad.returncode == 1
    assert "[cache_mask_offset] decode step 1: the mask ignores the cache's offset" in " ".join(
        bad.stdout.decode().split())


def test_explain_decode_from_the_command_line(tmp_path) -> None:
    result = run_cli("explain", "the cat sat on the mat", "--module", f"{FILE}:NanoGPTKVAttention",
                     "--decode", "2", "--dump", "-")
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "decode step 1 of 2" in text and "decode step 2 of 2" in text
    assert "a cache passed in as past_kv and returned" in " ".join(text.split())
    for bad, said in ((["--decode", "6"], "decode between 1 and 5"),
                      (["--model", "mygpt", "--decode", "1"], "keeps no KV cache")):
        refused = run_cli("explain", "the cat sat on the mat", *bad, "--dump", str(tmp_path / "t"))
        err = refused.stderr.decode().strip()
        assert refused.returncode == 2 and said in err and "\n" not in err, err
        assert not (tmp_path / "t").exists()


_HOOKED_CACHE = """import torch
from torch import nn


class HookedCache(nn.Module):
    \"\"\"Whisper's style: kv_cache is a dict that hooks on self.key / self.value fill,
    installed by the model; the forward itself returns no cache.\"\"\"

    def __init__(self, n_state, n_head):
        super().__init__()
        self.n_head = n_head
        self.query, self.key = nn.Linear(n_state, n_state), nn.Linear(n_state, n_state)
        self.value, self.out = nn.Linear(n_state, n_state), nn.Linear(n_state, n_state)

    def forward(self, x, xa=None, mask=None, kv_cache=None):
        q, k, v = self.query(x), self.key(x), self.value(x)
        B, T, C = q.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        w = (q @ k.transpose(-1, -2) / (C // self.n_head) ** 0.5).softmax(-1)
        return self.out((w @ v).transpose(1, 2).reshape(B, T, C))
"""


def test_a_cache_the_forward_does_not_return_is_refused_in_one_line(tmp_path) -> None:
    """A kv_cache parameter filled by hooks elsewhere (Whisper's): --decode finds no cache
    in what the forward returns and says so in one line, exit 2, nothing written (it was a
    traceback)."""
    (tmp_path / "hooked.py").write_text(_HOOKED_CACHE, encoding="utf-8")
    out = tmp_path / "t.txt"
    refused = run_cli("explain", "the cat sat on the mat", "--module",
                      f"{tmp_path / 'hooked.py'}:HookedCache", "--init", "n_state=4",
                      "--init", "n_head=2", "--decode", "1", "--dump", str(out))
    err = refused.stderr.decode().strip()
    assert refused.returncode == 2 and "Traceback" not in err and "\n" not in err, err
    assert err.startswith("mha-tui: error: ") and "returned no cache" in err
    assert not out.exists()


async def test_the_app_moves_between_decode_steps_with_d() -> None:
    """d draws the next decode step at the same stage: its own new token and numbers."""
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.stage_view import StageView
    from mha_tui.pipeline import traced

    request = Request(Config("the cat sat on mats"), Source(module=f"{FILE}:GPT2Attention"), steps=2)
    trace = traced(request)
    app = ExplainApp(trace.config, trace=trace, start="scores")
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        assert app.check_action("decode_step", (1,)) is True
        shown = app.query_one(StageView).plain
        assert "1 x 4" in shown
        await pilot.press("d")
        await pilot.pause()
        assert app.trace is trace.steps[1] and app.stage_index == trace.index("scores")
        assert "1 x 5" in app.query_one(StageView).plain
        await pilot.press("D")
        assert app.trace is trace.steps[0]


async def test_the_step_key_is_hidden_without_decoding() -> None:
    from .test_app import make_app

    app = make_app()
    async with app.run_test(size=(100, 32)):
        assert app.check_action("decode_step", (1,)) is False


def test_the_python_api_checks_decoding() -> None:
    """mha_tui.check(decode=N) judges as `check --decode N` does."""
    good = mha_tui.check(kv.NanoGPTKVAttention(4, 2).eval(), _x(), TOKENS, decode=2)
    assert good.equivalent, good.verdict.diagnosis
    assert len(good.trace.steps) == 2
    bad = mha_tui.check(kv.CacheNotReset(4, 4, 16, 2).eval(), _x(), TOKENS, decode=2)
    assert not bad.equivalent and bad.verdict.diagnosis.kind == "cache_not_reset"
    assert "decode step 2 of 2" in text_of(bad.trace)


# ---------------------------------------------------------------- --hf: Hugging Face's Cache


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("transformers")
    from .hf_models import save_tiny_gpt2

    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-decode"))


def test_hf_decode_steps_equal_the_models_own_attention(tiny_gpt2_dir) -> None:
    """A causal LM's decode step against its DynamicCache: the recorded weights are the
    model's own (output_attentions), the output its full forward's row, and the cache costs
    layers x 2 x kv-heads x d_h x 4 bytes a token, as measured from its tensors."""
    from mha_tui.load import hf
    from mha_tui.pipeline.hf_decode import decode_trace

    loaded = hf.load(str(tiny_gpt2_dir))
    trace = decode_trace(loaded, "The cat sat on the mat.", 1, 2)
    info = loaded.info
    per_token = info.n_layers * 2 * info.num_heads * info.head_dim * 4
    for step in trace.steps:
        assert step.step.equal, step.step.max_diff
        said = {c.label: c.ok for c in step.stages[-1].checks}
        own = [ok for label, ok in said.items() if "the model's own attention weights" in label]
        assert own == [True]
        cost = [label for label in said if label.startswith("the model's KV cache")]
        assert len(cost) == 1 and f"= {per_token} bytes per token" in cost[0]
        assert f"measured {per_token * (step.step.position + 1)} bytes" in cost[0]
        assert step.config.key_tokens[-1] == step.config.tokens[0]
    assert trace.steps[1].step.position == trace.steps[0].step.position + 1


def test_hf_decode_from_the_command_line(tiny_gpt2_dir) -> None:
    result = run_cli("explain", "The cat sat on the mat.", "--hf", str(tiny_gpt2_dir), "--layer", "1",
                     "--decode", "2", "--dump", "-")
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "decode step 2 of 2" in text and "DynamicCache" in text


def test_grading_several_takes_decode() -> None:
    """The steps travel to the grader's workers in the Request (each module its own process)."""
    result = run_cli("check", f"{FILE}:GPT2Attention", f"{FILE}:MaskFromZero", "--decode", "2",
                     "--sandbox", "off", "--format", "json")
    reports = json.loads(result.stdout.decode())
    assert [(r["verdict"], (r["diagnosis"] or {}).get("kind")) for r in reports] == [
        ("equivalent", None), ("NOT equivalent", "cache_mask_offset")]
    assert result.returncode == 1


def test_zero_columns_are_the_keys_blocked_for_every_query() -> None:
    """ops.numeric.zero_columns: a key is blocked when its weight is 0 in every head and row;
    keys past `visible` are not asked about (a cache allocated up front masks them)."""
    from mha_tui.ops.numeric import zero_columns

    weights = np.array([[[[0.5, 0.0, 0.5, 0.0]]], [[[0.4, 0.0, 0.0, 0.6]]]])  # (h=2, 1, 1, 4)
    assert zero_columns(weights, 4) == [1]
    assert zero_columns(weights, 2) == [1]
    assert zero_columns(weights[:1], 3) == [1]
    assert zero_columns(np.ones((1, 1, 1, 3)) / 3, 3) == []


# ---------------------------------------------------------------- gpt-fast's decode step


def test_a_gpt_fast_step_turns_its_new_token_as_a_rotary_stage() -> None:
    """gpt-fast's stacked pairs (`reshape(..., -1, 2)`, `stack`, `flatten(3)`) on the one new
    token: one rotary stage, turned for the token's own position, every cell explained; the
    keys of its KVCache (allocated up front) are the tokens, then the slots not written yet."""
    torch.manual_seed(0)
    trace = mha_tui.trace(kv.GPTFastDecoding(8, 2).eval(), _x8(), TOKENS, decode=2)
    for step, position in zip(trace.steps, (3, 4), strict=True):
        kinds = [s.kind for s in step.stages]
        assert kinds.count("rotary") == 1 and "scale" not in kinds[:kinds.index("scores")]
        assert not [s for s in step.stages if s.kind == "op" and "stack" in " ".join(
            op.name for op in s.ops)]
        rotary = step.stage("rotary")
        offset = rotary.checks[0]
        assert offset.ok and f"turned for its position {position}" in offset.label
        only = replace(step, stages=(rotary,))
        found, asked = problems(only)
        assert found == [] and asked >= 3
        cell = why(step, "rotary", (0, 0, 0, 1))
        assert f"at position {position}" in " ".join(cell.notes)
        weights = step.stage("softmax").tensors[-1]
        assert weights.dims == ("B", "h", "T", "T_k") and weights.values.shape[-1] == 16
        matrix = tensor_matrices(weights, step.config, RenderOptions(full=True))[0]
        assert matrix.rows.labels == [TOKENS[position]]
        assert matrix.cols.labels[:position + 1] == TOKENS[:position + 1]
        assert set(matrix.cols.labels[position + 1:]) == {"<unused>"}
        # the unused slots are masked: no weight on them
        assert not weights.values[..., position + 1:].any()


def _x8() -> torch.Tensor:
    return torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(3))  # (B, T, C)


class MetaRotaryOffByOne(kv.MetaLlamaDecoding):
    """The rotary table read one position early (`start_pos - 1`)."""

    def forward(self, h: torch.Tensor, start_pos: int = 0):
        _bsz, seqlen, _ = h.shape
        first = max(start_pos - 1, 0)
        freqs_cis = self.freqs_cis[first: first + seqlen]
        mask = None
        if seqlen > 1:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=h.device)
            mask = torch.triu(mask, diagonal=1)
            mask = torch.hstack([torch.zeros((seqlen, start_pos), device=h.device), mask]).type_as(h)
        return self.attention(h, start_pos, freqs_cis, mask)


@pytest.mark.parametrize(("make", "used"), [
    (lambda: kv.MetaRotaryFromZero(8, 2), lambda t: 0),
    (lambda: MetaRotaryOffByOne(8, 2), lambda t: t - 1)])
def test_the_rotary_offset_bug_says_which_position_was_used(make, used) -> None:
    from mha_tui.judge.decode import step_diagnosis

    torch.manual_seed(0)
    trace = mha_tui.trace(make().eval(), _x8(), TOKENS, decode=2)
    for step in trace.steps:
        t = step.step.position
        assert step.step.equal is False
        diagnosis = step_diagnosis(step)
        assert diagnosis.kind == "cache_rotary_offset"
        assert f"must be rotated for position {t}, but they were rotated for position " \
               f"{used(t)} instead" in diagnosis.message
        offset = step.stage("rotary").checks[0]
        assert offset.ok is False and f"position {used(t)}'s turn" in offset.label


# ---------------------------------------------------------------- --decode with --context / --batch

TWO = "tests/fixtures/two_sequences.py"


class MetaWithMask(kv.MetaLlamaDecoding):
    """Meta's decoding wrapper with a mask parameter: one start_pos for every row."""

    def forward(self, h: torch.Tensor, start_pos: int = 0, mask=None):
        return super().forward(h, start_pos)


@pytest.mark.parametrize(("args", "said"), [
    ((f"{TWO}:SDCrossAttention", "--init", "query_dim=4", "--context", "le chat"),
     "--decode with --context: SDCrossAttention.forward keeps no KV cache: the context's keys "
     "and values are made again from the context at every call"),
    ((f"{TWO}:WhisperAttention", "--init", "n_state=4", "--init", "n_head=2", "--context",
      "le chat"), "--decode with --context is not built: WhisperAttention.forward takes a KV "
     "cache (kv_cache) beside its context"),
    ((f"{FILE}:GPT2Attention", "--batch", "a b"),
     "--decode with --batch is not built: decoding padded rows needs them padded on the left"),
    ((f"{FILE}:NanoGPTKVAttention", "--batch", "a b"),
     "NanoGPTKVAttention.forward(x, past_kv, use_cache) has no parameter for a padding mask"),
])
@pytest.mark.parametrize("command", ["explain", "check"])
def test_decode_with_context_or_batch_is_refused_saying_why(args, said, command, tmp_path) -> None:
    out = tmp_path / "out.txt"
    module, *rest = args
    where = ("--module", module) if command == "explain" else (module,)
    done = run_cli(command, *(("the cat sat on mats",) if command == "explain" else ()), *where,
                   *rest, "--decode", "1", *(("--dump", str(out)) if command == "explain" else ()))
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1 and said in err, err
    assert "Traceback" not in err and not out.exists() and not done.stdout


def test_one_position_for_every_row_is_why_a_start_pos_cache_cannot_decode_a_batch() -> None:
    from mha_tui.tracing.decode import decode_refusal

    said = decode_refusal(MetaWithMask(4, 2), cross=False, batch=True)
    assert "writes its cache at one start_pos for every row" in said
    said = decode_refusal(kv.NanoGPTKVAttention(4, 2), cross=False, batch=True)
    assert "takes no padding mask beside its cache" in said
    with pytest.raises(mha_tui.config.ConfigError, match=r"decode= with context=: .* keeps no KV"):
        from .fixtures.two_sequences import SDCrossAttention

        mha_tui.trace(SDCrossAttention(4), _x(), TOKENS, context=_x(), decode=1)
