"""Why this number? mha_tui.why against an independent NumPy computation, for every kind."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.records import Trace
from mha_tui.why import KINDS, WhyError, main_tensor, parse_cell, why

from .conftest import ROOT, run_cli


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
    assert set(expected) == set(KINDS)
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
    """Masking before scaling, heads as modules: every explained cell equals the module's."""
    trace = trace_of(model)
    explained = 0
    for stage in trace.stages:
        record = main_tensor(stage)
        for index in itertools.product(*map(range, record.values.shape)):
            try:
                cell = why(trace, stage.id, index)
            except WhyError:
                assert stage.kind == "project"  # per-head projections: not explained yet
                break
            assert cell.agrees, (stage.id, index)
            explained += 1
    assert explained > 150


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


@pytest.mark.parametrize("cell", ["softmax[0, 1, 2, 1]", "scores[0, 1, 2, 1]"])
def test_why_from_the_command_line_is_the_golden_text(cell: str) -> None:
    """`explain --dump - --why CELL`: the text in tests/golden (make golden writes it)."""
    from pathlib import Path

    result = run_cli("explain", "I love AI !", "--dump", "-", "--why", cell)
    assert result.returncode == 0, result.stderr
    name = cell.split("[")[0]
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
