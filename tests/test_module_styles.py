"""Module styles named as stages (issue 17): how public modules write the same attention.

`nn.MultiheadAttention(need_weights=False)` walks the same stages as need_weights=True (torch's
scaled_dot_product_attention expanded, its softmax the weights need_weights=True returns);
a fused QKV split by view/permute/unbind (timm, NeoX, BLOOM, Falcon) is its own stage. Each on
a hand-written module in tests/fixtures/mechanisms/, traced the way `--module` traces it, or a
tiny family checkpoint (tests/hf_families.py).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_tui.config import Config, Source
from mha_tui.load.modules import LoadedTorch, load
from mha_tui.pipeline import run_trace
from mha_tui.records import Trace

from .test_families import _families_root, hf_trace  # noqa: F401 (the checkpoints' fixture)

MECHANISMS = Path(__file__).parent / "fixtures" / "mechanisms"
SENTENCE = "the cat sat on the mat"


def _config(embed_dim: int = 32, heads: int = 4) -> Config:
    return Config(SENTENCE, embed_dim=embed_dim, num_heads=heads)


@cache
def _traced(ref: str, init: tuple[tuple[str, int], ...] = (), embed_dim: int = 32,
            heads: int = 4) -> tuple[Trace, LoadedTorch]:
    source = Source(module=str(MECHANISMS / ref), init=init)
    return run_trace(_config(embed_dim, heads), source), load(_config(embed_dim, heads), source)


def _kinds(trace: Trace) -> list[str]:
    return [stage.kind for stage in trace.stages]


# ---------------------------------------------------------------- need_weights=False


@pytest.mark.parametrize("embed_dim,heads", [(32, 4), (12, 3), (16, 2)])
def test_need_weights_false_walks_the_recipe_like_need_weights_true(embed_dim: int, heads: int) -> None:
    """The wrapped nn.MultiheadAttention called with need_weights=False: every stage of the
    recipe, no unplaced op, and W_O only the output projection's own ops (it held all 29)."""
    import mha_tui

    trace, loaded = _traced("mha_no_weights.py:SelfAttention", embed_dim=embed_dim, heads=heads)
    x, mask = loaded.x, loaded.kwargs.get("attn_mask")
    with_weights = mha_tui.trace(loaded.module.attn, x, call=lambda m, x: m(
        x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False))
    kinds = _kinds(trace)
    assert "op" not in kinds and {"scores", "scale", "mask", "softmax", "attend"} <= set(kinds)
    # the same stages; only the order of scale differs (need_weights=True scales q first)
    assert sorted(kinds) == sorted(["embed", *_kinds(with_weights)])
    w_o = trace.stage("w_o")
    assert [op.name for op in w_o.ops if op.name == "linear"] == ["linear"]
    assert len(w_o.ops) <= 3
    assert trace.stage("w_o").checks[-1].ok is True  # equals the module's own forward


@pytest.mark.parametrize("embed_dim,heads", [(32, 4), (12, 3)])
def test_need_weights_false_softmax_is_what_need_weights_true_returns(embed_dim: int, heads: int) -> None:
    """An independent witness: the same nn.MultiheadAttention asked for its weights
    (need_weights=True, average_attn_weights=False) returns the shown softmax, head by head."""
    trace, loaded = _traced("mha_no_weights.py:SelfAttention", embed_dim=embed_dim, heads=heads)
    x, mask = loaded.x, loaded.kwargs.get("attn_mask")
    with torch.no_grad():
        out, weights = loaded.module.attn(x, x, x, attn_mask=mask, need_weights=True,
                                          average_attn_weights=False)
    shown = torch.from_numpy(trace.stage("softmax").tensors[-1].values)
    assert shown.shape == weights.shape == (1, heads, x.shape[1], x.shape[1])
    assert torch.allclose(shown, weights, atol=1e-6)
    final = torch.from_numpy(trace.stages[-1].tensors[-1].values)
    assert torch.allclose(final, out, atol=1e-6)


def test_need_weights_false_names_torchs_own_tensors() -> None:
    """The packed projection's bias is in_proj_bias (was shown as `attn.bias`), and torch's
    permute(2, 0, 1, 3) back to tokens first is labelled (T, B, h, d_h)."""
    trace, _ = _traced("mha_no_weights.py:SelfAttention")
    names = [t.name for t in trace.stage("project").tensors]
    assert names[:2] == ["attn.in_proj_weight", "attn.in_proj_bias"]
    assert trace.stage("concat").tensors[0].dims == ("T", "B", "h", "d_h")


# ---------------------------------------------------------------- fused QKV split into heads


def _q_head_rows(style: str, head: int, d_h: int, heads: int) -> slice:
    """Which rows of the fused weight make query head `head`, as each public style lays its
    checkpoint out (independent of mha-tui: from the styles' own documentation)."""
    if style == "timm":  # (3, h, d_h): all queries first
        return slice(head * d_h, (head + 1) * d_h)
    return slice(head * 3 * d_h, head * 3 * d_h + d_h)  # NeoX and BLOOM: (h, 3, d_h) per head


@pytest.mark.parametrize("ref,init,style,layout", [
    ("timm_fused.py:Attention", (("dim", 32),), "timm",
     "[q0 q1 q2 q3 | k0 k1 k2 k3 | v0 v1 v2 v3]"),
    ("neox_rotary.py:GPTNeoXAttention", (), "neox", "[q0 k0 v0 | q1 k1 v1 | q2 k2 v2 | q3 k3 v3]"),
    ("alibi.py:BloomAttention", (), "bloom", "[q0 k0 v0 | q1 k1 v1 | q2 k2 v2 | q3 k3 v3]"),
])
def test_a_fused_split_into_heads_is_its_own_stage(ref: str, init: tuple, style: str, layout: str) -> None:
    """The projection stage holds the fused layer and its whole output; the next stage, the
    split, names the layout of its channel blocks, found from the values; and its q's head i
    is x times the rows of the weight that the style documents for query head i."""
    trace, loaded = _traced(ref, init)
    kinds = _kinds(trace)
    assert kinds.index("qkv_split") == kinds.index("project") + 1
    assert "op" not in kinds
    project, split = trace.stage("project"), trace.stage("qkv_split")
    assert "fused" in project.title and split.title.startswith("Split the fused projection")
    assert split.checks[0].ok is True and layout in split.checks[0].label
    assert layout in split.explanation
    fused = project.tensors[-1].values
    assert fused.shape == (1, 6, 96)
    weight = next(p for n, p in loaded.module.named_parameters() if p.ndim == 2 and p.shape[0] == 96)
    bias = next((p for n, p in loaded.module.named_parameters()
                 if p.ndim == 1 and p.shape[0] == 96), None)
    q = split.tensors[1]
    per_head = q.values if q.dims[1] == "T" else q.values.transpose(0, 2, 1, 3)  # (B, T, h, d_h)
    with torch.no_grad():
        for head in range(4):
            rows = _q_head_rows(style, head, 8, 4)
            expected = loaded.x @ weight[rows].T + (0 if bias is None else bias[rows])
            assert torch.allclose(torch.from_numpy(per_head[:, :, head].copy()), expected, atol=1e-5)


def test_the_falcon_split_shows_one_kv_head_for_all_query_heads() -> None:
    """Falcon's fused layer is (h + 2) d_h wide: the split names the multi-query layout, the
    scores and attend stages the broadcast of the one K/V head."""
    trace = hf_trace("falcon", 0)
    kinds = _kinds(trace)
    assert kinds[:4] == ["embed", "project", "qkv_split", "transpose"]
    split = trace.stage("qkv_split")
    assert "1 K/V head for 4 query heads" in split.title
    assert "[q0 q1 q2 q3 | k0 | v0]" in split.checks[0].label and split.checks[0].ok is True
    assert [t.values.shape for t in split.tensors] == [(1, 7, 48), (1, 7, 4, 8), (1, 7, 1, 8),
                                                       (1, 7, 1, 8)]
    project = trace.stage("project")
    assert project.checks[0].ok is True and "x @ W.T" in project.checks[0].label
    assert trace.stage("w_o").tensors[0].name == "dense.weight"
    for kind, product in (("scores", "Q_i @ K_0^T"), ("attend", "weights_i @ V_0")):
        check = trace.stage(kind).checks[0]
        assert product in check.label and "broadcasts" in check.label and check.ok is True
    assert "one K/V head for all 4 query heads" in trace.stage("scores").title


# ---------------------------------------------------------------- residual add and post-norm


def test_a_residual_add_and_post_norm_inside_the_module_is_named() -> None:
    """BERT's BertSelfOutput inside the module: W_O, then the module's input added back and
    LayerNorm'd; the sum is the input plus W_O's output, and the last tensor the module's own."""
    trace, loaded = _traced("post_norm.py:BertAttention")
    kinds = _kinds(trace)
    assert kinds[-2:] == ["w_o", "residual"] and "op" not in kinds
    stage = trace.stage("residual")
    assert stage.title.startswith("Residual connection and LayerNorm")
    assert [c.ok for c in stage.checks[:2]] == [True, True]
    assert "eps = 1e-12" in stage.checks[1].label  # the module's own eps, passed by keyword
    x, attention, summed, normed = (t.values for t in stage.tensors)
    assert np.array_equal(x, loaded.x.numpy())
    assert np.array_equal(attention, trace.stage("w_o").tensors[-1].values)
    with torch.no_grad():
        expected = torch.nn.functional.layer_norm(torch.from_numpy(summed), (32,), eps=1e-12,
                                                  weight=loaded.module.output.LayerNorm.weight,
                                                  bias=loaded.module.output.LayerNorm.bias)
        assert torch.allclose(torch.from_numpy(normed), expected, atol=1e-5)
        assert torch.equal(torch.from_numpy(normed), loaded.forward())


@pytest.mark.parametrize("name", ["bloom", "bert", "roberta"])
def test_a_familys_residual_add_is_its_own_stage(name: str) -> None:
    """BLOOM adds `residual` after its dense layer; BERT and RoBERTa LayerNorm(out + input):
    the last stage is the residual, its sum checked, no unplaced op."""
    trace = hf_trace(name, 0)
    assert _kinds(trace)[-1] == "residual" and "op" not in _kinds(trace)
    stage = trace.stage("residual")
    assert all(check.ok for check in stage.checks)
    assert ("LayerNorm" in stage.title) is (name != "bloom")


def test_a_residual_module_is_not_called_plain_attention_by_check() -> None:
    """The residual changes the output: `check` never calls the module equivalent."""
    from mha_tui.pipeline import Expect, check_source

    verdict = check_source(Config("I love AI !", embed_dim=32, num_heads=4),
                           Source(module=str(MECHANISMS / "post_norm.py:BertAttention")), Expect())
    assert not verdict.equivalent


# ---------------------------------------------------------------- what no rule knows


def test_softcapping_is_its_own_stage_between_the_scale_and_the_mask() -> None:
    """Gemma 2's `/ softcap, tanh, * softcap`: one soft-capping stage (issue 30), the one
    scale stays the scale stage (the capping's divide and multiply are not "the scale"),
    and its numbers are cap · tanh(scores / cap) of the scaled scores, recomputed here."""
    trace, _ = _traced("softcap.py:Gemma2Attention")
    assert len(trace.stage("scale").ops) == 1
    kinds = _kinds(trace)
    assert "op" not in kinds
    assert kinds.index("scale") < kinds.index("softcap") < kinds.index("mask") < kinds.index("softmax")
    stage = trace.stage("softcap")
    assert [op.name for op in stage.ops if op.name in ("div", "tanh", "mul")] == ["div", "tanh", "mul"]
    scaled = trace.stage("scale").tensors[-1].values.astype(np.float64)
    capped = stage.tensors[-1].values.astype(np.float64)
    assert np.allclose(capped, 0.5 * np.tanh(scaled / 0.5), atol=1e-6)
    assert np.abs(capped).max() < 0.5
    assert all(check.ok for check in stage.checks)


def test_a_wrong_softcapping_stays_op_stages_titled_by_role_and_code() -> None:
    """tanh(s / cap) * 2 cap: the factors do not undo each other, so no rule claims it; each
    line is an op stage titled by its role, then as the line writes it (`attn_weights /
    softcap`, not `attn_weights.div(0.5)`), and its line."""
    path = Path(__file__).parent / "fixtures" / "unsound" / "softcap_wrong_gain.py"
    trace = run_trace(_config(), Source(module=f"{path}:MultiHeadAttention"))
    titles = [stage.title for stage in trace.stages if stage.kind == "op"]
    lines = path.read_text().splitlines()
    code = ["attn_weights / softcap", "torch.tanh(attn_weights)", "attn_weights * gain"]
    at = [next(i + 1 for i, line in enumerate(lines) if written in line) for written in code]
    assert titles == [f"A transform of the scores before softmax: {written}, line {n}"
                      for written, n in zip(code, at, strict=True)]


INTERNAL = ("aux's", "op's", "_VariableFunctionsClass", "TensorArg", "qkv_split's")


ROLES = ("A transform of x before the projections", "A transform of q, k or v before the scores",
         "A transform of the scores before softmax", "A transform of the weights, after softmax",
         "A transform of the heads' outputs, after the weights are applied",
         "A transform of the output, after W_O")


def _readable(trace: Trace) -> list[str]:
    """What is wrong with the op stages' titles and tensor names: a title that is not its
    role in the dataflow, then its code and line; an internal name; a word of the code that
    is not in the code the stage ran."""
    import re

    wrong = []
    for stage in trace.stages:
        if stage.kind != "op":
            continue
        role, _, rest = stage.title.partition(": ")
        code, _, line = rest.rpartition(", line ")
        if role not in ROLES or not line.isdigit() or int(line) != stage.source.line:
            wrong.append(f"{stage.title}: not '<its role>: <its code>, line <its line>'")
        words = {w for w in re.findall(r"(?<![.\w])[A-Za-z_]\w*", code)} - {"torch", "F"}
        wrong += [f"{stage.title}: {w} not in its code" for w in words if w not in stage.code]
        wrong += [f"{stage.title}: {text}" for text in [stage.title, *(t.name for t in stage.tensors)]
                  if any(name in text for name in INTERNAL)]
    return wrong


# A fixture whose op stage's title is not yet its own code, and why (strict: a fix passes).
# name -> why its op stages' titles are not its own code yet (gpt-oss's sinks.py was here:
# `Q.new_full((n, n), -inf)`, an op on q; it reads only Q's dtype, and is its mask now)
NOT_OWN_CODE: dict[str, str] = {}


@pytest.mark.parametrize("ref", [
    pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=NOT_OWN_CODE[name])]
                 if name in NOT_OWN_CODE else [])
    for name in sorted(p.name for p in MECHANISMS.glob("*.py") if p.stem != "__init__")])
def test_op_stage_titles_are_the_modules_own_code(ref: str) -> None:
    """Over every module in tests/fixtures/mechanisms: an op stage's title is its role in
    the dataflow, then code whose names are in the lines it ran, and its line; no title or
    tensor name is an internal name."""
    source = (MECHANISMS / ref).read_text()
    import ast

    classes = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)
               and any(isinstance(b, ast.FunctionDef) and b.name == "forward" for b in n.body)]
    init = (("dim", 32),) if "def __init__(self, dim" in source else ()
    trace, _ = _traced(f"{ref}:{classes[-1].name}", init)
    assert _readable(trace) == []


@pytest.mark.parametrize("name", ["gpt-neo", "gpt-j", "gpt-neox", "phi", "llama", "mistral", "qwen2",
                                  "gemma", "bloom", "falcon", "opt", "mpt", "bert", "roberta"])
def test_op_stage_titles_in_a_family_are_its_own_code(name: str) -> None:
    """The same over the families that load (none has an op stage left today: the test
    keeps it so when a family's new mechanism falls back to one)."""
    assert _readable(hf_trace(name, 1 if name == "gpt-neo" else 0)) == []


def test_a_mask_made_in_the_forward_is_named_as_its_line_names_it() -> None:
    """Meta's `mask = torch.triu(torch.full(...), diagonal=1)` is `mask` (it was
    ` (converted: full ...)`); the mask torch's MHA converts and hands to its sdpa is
    `attn_mask` (it was `attn_mask=unsqueeze(unsqueeze(masked_fill_(zeros_like(attn_mask))))`)."""
    meta, _ = _traced("meta_llama.py:Attention", (("dim", 32),))
    assert meta.stage("mask").tensors[0].name == "mask"
    torch_mha, _ = _traced("mha_no_weights.py:SelfAttention")
    assert torch_mha.stage("mask").checks[0].label == "60 entries blocked by attn_mask are -inf"


def test_a_bias_built_by_a_helper_is_named_as_the_line_that_uses_it() -> None:
    """BLOOM's `alibi` comes back from `build_alibi_tensor(...)` and is used as
    `alibi.baddbmm(...)`: the stage calls it `alibi` (it was `'...', None (converted: ...)`)."""
    trace, _ = _traced("alibi.py:BloomAttention")
    assert trace.stage("pos_bias").tensors[0].name == "alibi"
