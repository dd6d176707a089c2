"""Why this number, for the stages no rule places (`op`) and where the forward raised
(`error`): every op family against an independent computation written here with torch
(float64, from the module's own input), never with mha-tui's code."""

from __future__ import annotations

import contextlib
import io
import itertools
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mha_tui
from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace, trace_numpy
from mha_tui.records import OpRecord, Stage, TensorRecord, Trace
from mha_tui.why import KINDS, Why, WhyError, main_tensor, why

from .conftest import ROOT, run_cli

FIXTURES = Path(ROOT) / "tests" / "fixtures"


class Everything(nn.Module):
    """One op of each family on x (1, 4, 12), its results kept by name."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(12, 5)
        self.results: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.results
        first = x[:, :1, :]
        r["add"] = x + first  # broadcast along T
        r["sub"] = torch.sub(x, first, alpha=2.0)
        r["mul"] = x * 3.0
        r["div"] = x / (first.abs() + 1)
        r["neg"] = -x
        r["pow"] = x ** 2
        r["exp"] = torch.exp(x)
        r["log"] = torch.log(x.abs() + 1)
        r["sqrt"] = torch.sqrt(x.abs())
        r["rsqrt"] = torch.rsqrt(x.abs() + 1)
        r["tanh"] = torch.tanh(x)
        r["sigmoid"] = torch.sigmoid(x)
        r["relu"] = F.relu(x)
        r["gelu"] = F.gelu(x)
        r["gelu_tanh"] = F.gelu(x, approximate="tanh")
        r["silu"] = F.silu(x)
        cond = x > 0
        r["where"] = torch.where(cond, x, first)
        r["masked_fill"] = x.masked_fill(cond, float("-inf"))
        r["clamp"] = torch.clamp(x, min=-0.5, max=0.5)
        r["rsub"] = 1 - x
        r["matmul"] = x @ x[0].transpose(-2, -1)  # (1, 4, 4): broadcast batch, a sum of 12
        r["bmm"] = torch.bmm(x, x.transpose(1, 2))
        r["linear"] = self.lin(x)
        r["einsum"] = torch.einsum("btc,bsc->bts", x, x)
        r["addmm"] = torch.addmm(x[0, 0, :4], x[0], x[0].transpose(0, 1), beta=0.5, alpha=2.0)
        heads = x.view(1, 4, 3, 4)
        r["view"] = heads
        r["reshape"] = x.reshape(4, 12)
        r["permute"] = heads.permute(0, 2, 1, 3)
        r["transpose"] = heads.transpose(-2, -1)
        r["contiguous"] = r["transpose"].contiguous()
        r["flatten"] = heads.flatten(2)
        r["unsqueeze"] = x.unsqueeze(1)
        r["squeeze"] = r["unsqueeze"].squeeze(1)
        r["expand"] = first.expand(1, 4, 12)
        r["cat"] = torch.cat((x, first), dim=1)
        r["stack"] = torch.stack((x, -x), dim=1)
        r["split"] = x.split(5, dim=-1)[1]
        r["chunk"] = x.chunk(3, dim=-1)[2]
        r["getitem"] = x[0, 1:3, ::2]
        r["narrow"] = x.narrow(2, 3, 4)
        r["select"] = x.select(1, 2)
        r["sum"] = x.sum(dim=-1)
        r["mean"] = x.mean(dim=1, keepdim=True)
        r["amax"] = x.amax(dim=-1)
        r["max"] = torch.max(x, dim=1).values
        r["argmax"] = x.argmax(dim=-1)
        r["softmax"] = F.softmax(x, dim=-1)
        r["log_softmax"] = F.log_softmax(x, dim=1)
        r["var"] = x.var(dim=-1)
        r["norm"] = x.norm(dim=-1)
        r["cumprod"] = torch.cumprod(x, dim=1)  # not one mha-tui knows
        return x


def _expected(x: torch.Tensor, lin: nn.Linear) -> dict[str, torch.Tensor]:
    """The same results, computed here in float64 (formulas written out where they are short)."""
    x = x.double()
    first = x[:, :1, :]
    w, b = lin.weight.detach().double(), lin.bias.detach().double()
    cond = x > 0
    heads = x.reshape(1, 4, 3, 4)
    return {
        "add": x + first, "sub": x - 2 * first, "mul": 3 * x, "div": x / (first.abs() + 1),
        "neg": -x, "pow": x * x, "exp": x.exp(), "log": (x.abs() + 1).log(),
        "sqrt": x.abs().sqrt(), "rsqrt": 1 / (x.abs() + 1).sqrt(), "tanh": x.tanh(),
        "sigmoid": 1 / (1 + (-x).exp()), "relu": torch.where(x > 0, x, 0.0),
        "gelu": x / 2 * (1 + torch.erf(x / 2 ** 0.5)),
        "gelu_tanh": x / 2 * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x ** 3))),
        "silu": x / (1 + (-x).exp()), "where": torch.where(cond, x, first.expand_as(x)),
        "masked_fill": torch.where(cond, float("-inf"), x), "clamp": x.clamp(-0.5, 0.5),
        "rsub": 1 - x, "matmul": torch.einsum("btc,sc->bts", x, x[0]),
        "bmm": torch.einsum("btc,bsc->bts", x, x), "linear": torch.einsum("btc,oc->bto", x, w) + b,
        "einsum": torch.einsum("btc,bsc->bts", x, x),
        "addmm": 0.5 * x[0, 0, :4] + 2.0 * torch.einsum("tc,sc->ts", x[0], x[0]),
        "view": heads, "reshape": x.reshape(4, 12), "permute": heads.permute(0, 2, 1, 3),
        "transpose": heads.permute(0, 1, 3, 2), "contiguous": heads.permute(0, 1, 3, 2),
        "flatten": x, "unsqueeze": x[:, None], "squeeze": x, "expand": first.repeat(1, 4, 1),
        "cat": torch.cat((x, first), dim=1), "stack": torch.stack((x, -x), dim=1),
        "split": x[..., 5:10], "chunk": x[..., 8:12], "getitem": x[0, 1:3, ::2],
        "narrow": x[..., 3:7], "select": x[:, 2], "sum": x.sum(-1), "mean": x.mean(1, keepdim=True),
        "amax": x.max(-1).values, "max": x.max(1).values, "argmax": x.argmax(-1).double(),
        "softmax": x.softmax(-1), "log_softmax": x.log_softmax(1),
        "var": ((x - x.mean(-1, keepdim=True)) ** 2).sum(-1) / 11, "norm": (x * x).sum(-1).sqrt(),
    }


@cache
def everything() -> tuple[Trace, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(3)
    module = Everything().eval()
    x = torch.randn(1, 4, 12)
    trace = mha_tui.trace(module, x, ["a", "b", "c", "d"])
    return trace, dict(module.results), _expected(x, module.lin)


def as_op_stage(trace: Trace, op: OpRecord, out: int = 0) -> tuple[Trace, str]:
    """The op as an `op` stage of its own (as kinds/op.py builds one), added to the trace."""
    snap = op.outputs[out]
    record = TensorRecord(name=f"{op.name}_out", dims=tuple(f"d{k}" for k in range(snap.ndim)),
                          values=snap.values, strides=snap.strides, contiguous=snap.contiguous)
    stage = Stage(id=f"op-{op.index}x", title=op.name, code=op.source.text, explanation="",
                  shape_in=(), shape_out=snap.shape, dims_in=(), dims_out=record.dims,
                  tensors=(record,), kind="op", ops=(op,))
    return replace(trace, stages=(*trace.stages, stage)), stage.id


def op_making(trace: Trace, name: str, result: torch.Tensor) -> tuple[OpRecord, int]:
    """The last recorded op called `name` with an output equal to `result`."""
    assert trace.recording is not None
    wanted = result.detach().numpy()
    for op in reversed(trace.recording.ops):
        for k, snap in enumerate(op.outputs):
            if op.name == name and snap.shape == wanted.shape and \
                    np.array_equal(snap.values, wanted, equal_nan=True):
                return op, k
    raise AssertionError(f"no {name} op made that tensor")


def every_cell(trace: Trace, stage_id: str) -> list[Why]:
    record = main_tensor(trace.stage(stage_id))
    return [why(trace, stage_id, index)
            for index in itertools.product(*map(range, record.values.shape))]


def _agree(cell: Why, want: float) -> None:
    if np.isinf(want) or np.isnan(want):
        assert cell.computed == want or (np.isnan(want) and np.isnan(cell.computed)), cell
    else:
        # mha-tui reads the recorded float32 inputs (x.abs() + 1 as the module rounded it)
        assert cell.computed == pytest.approx(want, rel=1e-6, abs=1e-7), (cell.formula, want)
    assert cell.recomputed and cell.agrees, (cell.formula, cell.computed, cell.recorded)


FAMILIES = ["add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "rsqrt", "tanh",
            "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "where", "masked_fill", "clamp",
            "rsub", "matmul", "bmm", "linear", "einsum", "addmm", "view", "reshape", "permute",
            "transpose", "contiguous", "flatten", "unsqueeze", "squeeze", "expand", "cat",
            "stack", "split", "chunk", "getitem", "narrow", "select", "sum", "mean", "amax",
            "max", "argmax", "softmax", "log_softmax", "var", "norm"]
OP_NAMES = {"gelu_tanh": "gelu", "rsub": "rsub", "flatten": "flatten", "max": "max",
            "where": "where", "split": "split", "chunk": "chunk", "relu": "relu"}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_cell_of_an_op_matches_an_independent_torch_computation(family: str) -> None:
    trace, results, expected = everything()
    name = OP_NAMES.get(family, family)
    op, out = op_making(trace, name if family != "max" else "max", results[family])
    traced, stage_id = as_op_stage(trace, op, out)
    want = expected[family].detach().numpy()
    for cell in every_cell(traced, stage_id):
        _agree(cell, float(want[cell.index]))


def test_broadcasting_names_the_input_cell_each_operand_is_read_at() -> None:
    """x + x[:, :1, :]: the second operand has one row, read at row 0 for every token."""
    trace, results, _ = everything()
    traced, stage_id = as_op_stage(trace, *op_making(trace, "add", results["add"]))
    cell = why(traced, stage_id, (0, 3, 7))
    labels = [t.label for t in cell.terms]
    assert labels[0] == "a = x[0, 3, 7]" and labels[1].endswith("[0, 0, 7]"), labels
    assert any("shape (1, 1, 12): broadcast to (1, 4, 12), this cell reads it at [0, 0, 7]"
               in note for note in cell.notes), cell.notes
    assert cell.terms[-1].parts[1] == "+"


def test_a_negative_dim_transpose_reads_the_swapped_index() -> None:
    trace, results, _ = everything()
    traced, stage_id = as_op_stage(trace, *op_making(trace, "transpose", results["transpose"]))
    cell = why(traced, stage_id, (0, 2, 3, 1))  # transpose(-2, -1): [0, 2, 1, 3] of the input
    assert cell.formula.endswith("[0, 2, 1, 3]"), cell.formula
    assert "copied from" in cell.notes[0]


def test_a_cat_along_dim_1_says_which_input_the_cell_comes_from() -> None:
    trace, results, _ = everything()
    traced, stage_id = as_op_stage(trace, *op_making(trace, "cat", results["cat"]))
    assert why(traced, stage_id, (0, 2, 5)).formula.endswith("= x[0, 2, 5]")
    last = why(traced, stage_id, (0, 4, 5))  # row 4: the appended first row
    assert last.formula.endswith("[0, 0, 5]") and "x[0, 4" not in last.formula, last.formula
    assert "joined along dim 1: positions 0 to 3 are x; position 2 is its 2" in \
        why(traced, stage_id, (0, 2, 5)).notes
    assert any(n.startswith("joined along dim 1: positions 4 to 4 are ") for n in last.notes)


def test_long_sums_show_the_largest_products_and_the_rest_summed() -> None:
    trace, results, expected = everything()
    op, _ = op_making(trace, "linear", results["linear"])
    traced, stage_id = as_op_stage(trace, op)
    cell = why(traced, stage_id, (0, 1, 2))
    assert any("12 products: the 6 largest in size are shown" in n for n in cell.notes)
    assert [t.label for t in cell.terms][-3:-1] == ["the other 6 products", "+ lin.bias[2]"]
    x = trace.recording.inputs[0][1].values.astype(np.float64)[0, 1]
    weight = trace.recording.snapshot(op.inputs[1]).values.astype(np.float64)[2]
    products = x * weight
    shown = [t.value for t in cell.terms[:6]]
    assert sorted(abs(v) for v in shown) == pytest.approx(sorted(abs(products))[-6:])
    assert cell.terms[6].value == pytest.approx(products.sum() - sum(shown), rel=1e-9)
    assert cell.computed == pytest.approx(float(expected["linear"][0, 1, 2]), rel=1e-9)


def test_max_over_a_dim_gives_its_values_and_its_indices() -> None:
    """torch.max(x, dim=1) returns (values, indices): the second output is where the max is."""
    trace, results, _ = everything()
    op, _ = op_making(trace, "max", results["max"])
    traced, stage_id = as_op_stage(trace, op, 1)
    x = trace.recording.inputs[0][1].values
    for cell in every_cell(traced, stage_id):
        assert cell.computed == float(np.argmax(x[0, :, cell.index[1]])) and cell.agrees


def test_an_unknown_op_says_so_and_computes_nothing() -> None:
    trace, results, _ = everything()
    traced, stage_id = as_op_stage(trace, *op_making(trace, "cumprod", results["cumprod"]))
    cell = why(traced, stage_id, (0, 3, 11))
    assert not cell.recomputed and not cell.agrees
    assert cell.notes[0] == ("mha-tui does not recompute torch.cumprod: this number is the "
                             "module's own, read from the recording")
    assert cell.terms[0].label == "input 0: x, shape (1, 4, 12)" and cell.terms[0].value is None
    assert cell.recorded == float(results["cumprod"][0, 3, 11])
    text = rendered(cell)
    assert "not recomputed: mha-tui does not know this op" in text and "✓" not in text


def rendered(cell: Why, **options: object) -> str:
    from rich.console import Console

    from mha_tui.render.options import RenderOptions
    from mha_tui.render.why import why_view

    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(why_view(cell, RenderOptions(**options)))  # type: ignore[arg-type]
    return console.file.getvalue()


def test_a_tampered_number_is_marked_with_the_difference() -> None:
    trace, results, _ = everything()
    traced, stage_id = as_op_stage(trace, *op_making(trace, "tanh", results["tanh"]))
    stage = traced.stage(stage_id)
    values = stage.tensors[0].values.copy()
    values[0, 2, 3] += 0.25
    tampered = replace(traced, stages=(*traced.stages[:-1], replace(
        stage, tensors=(replace(stage.tensors[0], values=values),))))
    with pytest.raises(WhyError, match="cannot tell which op"):
        why(tampered, stage_id, (0, 2, 3))  # the stage's tensor is no longer the op's output


# ---------------------------------------------------------------- real op stages


def traced(spec: str, sentence: str = "I love AI !") -> Trace:
    with contextlib.redirect_stderr(io.StringIO()):
        return run_trace(Config(sentence), Source(module=spec))


def test_a_wrong_softcaps_op_stages_are_div_tanh_mul_of_the_scaled_scores() -> None:
    """tanh(s / cap) * 2 cap is not soft-capping: three op stages, each cell recomputed."""
    trace = traced(f"{FIXTURES / 'unsound' / 'softcap_wrong_gain.py'}:MultiHeadAttention")
    ops = [s for s in trace.stages if s.kind == "op"]
    assert [s.ops[-1].name for s in ops] == ["div", "tanh", "mul"]
    scaled = trace.stage("scale").tensors[-1].values.astype(np.float64)
    cap = float(ops[0].ops[-1].args[1])
    want = {ops[0].id: scaled / cap, ops[1].id: np.tanh(scaled / cap),
            ops[2].id: np.tanh(scaled / cap) * 2 * cap}
    for stage in ops:
        for cell in every_cell(trace, stage.id):
            assert cell.computed == pytest.approx(want[stage.id][cell.index], rel=1e-6, abs=1e-7)
            assert cell.agrees
    assert f"= scale's attn_weights[0, 1, 2, 1] / {cap:g}" in why(trace, ops[0].id, (0, 1, 2, 1)).formula
    assert f"tanh({ops[0].id}'s attn_weights[0, 1, 2, 1])" in why(trace, ops[1].id, (0, 1, 2, 1)).formula


@pytest.mark.parametrize(("fixture", "name", "independent"), [
    ("unsound/relu_v.py:MultiHeadAttention", "relu", lambda v: np.maximum(v, 0)),
    ("unsound/roll_k.py:MultiHeadAttention", "roll", lambda k: np.roll(k, 1, axis=2)),
])
def test_relu_and_roll_stages_match_numpy(fixture: str, name: str, independent: object) -> None:
    trace = traced(f"{FIXTURES / fixture}")
    stage = next(s for s in trace.stages if s.kind == "op" and s.ops[-1].name == name)
    source = trace.stage("transpose").tensors[-1 if name == "relu" else 1].values
    want = independent(source.astype(np.float64))  # type: ignore[operator]
    for cell in every_cell(trace, stage.id):
        assert cell.computed == want[cell.index] and cell.agrees


def test_odd_ops_zeros_and_cat_along_the_last_dim() -> None:
    trace = traced(f"{FIXTURES / 'odd_ops.py'}:OddOps")
    zeros, cat = (s for s in trace.stages if s.kind == "op" and s.ops[-1].name in ("zeros", "cat"))
    assert all(c.computed == 0.0 and c.agrees for c in every_cell(trace, zeros.id))
    y, x = (t.values for t in cat.tensors[:2])
    want = np.concatenate([y, x], axis=-1)
    for cell in every_cell(trace, cat.id):
        assert cell.computed == want[cell.index] and cell.agrees
    assert why(trace, cat.id, (0, 1, 5)).formula.endswith("= x[0, 1, 1]")


def test_a_complex_unknown_op_is_not_recomputed_and_its_real_part_is_read() -> None:
    trace = traced(f"{FIXTURES / 'mechanisms' / 'fnet_fourier.py'}:FNetBasicFourierTransform")
    fft, real = (s for s in trace.stages if s.kind == "op")
    x = trace.recording.snapshot(fft.ops[-1].inputs[0]).values.astype(np.float64)
    mixed = np.fft.fftn(x, axes=(1, 2))
    cell = why(trace, fft.id, (0, 3, 2))
    assert not cell.recomputed and "torch.fft.fftn" in cell.notes[0]
    assert any("its real part is shown" in n for n in cell.notes)
    for cell in every_cell(trace, real.id):
        assert cell.computed == pytest.approx(mixed.real[cell.index], abs=1e-5) and cell.agrees


# ---------------------------------------------------------------- the error stage


def test_the_error_stage_explains_its_cells_and_quotes_the_exception() -> None:
    """crash_attn: view after transpose raises; the last tensor is (weights @ v)'s transpose."""
    trace = traced(f"{FIXTURES / 'crash_attn.py'}:CrashingAttention")
    assert trace.stages[-1].kind == "error"
    context = trace.stage("attend").tensors[-1].values
    want = np.swapaxes(context, 1, 2)
    cells = every_cell(trace, "error")
    for cell in cells:
        assert cell.computed == want[cell.index] and cell.agrees
    message = trace.recording.error.message
    notes = cells[-1].notes
    assert f"the forward raised RuntimeError at line 23: {message}" in notes
    assert "view size is not compatible" in message
    assert notes[0].startswith("the forward raised")  # first: a short panel still shows it
    assert any("matmul read transpose's v: shape (1, 2, 4, 2)" in n and "not contiguous" in n
               for n in notes), notes
    assert any(n.startswith("transpose made this tensor") and n.endswith("not contiguous")
               for n in notes), notes


def test_the_error_stage_of_a_shape_mismatch_names_what_raised() -> None:
    trace = traced(f"{FIXTURES / 'odd_ops.py'}:OddOps")
    cell = why(trace, "error", (3, 1))
    assert cell.computed == 1.0 and cell.agrees
    assert ("the forward raised RuntimeError at line 22: mat1 and mat2 shapes cannot be "
            "multiplied (3x3 and 4x2)") in cell.notes


def test_a_numpy_error_stage_is_explained_too() -> None:
    from tests.fixtures.numpy_attn import BrokenReshape

    result = trace_numpy(BrokenReshape(4, 2), np.ones((3, 4), dtype=np.float32), ["a", "b", "c"])
    cells = every_cell(result, "error")
    assert all(c.agrees for c in cells)
    assert any("cannot reshape array" in n for n in cells[0].notes)


def test_op_and_error_are_explained_kinds_and_aux_kinds_make_no_stage() -> None:
    """cache and plumbing ops are `aux`: they join the stage that consumes them, never a
    stage of their own, so there is no cell of theirs to explain."""
    from mha_tui.kinds import cache, plumbing

    assert {"op", "error"} <= set(KINDS)
    assert cache.KIND == plumbing.KIND == "aux" and "aux" not in KINDS
    for spec in ("crash_attn.py:CrashingAttention", "odd_ops.py:OddOps"):
        assert all(s.kind != "aux" for s in traced(f"{FIXTURES / spec}").stages)


# ---------------------------------------------------------------- NumPy spellings


class NumpyOps:
    """A NumPy forward whose ops no rule places: NumPy's names for the same families."""

    def __init__(self) -> None:
        self.W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)

    def forward(self, x: np.ndarray) -> np.ndarray:
        a = np.exp(x)
        b = np.maximum(x, 0)
        c = x.T
        d = np.concatenate([x, a], axis=1)
        e = x.sum(axis=-1)
        f = x.max(axis=0, keepdims=True)
        g = np.einsum("tc,sc->ts", x, x)
        h = x @ self.W
        i = np.where(x > 0, x, -x)
        j = np.transpose(x, (1, 0)).reshape(2, 6)
        k = x.var(axis=1)
        m = np.swapaxes(x[None], 1, 2)
        return (a + b + c.T + d[:, :4] + e[:, None] + f + g[:, :1] + h[:, :1] + i
                + j.reshape(3, 4) + k[:, None] + m[0].T)


def test_numpy_op_names_are_read_like_torchs() -> None:
    x = np.array([[0.5, -1.0, 2.0, 0.25], [-0.5, 1.5, -2.0, 1.0], [0.1, 0.2, -0.3, 0.4]],
                 dtype=np.float32)
    result = trace_numpy(NumpyOps(), x, ["a", "b", "c"])
    x64, w = x.astype(np.float64), np.linspace(-1, 1, 12).reshape(4, 3)
    want = {"exp": np.exp(x64), "maximum": np.maximum(x64, 0), "T": x64.T,
            "concatenate": np.concatenate([x64, np.exp(x64)], axis=1), "sum": x64.sum(-1),
            "max": x64.max(0, keepdims=True), "einsum": x64 @ x64.T, "matmul": x64 @ w,
            "where": np.abs(x64), "transpose": x64.T, "var": x64.var(1),
            "swapaxes": np.swapaxes(x64[None], 1, 2)}
    ops = {op.name: op for op in reversed(result.recording.ops)}  # the first of each name
    for name, values in want.items():
        trace, stage_id = as_op_stage(result, ops[name])
        for cell in every_cell(trace, stage_id):
            assert cell.recomputed, (name, cell.notes)
            assert cell.computed == pytest.approx(values[cell.index], rel=1e-6, abs=1e-6), name
            assert cell.agrees, (name, cell.formula)


# ---------------------------------------------------------------- the command line and the app


SOFTCAP = ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
           "tests/fixtures/unsound/softcap_wrong_gain.py:MultiHeadAttention")
FNET = ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
        "tests/fixtures/mechanisms/fnet_fourier.py:FNetBasicFourierTransform")


@pytest.mark.parametrize(("cell", "args", "name"), [
    ("op-2[0, 1, 2, 1]", SOFTCAP, "op-softcap"),
    ("op[0, 2, 3]", FNET, "op-fnet"),
])
def test_why_of_an_op_from_the_command_line_is_the_golden_text(
        cell: str, args: tuple[str, ...], name: str) -> None:
    result = run_cli("explain", *args, "--dump", "-", "--why", cell)
    assert result.returncode == 0, result.stderr
    golden = Path(ROOT) / "tests" / "golden" / f"why-{name}.txt"
    assert result.stdout.decode("utf-8") == golden.read_text(encoding="utf-8")


async def test_enter_on_an_op_stage_shows_its_why_panel() -> None:
    from mha_tui.app.explain import ExplainApp

    from .test_app import text_of

    trace = traced(f"{FIXTURES / 'unsound' / 'softcap_wrong_gain.py'}:MultiHeadAttention")
    app = ExplainApp(trace.config, trace=trace, start="op-2")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("enter", "down", "down", "right", "tab")
        await pilot.pause()
        shown = text_of(app, "#why-body")
        assert app.query_one("#why").display
        assert "why attn_weights[0, 1, 2, 1]" in shown, shown
        assert "tanh(a)" in shown and "✓ equal" in shown, shown


async def test_enter_on_the_error_stage_shows_the_exception() -> None:
    from mha_tui.app.explain import ExplainApp

    from .test_app import text_of

    trace = traced(f"{FIXTURES / 'crash_attn.py'}:CrashingAttention")
    app = ExplainApp(trace.config, trace=trace, start="error")
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.press("enter")
        await pilot.pause()
        shown = " ".join(text_of(app, "#why-body").split())
        assert "✓ equal" in shown and "view size is not compatible" in shown, shown


def test_baddbmm_with_keyword_batches_and_a_complex_product() -> None:
    """BLOOM's alibi.baddbmm(batch1=q, batch2=k, beta, alpha), and Meta Llama's complex
    xq_ * freqs_cis (the real part shown): recomputed and equal, cell by cell."""
    bloom = traced(f"{FIXTURES / 'mechanisms' / 'alibi.py'}:BloomAttention")
    op = next(o for o in bloom.recording.ops if o.name == "baddbmm")
    snap = bloom.recording.snapshot
    bias, q, k = (snap(r).values.astype(np.float64) for r in op.inputs)
    want = op.kwarg("beta") * bias + op.kwarg("alpha") * (q @ k)
    trace, stage_id = as_op_stage(bloom, op)
    for cell in every_cell(trace, stage_id):
        assert cell.computed == pytest.approx(want[cell.index], rel=1e-9, abs=1e-12) and cell.agrees
    llama = traced(f"{FIXTURES / 'mechanisms' / 'meta_llama.py'}:Attention")
    op = next(o for o in llama.recording.ops if o.name == "mul" and
              np.iscomplexobj(o.out.values))
    a, b = (llama.recording.snapshot(r).values.astype(np.complex128) for r in op.inputs)
    want = (a * b).real
    trace, stage_id = as_op_stage(llama, op)
    for cell in every_cell(trace, stage_id):
        assert cell.computed == pytest.approx(want[cell.index], abs=1e-6) and cell.agrees


def test_a_softmax_ops_exp_lines_read_as_exp_of_the_difference() -> None:
    """Each exp line reads `exp(v - max) = e`, not `v - max = e` (a subtraction that is
    not equal to its right-hand side), as in the softmax stage's own why."""
    trace, results, _ = everything()
    traced, stage_id = as_op_stage(trace, *op_making(trace, "softmax", results["softmax"]))
    cell = why(traced, stage_id, (0, 1, 2))
    exps = [t for t in cell.terms if t.label.endswith(" - max)")]
    assert exps and all(t.parts[0] == "exp(" and t.parts[-1] == ")" for t in exps)
    line = next(line for line in rendered(cell).splitlines()
                if line.strip().startswith("exp(x[0, 1, 2] - max)"))
    value, top = exps[[t.label for t in exps].index("exp(x[0, 1, 2] - max)")].parts[1:4:2]
    assert f"exp({value:.4f} - {top:.4f}) = " in line, line


def test_a_dtype_overflow_to_inf_agrees_with_the_float64_number_beyond_that_dtype() -> None:
    """mha-tui recomputes in float64: where the module's float32 overflowed to ±inf (scores
    times 1e76, tests/fixtures/nan_rows.py), a float64 number beyond float32's largest, of
    the same sign, is the same number; below it, or of the other sign, it is not."""
    import math

    from mha_tui.kinds._parts.cell import agrees

    assert agrees(1e76, math.inf) and agrees(-1e76, -math.inf)
    assert not agrees(-1e76, math.inf) and not agrees(1e30, math.inf)
    assert agrees(7e4, math.inf, "float16") and not agrees(7e4, math.inf)
