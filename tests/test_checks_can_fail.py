"""Every ✓ a stage shows is a claim that some module can make ✗ (the bar: a check that cannot
fail is a defect). The mask stage's first check says what each blocked entry holds, read from
the mask op's own arguments; a module whose blocked entries hold something else gets ✗. And no
check in recognise/ or judge/ is built with a literal True."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import mha_tui

ROOT = Path(mha_tui.__file__).parent
C, H, T = 4, 2, 4


class _Head(nn.Module):
    def __init__(self, fill: float) -> None:
        super().__init__()
        self.query = nn.Linear(C, C // H, bias=False)
        self.key = nn.Linear(C, C // H, bias=False)
        self.value = nn.Linear(C, C // H, bias=False)
        self.fill = fill

    def forward(self, x):  # x: (B, T, C)
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, d_h)
        wei = q @ k.transpose(-2, -1) / math.sqrt(C // H)  # (B, T, T)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # (T, T)
        wei = wei.masked_fill(future, self.fill)  # (B, T, T)
        return torch.softmax(wei, dim=-1) @ v  # (B, T, d_h)


class _Heads(nn.Module):
    """A ModuleList of heads, each masking with its own fill value."""

    def __init__(self, fills: tuple[float, ...]) -> None:
        super().__init__()
        self.heads = nn.ModuleList([_Head(f) for f in fills])
        self.proj = nn.Linear(C, C)

    def forward(self, x):  # x: (B, T, C)
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))  # (B, T, C)


class _Fused(nn.Module):
    """One (B, h, T, T) mask op; `leak` adds 1 to a kept score, `early` blocks key 0 of
    query 0 with -1e4 before the causal -inf mask runs."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.how = how

    def forward(self, x):  # x: (B, T, C)
        B = x.shape[0]
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 x (B, T, C)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, h, T, d_h)
        att = q @ k.transpose(-2, -1) / math.sqrt(C // H)  # (B, h, T, T)
        future = torch.triu(torch.full((T, T), float("-inf")), 1)  # (T, T): 0 or -inf
        if self.how == "leak":
            future = future + torch.eye(T)  # (T, T): the diagonal changed too
        att = att + future  # (B, h, T, T)
        att = torch.softmax(att, dim=-1)  # (B, h, T, T)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)  # (B, T, C)


def _mask_checks(module: nn.Module) -> list[tuple[str, bool | None]]:
    torch.manual_seed(0)
    trace = mha_tui.trace(module, torch.randn(1, T, C), ["a", "b", "c", "d"])
    return [(c.label, c.ok) for c in trace.stage("mask").checks]


def test_every_blocked_entry_holding_the_fill_value_is_a_tick() -> None:
    checks = _mask_checks(_Heads((float("-inf"), float("-inf"))))
    assert checks[0] == ("12 of 12 entries above the diagonal are exactly -inf", True)


def test_a_head_that_fills_another_value_is_a_cross() -> None:
    """Head 1 fills -1e4 where head 0's masked_fill says -inf: the claim fails, and the line
    says how many entries hold -inf."""
    checks = _mask_checks(_Heads((float("-inf"), -1e4)))
    assert checks[0] == ("6 of 12 entries above the diagonal are exactly -inf", False)


def test_a_finite_fill_is_named_and_checked() -> None:
    assert _mask_checks(_Heads((-1e9, -1e9)))[0] == (
        "12 of 12 entries above the diagonal hold the fill value -1e+09", True)
    assert _mask_checks(_Heads((-1e9, -1e4)))[0] == (
        "6 of 12 entries above the diagonal hold the fill value -1e+09", False)


def test_an_additive_mask_that_changes_a_kept_entry_is_a_cross() -> None:
    """The -inf entries are what the added mask says (✓); the diagonal it also shifts is a
    kept entry changed (✗), the other claim."""
    assert _mask_checks(_Fused("plain")) == [
        ("12 of 12 entries above the diagonal are exactly -inf", True),
        ("entries on and below the diagonal are unchanged", True)]
    assert _mask_checks(_Fused("leak")) == [
        ("12 of 12 entries above the diagonal are exactly -inf", True),
        ("entries on and below the diagonal are unchanged", False)]


def _literal(node: ast.expr) -> bool:
    """The constant True, or a conditional expression whose branches are all True or None
    with at least one True: an ok no module can make False."""
    leaves = list(_leaves(node))
    return all(isinstance(n, ast.Constant) and n.value in (True, None) for n in leaves) and \
        any(n.value is True for n in leaves)  # type: ignore[attr-defined]


def _leaves(node: ast.expr):
    if isinstance(node, ast.IfExp):
        yield from _leaves(node.body)
        yield from _leaves(node.orelse)
    else:
        yield node


@pytest.mark.parametrize("package", ["recognise", "judge"])
def test_no_check_is_built_with_a_literal_true(package: str) -> None:
    """A Check's ok is computed, or None for a plain fact: never the constant True (a tick
    that shows whatever the module did)."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Check":
                ok = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "ok"), None)
                if ok is not None and _literal(ok):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found
