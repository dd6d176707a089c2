"""Why this number? on modules written with torch.einsum, torch.matmul / `@`, torch.bmm and
F.linear on raw nn.Parameter weights (no nn.Linear): every cell of every stage against the
module's forward written out here again in float64 torch, from the recorded x and the
recorded parameters (not mha-tui's code); the labels name the op and its operands."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.records import Trace
from mha_tui.why import Why, main_tensor, why

from .conftest import ROOT, run_cli

FIXTURES = Path(ROOT) / "tests" / "fixtures"
SHORT = "I love AI !"
LONG = "the cat sat on the mat and then it slept"  # 10 tokens: more terms than the panel lists


@cache
def trace_of(module: str, sentence: str = SHORT, C: int = 4, h: int = 2) -> Trace:
    return run_trace(Config(sentence, embed_dim=C, num_heads=h), Source(module=str(FIXTURES / module)))


def recorded(trace: Trace) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The forward's input x (1, T, C) and every parameter an op read, as recorded, float64."""
    assert trace.recording is not None
    x = torch.from_numpy(np.array(trace.stage("embed").tensor("x").values)).double()
    params = {ref.name: torch.from_numpy(np.array(trace.recording.snapshot(ref).values)).double()
              for op in trace.recording.ops for ref in op.inputs if ref.kind == "param"}
    return x, params


def causal(T: int) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool).triu(1)  # True: the key is in the future


def einsum_attention(x: torch.Tensor, p: dict[str, torch.Tensor], h: int) -> dict[str, torch.Tensor]:
    """tests/fixtures/einsum_attn.py:EinsumAttention, step by step."""
    B, T, C = x.shape
    d = C // h
    q, k, v = (x @ p[n] for n in ("W_q", "W_k", "W_v"))  # (B, T, C), W stored (in, out)
    qh, kh, vh = (t.reshape(B, T, h, d).permute(0, 2, 1, 3) for t in (q, k, v))  # (B, h, T, d)
    scores = qh @ kh.transpose(-2, -1)
    scaled = scores * d ** -0.5
    masked = scaled.masked_fill(causal(T), -1e9)
    weights = masked.softmax(dim=-1)
    context = weights @ vh  # (B, h, T, d)
    concat = context.permute(0, 2, 1, 3).reshape(B, T, C)
    return {"project": v, "scores": scores, "scale": scaled, "mask": masked, "softmax": weights,
            "attend": context, "concat": concat, "w_o": concat @ p["W_o"]}


def heads_first(x: torch.Tensor, p: dict[str, torch.Tensor], h: int) -> dict[str, torch.Tensor]:
    """einsum_styles.py:HeadsFirstEinsum: weights stored (out, in), read as x @ W.T."""
    B, T, C = x.shape
    d = C // h
    q, k, v = (x @ p[n].T for n in ("W_q", "W_k", "W_v"))
    qh, kh, vh = (t.reshape(B, T, h, d).permute(0, 2, 1, 3) for t in (q, k, v))
    scores = qh @ kh.transpose(-2, -1)
    scaled = scores / math.sqrt(d)
    masked = scaled.masked_fill(causal(T), float("-inf"))
    weights = masked.softmax(dim=-1)
    context = weights @ vh
    concat = context.permute(0, 2, 1, 3).reshape(B, T, C)
    return {"project": v, "view": vh.permute(0, 2, 1, 3), "scores": scores, "scale": scaled,
            "mask": masked, "softmax": weights, "attend": context, "concat": concat,
            "w_o": concat @ p["W_o"].T}


def per_head(x: torch.Tensor, p: dict[str, torch.Tensor], h: int) -> dict[str, torch.Tensor]:
    """einsum_styles.py:PerHeadWeights: W_Q (h, C, d), W_O (h, d, C), TransformerLens' way.
    Its projections and W_O are project / w_o stages: a weight with a head axis is shown as
    the (h*d_h, C) / (C, h*d_h) layer it is."""
    T, C = x.shape[1:]
    d = C // h
    q, k, v = (torch.stack([x @ p[n][head] for head in range(h)], dim=1)  # (B, h, T, d)
               for n in ("W_Q", "W_K", "W_V"))  # the project stage's result is its last, v
    scores = q @ k.transpose(-2, -1)
    scaled = scores / d ** 0.5
    masked = scaled.masked_fill(causal(T), -1e5)
    weights = masked.softmax(dim=-1)
    z = weights @ v
    out = sum(z[:, head] @ p["W_O"][head] for head in range(h))
    return {"project": v.permute(0, 2, 1, 3), "scores": scores, "scale": scaled, "mask": masked,
            "softmax": weights, "attend": z, "w_o": out}


def matmul_parameters(x: torch.Tensor, p: dict[str, torch.Tensor], h: int) -> dict[str, torch.Tensor]:
    """einsum_styles.py:MatmulParameters: torch.matmul on raw weights, F.linear with a bias."""
    B, T, C = x.shape
    d = C // h
    q, k, v = (x @ p[n] for n in ("W_q", "W_k", "W_v"))
    qh, kh, vh = (t.reshape(B, T, h, d).permute(0, 2, 1, 3) for t in (q, k, v))
    scores = qh @ kh.transpose(-2, -1)
    weights = (scores / math.sqrt(d)).softmax(dim=-1)
    context = weights @ vh
    concat = context.permute(0, 2, 1, 3).reshape(B, T, C)
    return {"project": v, "scores": scores, "softmax": weights, "attend": context,
            "w_o": concat @ p["W_o"].T + p["b_o"]}


def batched_heads(x: torch.Tensor, p: dict[str, torch.Tensor], h: int) -> dict[str, torch.Tensor]:
    """einsum_styles.py:BatchedHeads: x @ W.T, torch.bmm on (B*h, T, .)."""
    B, T, C = x.shape
    d = C // h
    q, k, v = (x @ p[n].T for n in ("W_q", "W_k", "W_v"))
    qh, kh, vh = (t.reshape(B, T, h, d).permute(0, 2, 1, 3) for t in (q, k, v))
    scores = qh @ kh.transpose(-2, -1)
    weights = (scores / math.sqrt(d)).softmax(dim=-1)
    context = weights @ vh
    concat = context.permute(0, 2, 1, 3).reshape(B, T, C)
    return {"project": v, "scores": scores, "softmax": weights, "attend": context,
            "w_o": concat @ p["W_o"].T}


def in_out_einsum(x: torch.Tensor, p: dict[str, torch.Tensor], h: int) -> dict[str, torch.Tensor]:
    """einsum_styles.py:InOutEinsum: weights stored (in, out), "bti,io->bto"."""
    B, T, C = x.shape
    d = C // h
    q, k, v = (x @ p[f"W_qkv.{n}"] for n in range(3))
    qh, kh, vh = (t.reshape(B, T, h, d).permute(0, 2, 1, 3) for t in (q, k, v))
    scores = qh @ kh.transpose(-2, -1)
    weights = (scores * d ** -0.5).masked_fill(causal(T), float("-inf")).softmax(dim=-1)
    concat = (weights @ vh).permute(0, 2, 1, 3).reshape(B, T, C)
    return {"project": v, "scores": scores, "attend": weights @ vh, "w_o": concat @ p["W_out"]}


def keys_first(x: torch.Tensor, p: dict[str, torch.Tensor], h: int) -> dict[str, torch.Tensor]:
    """einsum_styles.py:KeysFirst: one fused (C, 3C) weight cut with chunk; the einsums take
    keys before queries and values before weights."""
    B, T, C = x.shape
    d = C // h
    q, k, v = (x @ p["W_qkv"]).chunk(3, dim=-1)
    qh, kh, vh = (t.reshape(B, T, h, d).permute(0, 2, 1, 3) for t in (q, k, v))
    scores = qh @ kh.transpose(-2, -1)
    weights = (scores / math.sqrt(d)).masked_fill(causal(T), float("-inf")).softmax(dim=-1)
    context = weights @ vh  # (B, h, T, d): shown heads first, as the other stages
    concat = context.permute(0, 2, 1, 3).reshape(B, T, C)
    return {"project": v, "scores": scores, "softmax": weights, "attend": context,
            "concat": concat, "w_o": concat @ p["W_o"]}

Reference = Callable[[torch.Tensor, dict[str, torch.Tensor], int], dict[str, torch.Tensor]]
CASES: dict[str, tuple[str, Reference, str, int, int]] = {
    "x @ W, einsum bqhd": ("einsum_attn.py:EinsumAttention", einsum_attention, SHORT, 4, 2),
    "einsum heads first": ("einsum_styles.py:HeadsFirstEinsum", heads_first, SHORT, 4, 2),
    "einsum heads first, d_h 16, T 10": ("einsum_styles.py:HeadsFirstEinsum", heads_first, LONG,
                                         32, 2),
    "per-head weights": ("einsum_styles.py:PerHeadWeights", per_head, SHORT, 4, 2),
    "torch.matmul, F.linear": ("einsum_styles.py:MatmulParameters", matmul_parameters, SHORT, 4, 2),
    "bmm, x @ W.T": ("einsum_styles.py:BatchedHeads", batched_heads, SHORT, 8, 2),
    "einsum (in, out)": ("einsum_styles.py:InOutEinsum", in_out_einsum, SHORT, 4, 2),
    "keys first, fused W": ("einsum_styles.py:KeysFirst", keys_first, SHORT, 4, 2),
}


def every_cell(trace: Trace, stage: str, expected: np.ndarray) -> list[Why]:
    record = main_tensor(trace.stage(stage))
    assert record.values.shape == expected.shape, (stage, record.values.shape, expected.shape)
    whys = []
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, stage, index)
        assert cell.agrees and cell.recomputed, (stage, index, cell.computed, cell.recorded)
        want = float(expected[index])
        if math.isinf(want):
            assert cell.computed == want, (stage, index)
        else:
            assert cell.computed == pytest.approx(want, rel=1e-5, abs=1e-6), (stage, index)
        whys.append(cell)
    return whys


@pytest.mark.parametrize("case", list(CASES))
def test_every_cell_of_every_stage_equals_the_forward_written_out_in_float64(case: str) -> None:
    """Each stage's why, on every cell, computes what the module's forward computes (written
    here in float64 torch from the recorded x and parameters) and agrees with the module's own
    number; every stage the trace shows after embed is covered."""
    module, reference, sentence, C, h = CASES[case]
    trace = trace_of(module, sentence, C, h)
    x, params = recorded(trace)
    expected = reference(x, params, h)
    shown = [s.id for s in trace.stages if s.id != "embed"]
    checked = {s for s in expected if s in shown}
    assert checked == set(expected), (shown, sorted(expected))
    for stage, values in expected.items():
        every_cell(trace, stage, values.numpy())


def test_the_issues_four_cells_are_explained_from_the_command_line() -> None:
    """The cells #20 found unexplained (`stage project holds no linear op`, `holds no op to
    explain`): each now prints its computation, ✓ equal to the module's own number, exit 0."""
    for cell in ("project[0,1,2]", "scores[0,0,1,2]", "attend[0,0,1,1]", "w_o[0,1,2]"):
        result = run_cli("explain", "--module", "tests/fixtures/einsum_attn.py:EinsumAttention",
                         "--heads", "2", SHORT, "--dump", "-", "--why", cell,
                         env={"_TYPER_FORCE_DISABLE_TERMINAL": "1"})
        text = result.stdout.decode("utf-8")
        assert result.returncode == 0 and result.stderr == b"", (cell, result.stderr)
        assert "computed by mha-tui from the recorded tensors" in text and "✓ equal" in text, text


def test_a_cell_outside_the_tensor_is_refused_with_exit_code_2() -> None:
    result = run_cli("explain", "--module", "tests/fixtures/einsum_attn.py:EinsumAttention",
                     "--heads", "2", SHORT, "--dump", "-", "--why", "scores[0, 0, 9, 1]")
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode().count("\n") == 1 and "outside" in result.stderr.decode()


def test_scores_name_the_einsum_and_its_operands_with_the_cells_indices() -> None:
    """scores[0, 1, 2, 3] of einsum("bqhd,bkhd->bhqk", q, k): q's row is q[0, 2, 1, :] (token
    2, head 1, tokens before heads as the module holds it), k's is k[0, 3, 1, :]."""
    trace = trace_of("einsum_attn.py:EinsumAttention")
    cell = why(trace, "scores", (0, 1, 2, 3))
    assert cell.formula == ("scores[0, 1, 2, 3] = view's q[0, 2, 1, :] · view's k[0, 3, 1, :]  "
                            "(a dot product over d_h = 2)")
    assert "torch.einsum('bqhd,bkhd->bhqk')'s recorded inputs" in cell.notes[0]
    q, k = (trace.stage("view").tensor(n).values for n in ("q", "k"))
    assert [t.parts[0] for t in cell.terms[:2]] == [float(q[0, 2, 1, 0]), float(q[0, 2, 1, 1])]
    assert [t.parts[2] for t in cell.terms[:2]] == [float(k[0, 3, 1, 0]), float(k[0, 3, 1, 1])]


def test_attend_reads_v_where_the_einsum_holds_it_tokens_first() -> None:
    """einsum("bhqk,bkhd->bqhd") is shown heads first: context[0, 1, 3, 0] (head 1, token 3)
    is the op's [0, 3, 1, 0], V's column v[0, k, 1, 0], one term per key token."""
    trace = trace_of("einsum_attn.py:EinsumAttention")
    cell = why(trace, "attend", (0, 1, 3, 0))
    assert "view's v[0, k, 1, 0]" in cell.formula
    assert [t.label.split(":")[0] for t in cell.terms[:-1]] == [f"key {w}" for w in SHORT.split()]
    v = trace.stage("view").tensor("v").values
    assert [t.parts[2] for t in cell.terms[:-1]] == [float(v[0, k, 1, 0]) for k in range(4)]


def test_w_o_says_which_head_each_input_channel_comes_from() -> None:
    trace = trace_of("einsum_attn.py:EinsumAttention")
    cell = why(trace, "w_o", (0, 1, 2))
    assert [t.label.split(":")[0] for t in cell.terms[:-1]] == [
        "in 0 (head 0, d0)", "in 1 (head 0, d1)", "in 2 (head 1, d0)", "in 3 (head 1, d1)"]
    assert cell.formula == "out[0, 1, 2] = concat's context[0, 1, :] · W_o[:, 2]"
    assert "column 2 of W_o" in cell.notes[1]


def test_a_weight_read_transposed_is_named_so() -> None:
    """x @ self.W_q.T: the factor is W_q.T (the op's recorded input), and an einsum that
    reads W as (out, in) ("btc,oc->bto") dots the token's x with W's row."""
    bmm = why(trace_of("einsum_styles.py:BatchedHeads", SHORT, 8, 2), "project", (0, 1, 5))
    assert bmm.formula == "v[0, 1, 5] = x[0, 1, :] · W_v.T[:, 5]"
    row = why(trace_of("einsum_styles.py:HeadsFirstEinsum"), "project", (0, 1, 2))
    assert row.formula == "v[0, 1, 2] = Σ over c of x[b,t,c] × W_v[o,c]  (einsum 'btc,oc->bto')"
    assert row.notes[0].startswith("x and W_v are torch.einsum('btc,oc->bto')'s recorded "
                                   "inputs: row 2 of W_v")


def test_a_long_dot_product_shows_the_largest_terms_and_sums_the_rest() -> None:
    """d_h 16 and 10 tokens: more products than the panel lists; the shown terms and the
    rest's line add up to the computed value."""
    trace = trace_of("einsum_styles.py:HeadsFirstEinsum", LONG, 32, 2)
    for stage, index in (("scores", (0, 1, 9, 4)), ("attend", (0, 0, 9, 3)), ("project", (0, 2, 7))):
        cell = why(trace, stage, index)
        assert cell.terms[-2].label.startswith("the other "), stage
        assert sum(t.value or 0.0 for t in cell.terms[:-1]) == pytest.approx(cell.computed), stage


def test_why_of_an_einsum_from_the_command_line_is_the_golden_text() -> None:
    """`explain --dump - --why CELL` on einsum("bhqk,bkhd->bqhd"): tests/golden (make golden)."""
    result = run_cli("explain", SHORT, "--heads", "2", "--module",
                     "tests/fixtures/einsum_attn.py:EinsumAttention", "--dump", "-", "--why",
                     "attend[0, 1, 2, 1]")
    assert result.returncode == 0, result.stderr
    golden = FIXTURES.parent / "golden" / "why-einsum-attend.txt"
    assert result.stdout.decode("utf-8") == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("stage", ["project", "scores", "attend", "w_o"])
async def test_the_apps_panel_explains_the_cell_under_the_cursor(stage: str) -> None:
    """`enter` on each product stage of the einsum module, then one step down and right: the
    panel explains that cell, ✓ equal to the module's own number (it said "holds no op")."""
    from mha_tui.app.explain import ExplainApp

    from .test_app import text_of

    trace = trace_of("einsum_attn.py:EinsumAttention")
    app = ExplainApp(trace.config, trace=trace, start=stage)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("enter", "down", "right")
        await pilot.pause()
        assert app.cursor == (0, 1, 1), stage
        shown = text_of(app, "#why-body")
    record = main_tensor(trace.stage(stage))
    index = (0, 0, 1, 1) if record.values.ndim == 4 else (0, 1, 1)
    assert f"why {record.name}[{', '.join(map(str, index))}]" in shown, shown
    assert "✓ equal" in shown and "holds no" not in shown, shown


@pytest.mark.parametrize("model", ["blueprint", "blueprint-einsum"])
def test_numpy_labels_carry_the_head_index(model: str) -> None:
    """NumPy's Q is (h, T, d_h): a label Q[2, 0] would read as head 2's token 0. Scores and
    attend of head 1 label each factor with the head: Q[1, 2, k], K[1, 0, k], w[1, 2, k],
    V[1, k, 0], and the numbers are Q's and V's at those indices; scores and attend equal
    Q·K and Σ w·V computed here in float64 from the transpose stage's Q, K, V."""
    from mha_tui.load.numpy_modules import load
    from mha_tui.pipeline import numpy_runner

    config = Config(SHORT, embed_dim=4, num_heads=2)
    trace = numpy_runner(load(config, Source(model=model)))(config)
    Q, K, V = (trace.stage("transpose").tensor(n).values.astype(np.float64) for n in "QKV")
    scores = why(trace, "scores", (1, 2, 0))
    assert [t.label for t in scores.terms[:-1]] == ["d0: Q[1, 2, 0] × K[1, 0, 0]",
                                                    "d1: Q[1, 2, 1] × K[1, 0, 1]"]
    assert [t.parts[0] for t in scores.terms[:-1]] == list(Q[1, 2])
    assert [t.parts[2] for t in scores.terms[:-1]] == list(K[1, 0])
    assert scores.computed == pytest.approx(float(Q[1, 2] @ K[1, 0]), rel=1e-6) and scores.agrees
    weights = main_tensor(trace.stage("softmax")).values.astype(np.float64)
    attend = why(trace, "attend", (1, 2, 0))
    assert "weights[1, 2, k]" in attend.formula
    assert [t.label for t in attend.terms[:-1]] == [
        f"key {w}: w[1, 2, {k}] × V[1, {k}, 0]" for k, w in enumerate(SHORT.split())]
    assert [t.parts[2] for t in attend.terms[:-1]] == list(V[1, :, 0])
    assert attend.computed == pytest.approx(float(weights[1, 2] @ V[1, :, 0]), rel=1e-6)
    assert attend.agrees




@pytest.mark.parametrize(("module", "stage", "stored", "dims"), [
    ("einsum_styles.py:HeadsFirstEinsum", "project", "(out, in)", ("C_out", "C_in")),
    ("einsum_styles.py:HeadsFirstEinsum", "w_o", "(out, in)", ("C_out", "C_in")),
    ("einsum_styles.py:InOutEinsum", "project", "(in, out)", ("C_in", "C_out")),
    ("einsum_styles.py:InOutEinsum", "w_o", "(in, out)", ("C_in", "C_out")),
])
def test_an_einsum_projection_shows_its_weight_as_the_subscripts_read_it(
        module: str, stage: str, stored: str, dims: tuple[str, str]) -> None:
    """"btc,oc->bto" reads W as (out, in), like nn.Linear; "bti,io->bto" as (in, out). The
    stage draws the weight that way, says so, and its product check is computed (the einsum
    redone from its recorded operands), where before it was never computed for an einsum and
    "btc,oc" was drawn as (in, out) with "columns feed one head"."""
    found = trace_of(module).stage(stage)
    weight = found.tensors[0]
    assert weight.dims == dims and f"stored as {stored}" in weight.caption
    assert f"stored as {stored}" in found.explanation
    product = next(c for c in found.checks if "(einsum, no bias)" in c.label)
    assert product.ok is True
    assert ("x @ W.T" in product.label) == (stored == "(out, in)")
