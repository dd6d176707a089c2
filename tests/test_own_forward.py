"""The "out equals the module's own forward" check: one forward when nothing is random or
kept, a second one when the recording (or the generators, or the module's tensors) show
randomness or state, and a check that fails when the recorded output is not what the
forward returned."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

import mha_tui
from mha_tui.examples.mygpt import MultiHeadAttention


class Counted(nn.Module):
    """Wraps a module and counts how often its forward runs."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(x)


class RandomNoise(nn.Module):
    def __init__(self, C: int) -> None:
        super().__init__()
        self.proj = nn.Linear(C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.randn(x.shape)  # (B, T, C)


class PythonCoin(nn.Module):
    """Draws from Python's random module: invisible in the ops, seen in the generator."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.proj = nn.Linear(C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * (2.0 if random.random() < 0.5 else 1.0)


class CountingBuffer(nn.Module):
    """Keeps state in a buffer: the second call starts from another state."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.proj = nn.Linear(C, C)
        self.register_buffer("step", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return self.proj(x) * self.step


class OwnGenerator(nn.Module):
    """Draws from a generator of its own: torch's default generator does not move."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.proj = nn.Linear(C, C)
        self.generator = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.randn(x.shape, generator=self.generator)


class RewritesItsOutput(nn.Module):
    """Changes its output through NumPy after the last torch op: the recorded output is not
    what the forward returns."""

    def __init__(self, C: int) -> None:
        super().__init__()
        self.proj = nn.Linear(C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.proj(x)
        out.numpy()[..., 0] = 7.0
        return out


def _own_forward(trace: mha_tui.Trace) -> list[tuple[str, bool | None]]:
    return [(c.label, c.ok) for s in trace.stages for c in s.checks if "own forward" in c.label]


def _counted(inner: nn.Module) -> tuple[Counted, torch.Tensor]:
    torch.manual_seed(0)
    return Counted(inner), torch.randn(1, 5, 8)


def test_a_deterministic_module_runs_once_and_its_output_is_checked() -> None:
    torch.manual_seed(0)
    module, x = _counted(MultiHeadAttention(8, 2).eval())
    trace = mha_tui.trace(module, x)
    assert module.calls == 1
    assert _own_forward(trace) == [
        ("out equals the module's own forward, module(x): torch.equal = True", True)]


@pytest.mark.parametrize("make", [
    lambda: MultiHeadAttention(8, 2, dropout=0.5).train(),  # dropout in training mode
    lambda: RandomNoise(8),
    lambda: PythonCoin(8),
])
def test_randomness_keeps_the_second_forward_with_the_same_draws(make) -> None:
    torch.manual_seed(0)
    random.seed(0)
    module, x = _counted(make())
    trace = mha_tui.trace(module, x)
    assert module.calls == 2
    checks = _own_forward(trace)
    assert len(checks) == 1
    # torch's generator is rewound for the second call; Python's is not (nothing can rewind
    # a module's own use of it), so only the torch draws repeat exactly.
    if not isinstance(module.inner, PythonCoin):
        assert checks[0][1] is True


@pytest.mark.parametrize("make", [CountingBuffer, OwnGenerator])
def test_state_kept_between_calls_keeps_the_second_forward_and_shows_it(make) -> None:
    module, x = _counted(make(8))
    trace = mha_tui.trace(module, x)
    assert module.calls == 2
    # step 2 doubles what step 1 returned; the module's generator has moved on
    assert _own_forward(trace)[0][1] is False


def test_the_check_fails_when_the_recorded_output_is_not_the_returned_one() -> None:
    module, x = _counted(RewritesItsOutput(8))
    trace = mha_tui.trace(module, x)
    assert module.calls == 1
    label, ok = _own_forward(trace)[0]
    assert ok is False and label.endswith("= False")
    shown = trace.recording.snapshot(trace.recording.output).values
    assert not np.all(shown[..., 0] == 7.0)  # the values as the op made them
