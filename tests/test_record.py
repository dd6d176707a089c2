"""The op recorder: every op with its line, snapshots that in-place ops cannot rewrite."""

from __future__ import annotations

import torch
from torch import nn

from mha_tui.examples.mygpt import MultiHeadAttention
from mha_tui.tracing import record


class InPlaceMask(nn.Module):
    """Seed 003's habit: mask the raw scores in place, before scaling."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        scores = x @ x.transpose(1, 2)  # (B, T, T)
        scores.masked_fill_(torch.ones(T, T).triu(1).bool(), -torch.inf)
        return torch.softmax(scores / 2.0, dim=-1)


def test_in_place_mask_does_not_rewrite_the_recorded_raw_scores() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 4, 3)
    module = InPlaceMask()
    with torch.no_grad():
        rec = record(lambda: module(x), {"": module}).recordings[""]
    names = [op.name for op in rec.ops]
    raw = rec.ops[names.index("matmul")].out.values
    assert torch.isfinite(torch.from_numpy(raw)).all()
    assert torch.equal(torch.from_numpy(raw), x @ x.transpose(1, 2))
    filled = rec.ops[names.index("masked_fill_")]
    assert filled.in_place and torch.isneginf(torch.from_numpy(filled.out.values)).sum() == 6
    assert filled.inputs[0].op == names.index("matmul")


def test_ops_carry_module_path_source_line_and_origins() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(4, 2).eval()
    x = torch.randn(1, 4, 4)
    with torch.no_grad():
        result = record(lambda: module(x), {"": module})
    rec = result.recordings[""]
    assert torch.equal(result.value, module(x))
    first = rec.ops[0]
    assert (first.name, first.module, first.module_class) == ("linear", "W_Q", "Linear")
    assert first.inputs[0].kind == "input" and first.inputs[0].name == "x"
    assert first.inputs[1].kind == "param" and first.inputs[1].name == "W_Q.weight"
    assert first.source.text.startswith("Q = self.W_Q(x)")
    assert first.source.file.endswith("mygpt.py")
    getitem = next(op for op in rec.ops if op.name == "getitem")
    assert getitem.inputs[0].kind == "buffer" and getitem.inputs[0].name == "causal_mask"
    assert rec.output is not None and rec.output.op == len(rec.ops) - 1
    assert rec.error is None and rec.module_class == "MultiHeadAttention"


class Broken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = x.view(B, T, 2, C // 2).transpose(1, 2)  # (B, h, T, d_h)
        return q.view(B, T, C)  # view after transpose without contiguous(): torch refuses


def test_a_forward_that_raises_keeps_every_op_and_the_failing_line() -> None:
    module = Broken()
    result = record(lambda: module(torch.randn(1, 3, 4)), {"": module})
    rec = result.recordings[""]
    assert isinstance(result.error, RuntimeError)
    assert [op.name for op in rec.ops] == ["view", "transpose"]
    assert rec.error is not None and rec.error.message == str(result.error)
    assert rec.error.source is not None and rec.error.source.text.startswith("return q.view(B, T, C)")


def test_several_roots_inside_an_outer_callable() -> None:
    torch.manual_seed(1)
    layers = nn.ModuleList([MultiHeadAttention(4, 2).eval() for _ in range(2)])
    x = torch.randn(1, 3, 4)

    def run() -> torch.Tensor:
        h = x
        for layer in layers:
            h = h + layer(h)
        return h

    with torch.no_grad():
        result = record(run, {"0": layers[0], "1": layers[1]})
    assert set(result.recordings) == {"0", "1"}
    second = result.recordings["1"]
    assert second.inputs[0][0] == "x"
    # the residual add happens outside both forwards: not recorded
    assert all(op.source.function == "forward" for op in second.ops)
    assert torch.equal(torch.from_numpy(second.inputs[0][1].values), x + layers[0](x))
