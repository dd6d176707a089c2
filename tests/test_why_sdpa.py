"""Why this number? on the five stages mha-tui expands one fused F.scaled_dot_product_attention
into (kinds/sdpa.py): every cell of scores, scale, mask, softmax and attend against PyTorch's
documented reference written out here in float64 torch (not mha-tui's code), for is_causal, a
bool and a float attn_mask, scale=, enable_gqa=True, dropout_p > 0 and the public fixtures as
their authors wrote them; the panel says the numbers are mha-tui's, and attend's is checked
against the fused op's own output."""

from __future__ import annotations

import itertools
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.records import OpRecord, Trace
from mha_tui.why import Why, main_tensor, why

from .conftest import ROOT, run_cli

FIXTURES = Path(ROOT) / "tests" / "fixtures"
EXPANSION = ("scores", "scale", "mask", "softmax", "attend")
BY = "mha-tui's expansion's"

# name -> (sentence, C, h, causal, module, init, how the fused op was called)
CASES: dict[str, tuple[str, int, int, bool, str, tuple, dict]] = {
    "is_causal": ("I love AI !", 4, 2, True, "nanogpt_attn.py:CausalSelfAttention", (),
                  {"causal": True}),
    "bool mask": ("I love AI !", 4, 2, True, "check_variants.py:SdpaMaskArgument", (),
                  {"mask": "tril"}),
    "float mask": ("I love AI !", 4, 2, True, "sdpa_variants.py:FloatMask", (),
                   {"mask": "distance"}),
    "scale=": ("I love AI !", 4, 2, True, "sdpa_variants.py:ExplicitScale", (),
               {"causal": True, "scale": 0.25}),
    "enable_gqa": ("the cat sat on the mat", 16, 4, True, "mechanisms/gqa_sdpa.py:GQAAttention",
                   (), {"causal": True, "gqa": True}),
    "dropout_p": ("I love AI !", 4, 2, True, "sdpa_variants.py:FusedDropout", (),
                  {"causal": True}),
    "nanogpt public": ("I love AI !", 8, 2, True, "public/nanogpt.py:FlashAttention", (),
                       {"causal": True}),
    "timm public": ("I love AI !", 8, 2, False, "public/timm_attention.py:FusedAttention",
                    (("dim", 8),), {}),
    "inverted bool mask": ("I love AI !", 4, 2, True, "unsound/sdpa_inverted.py:MultiHeadAttention",
                           (), {"mask": "triu"}),
    # nn.MultiheadAttention(need_weights=False) calls the fused op, its bool mask made float
    "nn.MultiheadAttention": ("I love AI !", 4, 2, True, "sdpa_variants.py:TorchMHANoWeights", (),
                              {"mask": "future"}),
}


@cache
def trace_of(case: str) -> Trace:
    sentence, C, h, causal, module, init, _ = CASES[case]
    return run_trace(Config(sentence, embed_dim=C, num_heads=h, causal=causal),
                     Source(module=str(FIXTURES / module), init=init))


def fused_op(trace: Trace) -> OpRecord:
    return next(op for s in trace.stages for op in s.ops
                if op.name == "scaled_dot_product_attention")


def qkv(trace: Trace) -> tuple[torch.Tensor, ...]:
    """The q, k, v the module gave the fused op, as recorded."""
    assert trace.recording is not None
    op = fused_op(trace)
    return tuple(torch.from_numpy(np.array(trace.recording.snapshot(op.inputs[n]).values))
                 for n in range(3))


def the_mask(how: str, L: int) -> torch.Tensor:
    """The attn_mask each fixture builds, written out here from its source."""
    position = torch.arange(L)
    if how == "tril":
        return torch.ones(L, L, dtype=torch.bool).tril()
    if how == "triu":
        return torch.ones(L, L, dtype=torch.bool).triu(1)
    if how == "future":  # nn.MultiheadAttention's True (may not attend) as -inf
        return torch.zeros(L, L, dtype=torch.float64).masked_fill(
            torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    distance = (position[:, None] - position[None, :]).double()
    return (-0.5 * distance).masked_fill(distance < 0, float("-inf"))


def reference(case: str) -> dict[str, np.ndarray]:
    """PyTorch's documented reference of F.scaled_dot_product_attention, step by step, in
    float64, from the recorded q, k, v."""
    how = CASES[case][-1]
    q, k, v = (t.double() for t in qkv(trace_of(case)))
    if how.get("gqa"):
        n = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(n, dim=-3), v.repeat_interleave(n, dim=-3)
    L, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1)
    scaled = scores * how.get("scale", 1 / math.sqrt(q.shape[-1]))
    bias = torch.zeros(L, S, dtype=torch.float64)
    if how.get("causal"):
        bias = bias.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if "mask" in how:
        mask = the_mask(how["mask"], L)
        bias = bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
    masked = scaled + bias
    weights = torch.softmax(masked, dim=-1)
    return {"scores": scores.numpy(), "scale": scaled.numpy(), "mask": masked.numpy(),
            "softmax": weights.numpy(), "attend": (weights @ v).numpy()}


def torch_fused(case: str) -> np.ndarray:
    """torch's own fused op on the recorded q, k, v, called the way the fixture calls it."""
    how = CASES[case][-1]
    q, k, v = qkv(trace_of(case))
    mask = the_mask(how["mask"], q.shape[-2]) if "mask" in how else None
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          is_causal=bool(how.get("causal")),
                                          scale=how.get("scale"),
                                          enable_gqa=bool(how.get("gqa"))).numpy()


def same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return a == pytest.approx(b, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("case", list(CASES))
def test_every_cell_of_the_expansion_matches_pytorchs_reference(case: str) -> None:
    """Every cell of every expanded stage: mha-tui's computation equals the reference computed
    here, equals the expansion's own number (✓), and is said to be mha-tui's; attend's also
    stands beside the fused op's output, which is torch's fused op on the same q, k, v."""
    trace = trace_of(case)
    expected = reference(case)
    fused = torch_fused(case)
    stages = [s for s in trace.stages if s.kind in EXPANSION and fused_op(trace) in s.ops]
    kinds = [s.kind for s in stages]
    assert kinds == [k for k in EXPANSION if k != "mask" or "mask" in kinds]
    assert ("mask" in kinds) == (case != "timm public")
    explained = 0
    for stage in stages:
        record = main_tensor(stage)
        want = np.broadcast_to(expected[stage.kind], record.values.shape)
        for index in itertools.product(*map(range, record.values.shape)):
            cell = why(trace, stage.id, index)
            assert same(cell.computed, float(want[index])), (stage.id, index, cell.computed)
            assert cell.agrees, (stage.id, index)
            assert cell.recorded_by == BY and any("not by the module" in n for n in cell.notes)
            if stage.kind == "attend":
                assert cell.witness is not None
                if case != "dropout_p":  # which weights it dropped is not recorded
                    assert same(cell.witness.value, float(fused[index])), index
                    assert cell.compared(cell.witness.value)[1] or case == "inverted bool mask"
            else:
                assert cell.witness is None
            explained += 1
    assert explained == sum(main_tensor(s).values.size for s in stages)


def cell(case: str, stage: str, *index: int) -> Why:
    return why(trace_of(case), stage, index)


def test_scores_are_the_d_h_products_of_q_and_k() -> None:
    """First and last row, last head: the products of q's row and k's row, as recorded."""
    q, k, _ = (t.double().numpy() for t in qkv(trace_of("is_causal")))
    for i, j in [(0, 0), (3, 3), (3, 0), (0, 3)]:
        w = cell("is_causal", "scores", 0, 1, i, j)
        products = [t.value for t in w.terms if t.label.startswith("d")]
        assert products == pytest.approx(list(q[0, 1, i] * k[0, 1, j]), rel=1e-6)
        assert w.formula.startswith(f"q @ k.transpose(-2, -1)[0, 1, {i}, {j}] = q[0, 1, {i}, :] "
                                    f"· k[0, 1, {j}, :]")
    assert "the inputs the module gave F.scaled_dot_product_attention (recorded)" in w.basis


def test_enable_gqa_says_which_kv_head_a_query_head_reads() -> None:
    """h = 4 query heads, h_kv = 2: query head 3 reads K/V head 1; head 0 reads head 0."""
    q, k, v = (t.double().numpy() for t in qkv(trace_of("enable_gqa")))
    assert k.shape[1] == 2
    for head, kv in [(0, 0), (1, 0), (2, 1), (3, 1)]:
        w = cell("enable_gqa", "scores", 0, head, 5, 2)
        assert f"k[0, {kv}, 2, :]" in w.formula
        assert w.computed == pytest.approx(float(q[0, head, 5] @ k[0, kv, 2]), rel=1e-6)
        assert f"query head {head} reads K/V head {head} // 2 = {kv}" in " ".join(w.notes)
        context = cell("enable_gqa", "attend", 0, head, 5, 3)
        assert f"v[0, {kv}, k, 3]" in context.formula
        assert context.computed == pytest.approx(
            float(reference("enable_gqa")["softmax"][0, head, 5] @ v[0, kv, :, 3]), rel=1e-6)
        assert f"query head {head} reads K/V head {head} // 2 = {kv}" in " ".join(context.notes)


def test_scale_says_where_its_factor_came_from() -> None:
    default = cell("is_causal", "scale", 0, 1, 2, 1)
    assert any("no scale= was passed" in n and "E = q.size(-1) = 2" in n for n in default.notes)
    assert default.terms[-1].parts == pytest.approx((default.terms[0].value, "×", 1 / math.sqrt(2)))
    given = cell("scale=", "scale", 0, 1, 3, 0)
    assert any("scale=0.25 was passed" in n for n in given.notes)
    assert any("this factor is not 1/√d_h (0.707107)" in n for n in given.notes)
    assert given.terms[-1].parts[-1] == 0.25
    assert "the expansion's scores stage (computed by mha-tui)" in given.basis


@pytest.mark.parametrize(("case", "index", "blocked", "fact"), [
    ("is_causal", (0, 1, 1, 2), True, "is_causal=True: key 2 > query 1, so -inf"),
    ("is_causal", (0, 1, 2, 1), False, "is_causal=True: key 1 <= query 2, so 0"),
    ("is_causal", (0, 1, 3, 3), False, "is_causal=True: key 3 <= query 3, so 0"),
    ("bool mask", (0, 0, 0, 3), True, "attn_mask[0, 3] = False (a bool mask: True means may "
                                      "attend), so -inf"),
    ("bool mask", (0, 1, 3, 0), False, "attn_mask[3, 0] = True"),
    ("float mask", (0, 1, 3, 0), False, "attn_mask[3, 0], a float mask, added as it is"),
    ("float mask", (0, 0, 1, 2), True, "attn_mask[1, 2], a float mask"),
    ("inverted bool mask", (0, 1, 2, 1), True, "attn_mask[2, 1] = False"),
])
def test_mask_says_why_a_cell_is_kept_or_blocked(case: str, index: tuple[int, ...],
                                                 blocked: bool, fact: str) -> None:
    w = cell(case, "mask", *index)
    assert w.formula.endswith("blocked" if blocked else "kept")
    assert any(fact in t.label for t in w.terms), [t.label for t in w.terms]
    assert math.isinf(w.computed) == blocked
    i, j = index[-2:]
    if case == "float mask" and not blocked:
        added = next(t.value for t in w.terms if "float mask" in t.label)
        assert added == -0.5 * (i - j)
        assert w.computed == pytest.approx(w.terms[0].value + added, rel=1e-6)
    reason = w.notes[0]
    assert ("j > i" in reason) if blocked and j > i else True
    if case == "inverted bool mask":  # the masked_fill convention given to sdpa: not causal
        assert "blocked although j <= i" in reason


def test_softmax_is_exp_over_the_row_sum_of_the_masked_scores() -> None:
    """First row: one key left, weight 1; last row: exp(s - max) / Σ over the row."""
    weights = reference("is_causal")["softmax"]
    first = cell("is_causal", "softmax", 0, 1, 0, 0)
    assert first.computed == 1.0 and first.terms[-1].parts == (1.0, "/", 1.0)
    last = cell("is_causal", "softmax", 0, 1, 3, 1)
    assert last.computed == pytest.approx(float(weights[0, 1, 3, 1]), rel=1e-6)
    assert "the expansion's mask stage (computed by mha-tui)" in last.basis
    assert cell("is_causal", "softmax", 0, 0, 0, 3).computed == 0.0  # blocked: no weight
    assert "the expansion's scale stage" in cell("timm public", "softmax", 0, 1, 3, 3).basis


def test_attend_is_checked_against_the_fused_output() -> None:
    w = cell("is_causal", "attend", 0, 1, 2, 1)
    assert w.witness is not None and w.witness.label.startswith("y[0, 1, 2, 1] (what "
                                                                "F.scaled_dot_product_attention")
    assert w.witness.value == float(fused_op(trace_of("is_causal")).out.values[0, 1, 2, 1])
    assert w.compared(w.witness.value)[1] and not w.witness.caveat


def test_dropout_inside_the_fused_op_is_said_not_recorded() -> None:
    """dropout_p=0.5: the expansion leaves dropout out, says so, and the fused output
    differs from it at some cells (✗ there)."""
    trace = trace_of("dropout_p")
    record = main_tensor(trace.stage("attend"))
    cells = [why(trace, "attend", index)
             for index in itertools.product(*map(range, record.values.shape))]
    assert all(c.agrees for c in cells)
    assert any(not c.compared(c.witness.value)[1] for c in cells if c.witness is not None)
    assert all("dropout_p=0.5" in c.witness.caveat and "not recorded" in c.witness.caveat
               for c in cells if c.witness is not None)
    assert any("before dropout" in n for n in cell("dropout_p", "softmax", 0, 0, 3, 1).notes)


def test_a_row_with_no_key_left_is_nan_and_the_fused_op_says_0() -> None:
    """The inverted bool mask blocks every key of the last query: NaN in the expansion,
    0 from torch's fused op, and the panel says why they differ."""
    weight = cell("inverted bool mask", "softmax", 0, 0, 3, 1)
    assert math.isnan(weight.computed) and weight.agrees
    assert "every key of this row is blocked" in weight.notes[0]
    context = cell("inverted bool mask", "attend", 0, 0, 3, 1)
    assert context.witness is not None and context.witness.value == 0.0
    assert not context.compared(context.witness.value)[1]
    assert "torch's fused op returns 0" in context.witness.caveat


def test_the_panel_says_whose_numbers_they_are() -> None:
    """The drawn panel: mha-tui's expansion's number, never "the module's own", except the
    fused output at attend."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import why_text

    for stage in EXPANSION:
        text = why_text(cell("is_causal", stage, 0, 1, 2, 1), RenderOptions(), width=200)
        assert f"{BY} " in text and "not by the module" in text
        assert ("the module's own y[0, 1, 2, 1]" in text) == (stage == "attend")
    ascii_text = why_text(cell("dropout_p", "attend", 0, 1, 3, 0), RenderOptions(ascii=True),
                          width=200)
    assert "[FAIL] differs" in ascii_text and ascii_text.isascii()


@pytest.mark.parametrize(("cell_text", "args", "name"), [
    ("softmax[0, 1, 2, 1]", ("I love AI !", "--module",
                             "tests/fixtures/nanogpt_attn.py:CausalSelfAttention"), "softmax"),
    ("attend[0, 3, 5, 2]", ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
                            "tests/fixtures/mechanisms/gqa_sdpa.py:GQAAttention"), "attend-gqa"),
    ("mask[0, 1, 3, 0]", ("I love AI !", "--module",
                          "tests/fixtures/sdpa_variants.py:FloatMask"), "mask-float"),
])
def test_why_on_the_expansion_from_the_command_line_is_the_golden_text(
        cell_text: str, args: tuple[str, ...], name: str) -> None:
    """`explain --dump - --why CELL` on an expanded stage: tests/golden (make golden)."""
    result = run_cli("explain", *args, "--dump", "-", "--why", cell_text)
    assert result.returncode == 0, result.stderr
    golden = Path(ROOT) / "tests" / "golden" / f"why-sdpa-{name}.txt"
    assert result.stdout.decode("utf-8") == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", ["is_causal", "enable_gqa", "scale=", "timm public"])
def test_the_quiz_on_the_expansion_answers_from_its_numbers_and_says_they_are_mha_tuis(
        case: str) -> None:
    """--quiz asks about the expanded stages too: each answer equals the reference computed
    here, is marked right when typed as shown, and its source says the numbers are mha-tui's
    expansion, never the module's own or recorded."""
    from mha_tui.kinds._parts.quizzing import mark
    from mha_tui.quiz import questions

    trace = trace_of(case)
    expected = reference(case)
    expanded = {s.id for s in trace.stages if fused_op(trace) in s.ops}
    asked = [q for q in questions(trace) if q.stage in expanded]
    assert {q.stage for q in asked} == expanded
    assert ("kv_head" in {q.asks for q in asked}) == (case == "enable_gqa")
    for q in asked:
        if q.asks == "kv_head":  # from the recorded shapes of q and k, not the expansion
            assert q.stage == "scores" and q.expected == 3 // 2 and "j // 2" in q.source
            assert mark(q, "1", trace.config.tokens).outcome == "right"
            continue
        assert "mha-tui's expansion" in q.source, q
        assert "the module's own" not in q.source and "recorded at" not in q.source, q
        assert "both recorded" not in q.source and "the recorded" not in q.source, q
        typed = str(q.expected[0]) if q.answer == "token" else q.shown  # type: ignore[index]
        assert mark(q, typed, trace.config.tokens).outcome == "right", q
        if q.asks == "value":  # head 1's last query against the first key
            assert q.expected == pytest.approx(float(expected["scores"][0, 1, -1, 0]), rel=1e-5)
        if q.asks == "divisor":
            factor = CASES[case][-1].get("scale", 1 / math.sqrt(trace.config.head_dim))
            assert q.expected == pytest.approx(1 / factor, rel=1e-4)
        if q.asks == "blocked":
            assert q.expected == int(np.isneginf(expected["mask"][0, 0]).sum())
        if q.asks == "row_sum":
            assert q.expected == pytest.approx(1.0, abs=1e-6)
        if q.asks == "most_attended":
            row = expected["softmax"][0, 1, -1]
            assert q.expected == tuple(np.flatnonzero(np.isclose(row, row.max(), rtol=1e-6)))
        if q.asks == "shape":
            assert q.expected == expected["attend"].shape


def unboxed(panel: str) -> str:
    """The panel's text without its box, its lines joined by one space."""
    return " ".join(" ".join(line.strip(" │╭╮╰╯─").split()) for line in panel.splitlines())


@pytest.mark.parametrize("size", [(100, 32), (80, 24)])
async def test_enter_on_the_expansions_softmax_shows_the_why_panel(size: tuple[int, int]) -> None:
    """In the app, `enter` on the expanded softmax stage puts the cursor on its weights, and
    the panel shows the computation, says the numbers are mha-tui's expansion and marks it ✓;
    on attend, the fused op's own output is the second ✓."""
    from mha_tui.app.explain import ExplainApp

    from .test_app import why_panel

    trace = trace_of("is_causal")
    app = ExplainApp(trace.config, trace=trace, start="softmax")
    async with app.run_test(size=size) as pilot:
        await pilot.press("enter", "down", "down", "right")
        await pilot.pause()
        assert app.cursor == (0, 2, 1)
        shown = unboxed(why_panel(app))
        assert "why attn_weight[0, 0, 2, 1]" in shown, shown
        assert "exp(s[2, 1] - max)" in shown and "Σ over the row" in shown
        assert f"{BY} attn_weight[0, 0, 2, 1]" in shown and "not by the module" in shown
        assert "✓ equal" in shown and "holds no op" not in shown
        await pilot.press("escape", "right")  # the next stage: attend
        await pilot.pause()
        await pilot.press("enter", "tab", "down")
        await pilot.pause()
        assert app.cursor == (1, 1, 0)
        flat = unboxed(why_panel(app))
        assert f"{BY} attn_weight @ v[0, 1, 1, 0]" in flat, flat
        assert "the module's own y[0, 1, 1, 0]" in flat and flat.count("✓ equal") == 2, flat


@pytest.mark.parametrize("case", ["dropout_p", "inverted bool mask", "is_causal"])
def test_concat_after_the_fused_op_reads_its_output_not_the_expansion(case: str) -> None:
    """concat joins what the fused op returned: where the expansion differs from it (dropout
    inside the op, a row with no key), concat's cells still equal the module's (✓), and each
    is the fused output at its head and channel."""
    trace = trace_of(case)
    fused = fused_op(trace).out.values
    record = main_tensor(trace.stage("concat"))
    d_h = fused.shape[-1]
    for index in itertools.product(*map(range, record.values.shape)):
        w = why(trace, "concat", index)
        _, t, c = index
        assert w.agrees and w.computed == float(fused[0, c // d_h, t, c % d_h]), index
        assert any("not from mha-tui's expansion" in n for n in w.notes)


@pytest.mark.parametrize("case", ["is_causal", "nanogpt public", "enable_gqa"])
def test_a_projection_split_from_one_fused_layer_is_its_block_of_channels(case: str) -> None:
    """q, k, v = c_attn(x).split(...): the project stage's v is the last block of the fused
    layer's output; each cell is x · W[first + c] (+ bias), computed here from the stage's
    recorded weight and the embedding's x."""
    trace = trace_of(case)
    project = trace.stage("project")
    x = trace.stage("embed").tensor("x").values.astype(np.float64)
    weight = next(r for r in project.tensors if r.dims == ("C_out", "C_in")).values
    bias = next((r.values for r in project.tensors if r.dims == ("C",)), None)
    record = main_tensor(project)
    width = record.values.shape[-1]
    first = weight.shape[0] - width  # v: the last block
    expected = x @ weight[first:].astype(np.float64).T + (0 if bias is None else bias[first:])
    for index in itertools.product(*map(range, record.values.shape)):
        w = why(trace, "project", index)
        assert w.agrees and w.computed == pytest.approx(float(expected[index]), rel=1e-5,
                                                        abs=1e-6), index
    notes = why(trace, "project", (0, 1, width - 1)).notes
    assert any(n.startswith(f"{record.name} is channels {first}-{weight.shape[0] - 1} of one "
                            f"fused layer's output") for n in notes), notes


async def test_the_quiz_in_the_app_walks_the_expansion_and_then_its_why_works() -> None:
    """--quiz in the app on a module whose attention is one fused op: each expanded stage is
    hidden until its question is answered, a right answer marks ✓ and reveals it, a wrong one
    gives the answer and says it is mha-tui's expansion; once revealed, enter drills in."""
    from textual.widgets import Input

    from mha_tui.app.explain import ExplainApp

    from .test_app import text_of, why_panel

    trace = trace_of("is_causal")
    app = ExplainApp(trace.config, trace=trace, quiz=True)
    expanded = [s.id for s in trace.stages if fused_op(trace) in s.ops]
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        wrong_once, seen = False, set()
        while app.quiz.current is not None:
            question = app.quiz.current
            if question.stage in expanded:
                seen.add(question.stage)
                assert app.stage_ids[app.stage_index] == question.stage
                assert "Its numbers stay hidden" in text_of(app)
            typed = (str(question.expected[0]) if question.answer == "token"  # type: ignore[index]
                     else question.shown)
            if question.stage == "scores" and not wrong_once:
                typed, wrong_once = "123", True
            line = app.query_one("#quiz-answer", Input)
            line.value = typed
            line.focus()
            await pilot.press("enter")
            await pilot.pause()
            mark = " ".join(text_of(app, "#quiz-mark").split())
            if typed == "123":
                assert "✗" in mark and "mha-tui's expansion's" in mark, mark
            else:
                assert "✓" in mark, mark
            if app.quiz.current is not None and app.quiz.current.stage != question.stage:
                await pilot.press("escape")
                await pilot.pause()
                app.stage_index = app.stage_ids.index(app.quiz.current.stage)
                await pilot.pause()
        assert app.quiz.current is None and seen == set(expanded) and wrong_once
        app.stage_index = app.stage_ids.index("softmax")
        await pilot.pause()
        await pilot.press("escape", "enter")
        await pilot.pause()
        assert app.cursor is not None and "mha-tui's expansion's" in unboxed(why_panel(app))


def test_an_unexpected_layout_is_one_line_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind's why that meets a layout it did not expect (here: made to raise IndexError)
    gives a WhyError, which the CLI prints as one line and the app's panel shows."""
    from mha_tui.kinds import softmax
    from mha_tui.why import KINDS, WhyError

    def broken(cell: object) -> Why:
        raise IndexError("index 2 is out of bounds for axis 1 with size 2")

    monkeypatch.setitem(KINDS, "softmax", broken)
    assert softmax.why is not broken
    with pytest.raises(WhyError, match=r"cannot explain weights\[0, 1, 2, 1\] of stage softmax "
                                       r"yet \(IndexError: index 2 is out of bounds"):
        why(run_trace(Config("I love AI !"), Source()), "softmax", (0, 1, 2, 1))
