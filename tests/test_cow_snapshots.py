"""Copy-on-write snapshots: a recorded tensor shows the values it had when its op ran,
whatever writes into it later (inside the forward, after it, through NumPy, or by an op that
does not say it writes), and a snapshot only stays a view of the module's own tensor when
nothing outside the recording can reach it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mha_tui.tracing import record
from mha_tui.tracing import snapshots as snapshots_module


@pytest.fixture(autouse=True)
def every_tensor_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small tensors are copied at once (cheaper); here every one goes through the lazy path."""
    monkeypatch.setattr(snapshots_module, "_SMALL", 0)


class Scores(nn.Module):
    """q @ k^T, then whatever `after` does with the scores; returns the softmax."""

    def __init__(self, after=None, keep: bool = False) -> None:
        super().__init__()
        self.after, self.keep = after, keep
        self.kept: torch.Tensor | None = None
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        scores = x @ x.transpose(-2, -1)  # (B, T, T)
        if self.keep:
            self.kept = scores
        if self.after is not None:
            self.after(scores)
        return scores.softmax(dim=-1)


def _recorded_scores(module: nn.Module, x: torch.Tensor) -> tuple[np.ndarray, object]:
    result = record(lambda: module(x), {"": module})
    assert result.error is None
    rec = result.recordings[""]
    op = next(op for op in rec.ops if op.name == "matmul")
    return op.out.values, result


def _x() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(1, 4, 3)


def _expected(x: torch.Tensor) -> np.ndarray:
    return (x @ x.transpose(-2, -1)).numpy()


@pytest.mark.parametrize("write", [
    lambda s: s.masked_fill_(torch.ones_like(s, dtype=torch.bool), 0.0),  # an in-place method
    lambda s: s.__setitem__((0, 0), 99.0),  # scores[0, 0] = 99
    lambda s: torch.mul(s, 0.0, out=s),  # out=
    lambda s: torch.relu(s.neg_()),  # neg_ writes, then a plain op
    lambda s: nn.functional.relu(s, True),  # inplace=True given positionally
    lambda s: s.view(-1).zero_(),  # through a view of the same storage
])
def test_a_write_inside_the_forward_leaves_the_recorded_values(write) -> None:
    x = _x()
    module = Scores(write)
    values, _ = _recorded_scores(module, x)
    assert np.array_equal(values, _expected(x))
    assert module.calls == 1  # copied before the write, not recorded again


def test_a_write_through_numpy_leaves_the_recorded_values() -> None:
    x = _x()

    def through_numpy(s: torch.Tensor) -> None:
        s.numpy()[...] = 5.0  # torch never sees this write

    values, _ = _recorded_scores(Scores(through_numpy), x)
    assert np.array_equal(values, _expected(x))


def test_a_write_no_op_announces_is_caught_and_recorded_again() -> None:
    """torch.ops.aten writes in place under a name the recorder does not read as a write:
    the version counter moved, so the forward is recorded again with copies."""
    x = _x()

    def quiet(s: torch.Tensor) -> None:
        torch.ops.aten.mul_.Scalar(s, 0.0)

    module = Scores(quiet)
    values, _ = _recorded_scores(module, x)
    assert np.array_equal(values, _expected(x))
    assert module.calls == 2


def test_a_tensor_the_module_keeps_is_copied() -> None:
    x = _x()
    module = Scores(keep=True)
    values, _ = _recorded_scores(module, x)
    assert module.kept is not None
    module.kept.zero_()  # after the recording: the module's own tensor changes ...
    assert np.array_equal(values, _expected(x))  # ... the recording does not
    assert values.flags.owndata or values.base is not None


def test_the_returned_output_is_copied_and_the_rest_are_read_only_views() -> None:
    x = _x()
    module = Scores()
    result = record(lambda: module(x), {"": module})
    rec = result.recordings[""]
    softmax = next(op for op in rec.ops if op.name == "softmax").out.values
    expected = result.value.clone()
    result.value.zero_()  # the caller writes into what it got back
    assert np.array_equal(softmax, expected.numpy())
    scores = next(op for op in rec.ops if op.name == "matmul").out.values
    assert not scores.flags.writeable  # nothing else holds it: a view, read-only
    with pytest.raises(ValueError):
        scores[0, 0, 0] = 1.0


def test_a_view_the_caller_gets_back_copies_its_whole_storage() -> None:
    class ReturnsAView(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scores = x @ x.transpose(-2, -1)  # (B, T, T)
            return scores.view(-1)  # the caller holds a view of the scores' storage

    x = _x()
    module = ReturnsAView()
    values, result = _recorded_scores(module, x)
    result.value.fill_(3.0)
    assert np.array_equal(values, _expected(x))
