"""Why this number? mha_tui.why against an independent NumPy computation, for every kind."""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.records import Trace
from mha_tui.why import KINDS, WhyError, main_tensor, parse_cell, why

from .conftest import ROOT, run_cli
from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)


@cache
def trace_of(model: str = "mygpt", embed_dim: int = 4, heads: int = 2,
             sentence: str = "I love AI !") -> Trace:
    return run_trace(Config(sentence, embed_dim=embed_dim, num_heads=heads), Source(model=model))


def _softmax(rows: np.ndarray) -> np.ndarray:
    shifted = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def independent(trace: Trace) -> dict[str, np.ndarray]:
    """Every stage's result from the stages before it, in float64, with NumPy alone: the
    tutorial's formulas, not mha-tui's why (no op snapshots, no shared helper)."""
    t = {s.id: s for s in trace.stages}
    x = t["embed"].tensor("x").values.astype(np.float64)
    table = t["embed"].tensors[1].values.astype(np.float64)
    ids = t["embed"].tensor("ids").values
    project = t["project"]
    weights = [r for r in project.tensors if r.dims == ("C_out", "C_in")]
    biases = [r for r in project.tensors if r.dims == ("C",)]
    q, k, v = (x @ w.values.astype(np.float64).T + (b.values if biases else 0)
               for w, b in zip(weights, biases or [None] * 3, strict=True))
    B, T, C = x.shape
    h = trace.config.num_heads
    d_h = C // h
    qh, kh, vh = (m.reshape(B, T, h, d_h).transpose(0, 2, 1, 3) for m in (q, k, v))
    scores = qh @ kh.transpose(0, 1, 3, 2)
    scaled = scores / np.sqrt(d_h)
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)
    masked = np.where(causal, -np.inf, scaled)
    probs = _softmax(masked)
    context = probs @ vh
    concat = context.transpose(0, 2, 1, 3).reshape(B, T, C)
    w_o = t["w_o"]
    out = concat @ w_o.tensors[0].values.astype(np.float64).T
    if len(w_o.tensors) == 3:
        out = out + w_o.tensors[1].values
    return {"embed": table[ids], "project": v, "view": v.reshape(B, T, h, d_h),
            "transpose": vh, "scores": scores, "scale": scaled, "mask": masked,
            "softmax": probs, "attend": context, "concat": concat, "w_o": out}


@pytest.mark.parametrize("model", ["mygpt", "course"])
@pytest.mark.parametrize(("embed_dim", "heads"), [(4, 2), (8, 4)])
def test_every_cell_of_every_kind_matches_an_independent_computation(
        model: str, embed_dim: int, heads: int) -> None:
    trace = trace_of(model, embed_dim, heads)
    expected = independent(trace)
    assert set(expected) | {"rotary", "kv_repeat", "pos_bias", "qkv_split", "residual", "norm",
                                     "dropout", "op", "error", "softcap", "kv_cache", "sinks",
                                     "cosine", "differential", "linear_attn"} == \
        set(KINDS)  # those: below (op and error: tests/test_why_op.py; cosine, differential,
    # linear_attn: tests/test_why_longtail.py; sinks: tests/test_why_sweep.py)
    for stage in trace.stages:
        record = main_tensor(stage)
        want = expected[stage.kind]
        assert want.shape == record.values.shape, stage.id
        for index in itertools.product(*map(range, record.values.shape)):
            cell = why(trace, stage.id, index)
            assert cell.agrees, (stage.id, index, cell.computed, cell.recorded)
            if np.isinf(want[index]):
                assert cell.computed == want[index], (stage.id, index)
            else:
                assert cell.computed == pytest.approx(want[index], rel=1e-5, abs=1e-6), (
                    stage.id, index)


@pytest.mark.parametrize("model", ["raschka", "many-eyes", "raschka-wrapper"])
def test_other_tutorials_agree_with_their_own_numbers(model: str) -> None:
    """Masking before scaling, heads as modules: every cell of every stage is explained and
    equals the module's."""
    trace = trace_of(model)
    explained = 0
    for stage in trace.stages:
        record = main_tensor(stage)
        for index in itertools.product(*map(range, record.values.shape)):
            cell = why(trace, stage.id, index)
            assert cell.agrees, (stage.id, index)
            explained += 1
    assert explained == sum(main_tensor(s).values.size for s in trace.stages)


@pytest.mark.parametrize("model", ["many-eyes", "raschka-wrapper"])
def test_per_head_projections_match_each_heads_own_layer(model: str) -> None:
    """Heads as modules of their own: V's channel c is head c // d_h's layer, row c % d_h,
    dotted with x; independently, x @ (the heads' weights stacked)^T, per head."""
    trace = trace_of(model, 8, 4)  # d_h = 2
    x = trace.stage("embed").tensor("x").values.astype(np.float64)
    project = trace.stage("project")
    stacked = [r for r in project.tensors if r.dims == ("C_out", "C_in")][-1].values
    expected = x @ stacked.astype(np.float64).T  # (1, T, C): head h's rows are h*d_h..
    record = main_tensor(project)
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "project", index)
        assert cell.computed == pytest.approx(expected[index], rel=1e-6, abs=1e-7), index
        assert cell.agrees
    cell = why(trace, "project", (0, 2, 5))
    assert "head 2's W[1, :]" in cell.formula
    assert any("channel 5 of" in note and "channel 1 of head 2's layer" in note
               for note in cell.notes)


MECHANISMS = Path(ROOT) / "tests" / "fixtures" / "mechanisms"


@cache
def mechanism_trace(ref: str, init: tuple[tuple[str, object], ...] = ()) -> Trace:
    return run_trace(Config("the cat sat on the mat", embed_dim=16, num_heads=4),
                     Source(module=str(MECHANISMS / ref), init=init))


def _rotate(values: np.ndarray, angles: np.ndarray, pairing: str) -> np.ndarray:
    """values (..., T, d) turned by angles (T, d/2), written out here from the papers."""
    cos, sin = np.cos(angles), np.sin(angles)
    if pairing == "half":
        a, b = np.split(values, 2, axis=-1)
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    a, b = values[..., 0::2], values[..., 1::2]
    return np.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(values.shape)


@pytest.mark.parametrize(("ref", "init", "pairing", "r"), [
    ("llama_rotary.py:LlamaAttention", (), "half", 4),
    ("neox_rotary.py:GPTNeoXAttention", (), "half", 2),
    ("gptj_rotary.py:GPTJAttention", (), "interleaved", 2),
    ("meta_llama.py:Attention", (("dim", 16),), "interleaved", 4),
], ids=["llama", "neox-partial", "gptj-partial", "meta-complex"])
def test_rotary_cells_match_a_rotation_by_t_times_omega(ref: str, init: tuple, pairing: str,
                                                        r: int) -> None:
    """K after = K before turned pair by pair by t · 10000^(-2i/r), computed here from the
    position alone (not from the module's tables); the pass-through channels are unchanged."""
    trace = mechanism_trace(ref, init)
    stage = trace.stage("rotary")
    before, after = stage.tensors[-2].values.astype(np.float64), main_tensor(stage)
    t_axis = 1 if ref.startswith(("gptj", "meta")) else 2  # (B, T, h, d_h) or (B, h, T, d_h)
    T = before.shape[t_axis]
    angles = np.arange(T)[:, None] * (10000.0 ** (-np.arange(r // 2) * 2 / r))[None, :]
    moved = np.moveaxis(before, t_axis, -2)
    turned = np.concatenate([_rotate(moved[..., :r], angles, pairing), moved[..., r:]], axis=-1)
    expected = np.moveaxis(turned, -2, t_axis)
    for index in itertools.product(*map(range, after.values.shape)):
        cell = why(trace, "rotary", index)
        assert cell.computed == pytest.approx(expected[index], rel=1e-5, abs=1e-5), index
        assert cell.agrees, index
        if index[-1] >= r:
            assert "pass-through" in cell.notes[0]


def test_kv_repeat_cells_are_their_kv_heads_copied() -> None:
    """V with h heads = np.repeat of V with h_kv heads along the head axis."""
    trace = mechanism_trace("llama_rotary.py:LlamaAttention")
    stage = trace.stage("kv_repeat")
    expected = np.repeat(stage.tensors[-2].values, 2, axis=1)
    record = main_tensor(stage)
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "kv_repeat", index)
        assert cell.computed == expected[index] and cell.agrees, index
    assert "query head 3 reads K/V head 3 // 2 = 1" in why(trace, "kv_repeat", (0, 3, 1, 0)).formula


def test_alibi_cells_are_the_scaled_score_plus_slope_times_key_position() -> None:
    """BLOOM's baddbmm: q · k / sqrt(d_h) + m_h · j with m_h = 2^(-8(h+1)/H), from the
    fused split's own q and k and the paper's slopes, not from the stage's bias tensor."""
    trace = mechanism_trace("alibi.py:BloomAttention")
    split = trace.stage("qkv_split")  # the fused projection cut into q, k, v and heads
    q = split.tensors[1].values.astype(np.float64)[0]  # (T, h, d_h)
    k = split.tensors[2].values.astype(np.float64)[0]
    slopes = 2.0 ** (-8 * np.arange(1, 5) / 4)
    T = q.shape[0]
    expected = np.einsum("ihd,jhd->hij", q, k) / 2.0 + slopes[:, None, None] * np.arange(T)
    record = main_tensor(trace.stage("pos_bias"))
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "pos_bias", index)
        assert cell.computed == pytest.approx(expected[index[1:]], rel=1e-5, abs=1e-6), index
        assert cell.agrees, index


def test_a_bias_added_after_scaling_is_score_plus_bias() -> None:
    """MPT adds its ALiBi bias after scaling, with a plain add: every cell is the add's
    recorded score plus the stage's bias, and the bias is slope × key position (up to a
    constant per row) by the paper's slopes."""
    from .test_families import hf_trace

    trace = hf_trace("mpt", 0)
    stage = trace.stage("pos_bias")
    record = main_tensor(stage)
    bias = np.broadcast_to(stage.tensors[0].values, record.values.shape).astype(np.float64)
    slopes = 2.0 ** (-8 * np.arange(1, record.shape[1] + 1) / record.shape[1])
    steps = np.diff(bias, axis=-1)
    np.testing.assert_allclose(steps, np.broadcast_to(slopes[None, :, None, None], steps.shape),
                               rtol=1e-5)
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "pos_bias", index)
        assert cell.agrees, index
        assert cell.terms[1].value == bias[index]
        assert cell.computed == pytest.approx(cell.terms[0].value + bias[index], rel=1e-12)


def _fused_channel(style: str, role: int, head: int, d: int, C: int, d_h: int) -> int:
    """Where a style's checkpoint keeps role (0 q, 1 k, 2 v) of head at d, from the styles'
    own code, not from mha-tui: timm (3, h, d_h), NeoX and BLOOM (h, 3, d_h) per head,
    Falcon's multi-query layer C queries then one key and one value of d_h each."""
    if style == "timm":
        return role * C + head * d_h + d
    if style == "falcon":
        return C + (role - 1) * d_h + d if role else head * d_h + d
    return head * 3 * d_h + role * d_h + d


@pytest.mark.parametrize(("source", "style"), [
    (("timm_fused.py:Attention", (("dim", 16),)), "timm"),
    (("neox_rotary.py:GPTNeoXAttention", ()), "neox"),
    (("alibi.py:BloomAttention", ()), "bloom"),
    ("falcon", "falcon"),
], ids=["timm", "neox", "bloom", "falcon-hf"])
def test_qkv_split_cells_are_read_from_their_fused_channel(source: object, style: str) -> None:
    """Every cell of the split's result (v) is the fused projection's output at the channel
    the style's own layout puts it, read unchanged, and equal to the module's number."""
    if style == "falcon":
        from .test_families import hf_trace

        trace = hf_trace("falcon", 0)
    else:
        trace = mechanism_trace(*source)  # type: ignore[misc]
    fused = trace.stage("project").tensors[-1].values  # the fused layer's output, (1, T, W)
    stage = trace.stage("qkv_split")
    record = main_tensor(stage)
    C = trace.config.embed_dim
    d_h = C // trace.config.num_heads
    heads = "h_kv" if "h_kv" in record.dims else "h"  # Falcon's v: its one K/V head
    axes = [record.dims.index(a) for a in ("B", "T", heads, "d_h")]
    for index in itertools.product(*map(range, record.values.shape)):
        b, t, head, d = (index[a] for a in axes)
        channel = _fused_channel(style, 2, head, d, C, d_h)
        cell = why(trace, "qkv_split", index)
        assert cell.computed == fused[b, t, channel] and cell.agrees, index
        assert f"channel {channel} = block {channel // d_h}" in cell.formula, cell.formula
        assert f"is v{head}" in cell.formula and "read unchanged, not computed" in cell.notes


def _layer_norm(rows: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = rows.mean(axis=-1, keepdims=True)
    var = ((rows - mean) ** 2).mean(axis=-1, keepdims=True)
    return (rows - mean) / np.sqrt(var + eps) * gamma + beta


def test_residual_cells_are_input_plus_w_o_then_the_modules_layer_norm() -> None:
    """BERT's post-norm: LayerNorm(x + W_O's output), with a LayerNorm whose weight and bias
    are not 1 and 0 (set here), computed in NumPy from the module's x, W_O's recorded output
    and the module's own parameters."""
    import torch

    from mha_tui.load.modules import load
    from mha_tui.pipeline import trace as trace_module

    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
    loaded = load(config, Source(module=str(MECHANISMS / "post_norm.py:BertAttention")))
    norm = loaded.module.output.LayerNorm
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(16, generator=generator) + 0.5)
        norm.bias.copy_(torch.randn(16, generator=generator))
    trace = trace_module(loaded.module, loaded.x, list(config.tokens))
    x = loaded.x.detach().numpy().astype(np.float64)
    summed = x + trace.stage("w_o").tensors[-1].values.astype(np.float64)
    gamma, beta = (p.detach().numpy().astype(np.float64) for p in (norm.weight, norm.bias))
    expected = _layer_norm(summed, gamma, beta, 1e-12)
    record = main_tensor(trace.stage("residual"))
    assert record.values.shape == expected.shape
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "residual", index)
        assert cell.computed == pytest.approx(expected[index], rel=1e-5, abs=1e-5), index
        assert cell.agrees, (index, cell.computed, cell.recorded)
        assert cell.terms[2].value == pytest.approx(summed[index], rel=1e-12)
        assert cell.terms[-1].parts[2] == pytest.approx(gamma[index[-1]], rel=1e-6)
        assert cell.terms[-1].parts[4] == pytest.approx(beta[index[-1]], rel=1e-6)
    assert "eps = 1e-12" in why(trace, "residual", (0, 1, 2)).terms[5].label


@pytest.mark.parametrize("rms", [False, True])
def test_norm_cells_are_the_modules_own_layer_norm_of_x(rms: bool) -> None:
    """A pre-LayerNorm inside the module (prenorm.py), with a weight and bias that are not 1 and
    0 (set here), and the same module with torch's RMSNorm in its place: every cell equals a
    NumPy normalisation of the module's x with its own parameters."""
    import torch

    from mha_tui.load.modules import load
    from mha_tui.pipeline import trace as trace_module

    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
    loaded = load(config, Source(module=str(MECHANISMS / "prenorm.py:PreNormAttention")))
    if rms:
        loaded.module.norm = torch.nn.RMSNorm(16, eps=1e-6)
    norm = loaded.module.norm
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(16, generator=generator) + 0.5)
        if not rms:
            norm.bias.copy_(torch.randn(16, generator=generator))
    trace = trace_module(loaded.module, loaded.x, list(config.tokens))
    x = loaded.x.detach().numpy().astype(np.float64)
    gamma = norm.weight.detach().numpy().astype(np.float64)
    if rms:
        expected = x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + 1e-6) * gamma
    else:
        expected = _layer_norm(x, gamma, norm.bias.detach().numpy().astype(np.float64), 1e-5)
    record = main_tensor(trace.stage("norm"))
    assert record.values.shape == expected.shape
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "norm", index)
        assert cell.computed == pytest.approx(expected[index], rel=1e-5, abs=1e-5), index
        assert cell.agrees, (index, cell.computed, cell.recorded)
    labels = [term.label for term in why(trace, "norm", (0, 1, 2)).terms]
    assert any(f"eps = {1e-6 if rms else 1e-5:g}" in label for label in labels), labels


def test_dropout_cells_are_zero_or_the_number_before_over_1_minus_p() -> None:
    """dropout_active.py's F.dropout(weights, p=0.1), on in eval mode: every cell is 0 where
    the mask dropped it, else the softmax's number / 0.9, computed from the recorded weights."""
    from mha_tui.load.modules import load
    from mha_tui.pipeline import trace as trace_module

    config = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
    fixture = Path(ROOT) / "tests" / "fixtures" / "mistakes" / "dropout_active.py"
    loaded = load(config, Source(module=f"{fixture}:MultiHeadAttention"))
    trace = trace_module(loaded.module, loaded.x, list(config.tokens))
    before = trace.stage("softmax").tensors[-1].values.astype(np.float64)
    record = main_tensor(trace.stage("dropout"))
    dropped = 0
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "dropout", index)
        if record.values[index] == 0 and before[index] != 0:
            dropped += 1
            assert cell.computed == 0
        else:
            assert cell.computed == pytest.approx(before[index] / 0.9, rel=1e-6, abs=1e-9)
        assert cell.agrees, (index, cell.computed, cell.recorded)
    assert dropped > 0


def test_residual_without_a_norm_is_the_input_plus_w_o() -> None:
    """BLOOM's `residual + dropout(dense(h))`: the input cell + W_O's cell, nothing after."""
    from .test_families import hf_trace

    trace = hf_trace("bloom", 0)
    stage = trace.stage("residual")
    w_o = trace.stage("w_o").tensors[-1].values.astype(np.float64)
    expected = stage.tensors[0].values.astype(np.float64) + w_o
    record = main_tensor(stage)
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "residual", index)
        assert cell.computed == pytest.approx(expected[index], rel=1e-12) and cell.agrees, index
        assert [t.label for t in cell.terms][-1] == "sum"


def test_a_large_d_h_shows_the_largest_products_and_sums_the_rest() -> None:
    trace = trace_of("mygpt", 32, 2)  # d_h = 16
    cell = why(trace, "scores", (0, 1, 3, 2))
    products = [t for t in cell.terms if t.parts]
    rest = [t for t in cell.terms if t.label.startswith("the other")]
    assert len(products) == 6 and len(rest) == 1 and rest[0].label == "the other 10 products"
    assert any("16 products: the 6 largest in size are shown" in note for note in cell.notes)
    shown = sorted(abs(t.value) for t in products)
    stage = trace.stage("transpose")
    q, k = stage.tensors[0].values[0, 1, 3], stage.tensors[1].values[0, 1, 2]
    everything = sorted(abs(q.astype(np.float64) * k.astype(np.float64)))
    assert shown == pytest.approx(everything[-6:])
    assert cell.terms[-1].value == pytest.approx(float(q.astype(np.float64) @ k), rel=1e-12)
    assert cell.agrees


def test_mask_says_why_a_cell_is_blocked_or_kept() -> None:
    trace = trace_of()
    blocked = why(trace, "mask", (0, 0, 1, 2))
    assert blocked.computed == -np.inf and "j > i" in blocked.notes[0]
    assert "AI (position 2) comes after query love (position 1)" in blocked.notes[0]
    kept = why(trace, "mask", (0, 1, 2, 1))
    assert "may look at it" in kept.notes[0] and kept.computed == kept.recorded


def test_a_wrong_number_is_marked_with_the_difference() -> None:
    """The check can fail: a recorded number that is not what the inputs give is ✗."""
    from dataclasses import replace

    trace = trace_of()
    stage = trace.stage("scores")
    values = stage.tensors[0].values.copy()
    values[0, 1, 2, 1] += 0.5
    tampered = replace(trace, stages=tuple(
        replace(s, tensors=(replace(s.tensors[0], values=values),)) if s.id == "scores" else s
        for s in trace.stages))
    cell = why(tampered, "scores", (0, 1, 2, 1))
    assert not cell.agrees and cell.difference == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize(("text", "message"), [
    ("softmax(0)", "--why takes STAGE[i, j, ...]"),
    ("softmax[0, 1, 9, 1]", "is outside weights, shape (1, 2, 4, 4)"),
    ("softmax[0, 1]", "give 4 indices"),
])
def test_bad_cells_are_refused(text: str, message: str) -> None:
    trace = trace_of()
    with pytest.raises(WhyError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        why(trace, *parse_cell(text))


LLAMA = ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
         "tests/fixtures/mechanisms/llama_rotary.py:LlamaAttention")


@pytest.mark.parametrize(("cell", "args", "name"), [
    ("softmax[0, 1, 2, 1]", ("I love AI !",), "softmax"),
    ("scores[0, 1, 2, 1]", ("I love AI !",), "scores"),
    ("project[0, 1, 3]", ("I love AI !", "--model", "many-eyes"), "project-many-eyes"),
    ("rotary[0, 1, 2, 3]", LLAMA, "rotary"),
    ("kv_repeat[0, 3, 2, 1]", LLAMA, "kv_repeat"),
    ("pos_bias[0, 3, 2, 1]", ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
                              "tests/fixtures/mechanisms/alibi.py:BloomAttention"), "pos_bias"),
    ("residual[0, 1, 2]", ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
                           "tests/fixtures/mechanisms/post_norm.py:BertAttention"), "residual"),
    ("qkv_split[0, 1, 2, 3]", ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
                               "tests/fixtures/mechanisms/timm_fused.py:Attention", "--init",
                               "dim=16"), "qkv_split"),
    ("norm[0, 1, 2]", ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
                       "tests/fixtures/mechanisms/prenorm.py:PreNormAttention"), "norm"),
])
def test_why_from_the_command_line_is_the_golden_text(cell: str, args: tuple[str, ...],
                                                      name: str) -> None:
    """`explain --dump - --why CELL`: the text in tests/golden (make golden writes it)."""
    result = run_cli("explain", *args, "--dump", "-", "--why", cell)
    assert result.returncode == 0, result.stderr
    golden = Path(ROOT) / "tests" / "golden" / f"why-{name}.txt"
    assert result.stdout.decode("utf-8") == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize(("args", "message"), [
    (("--why", "softmax[0, 1, 9, 1]"), "--why: softmax[0, 1, 9, 1] is outside weights"),
    (("--why", "nope[0]"), "'nope' is not a stage"),
    (("--why", "softmax[0, 1, 2, 1]", "--format", "json"), "--why writes text"),
])
def test_why_refusals_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = run_cli("explain", "I love AI !", "--dump", "-", *args)
    assert result.returncode == 2 and result.stdout == b""
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
