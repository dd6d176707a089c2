"""The check's faster numbers give NumPy's own answers, bit for bit (ops/numeric.py), and a
recording leaves no reference cycle behind (it is freed without the garbage collector)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from mha_tui.ops.numeric import equal, finite_std


@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 127, 128, 129, 8191, 65536, 65537, 100_003,
                               1 << 20, 3 * (1 << 20) + 5])
def test_finite_std_is_numpys_float64_std_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    values = (rng.standard_normal(n) * 3.7 + 1.25).astype(np.float32)
    if n > 10:
        values[::9] = -np.inf  # masked scores: left out, as by a boolean index
        values[5] = np.nan
    finite = values[np.isfinite(values)].astype(np.float64)
    got = finite_std(values.reshape(-1, 1) if n % 2 else values)
    if finite.size < 2:
        assert got is None
    else:
        assert got == float(finite.std(ddof=1))  # ==, not isclose: the same additions


def test_finite_std_of_a_four_d_tensor() -> None:
    values = np.random.default_rng(1).standard_normal((1, 12, 300, 300)).astype(np.float32)
    values[..., np.triu_indices(300, 1)[0], np.triu_indices(300, 1)[1]] = -np.inf
    expected = values[np.isfinite(values)].astype(np.float64).std(ddof=1)
    assert finite_std(values) == float(expected)


@pytest.mark.parametrize("a, b", [
    (np.array([1.0, 2.0]), np.array([1.0, 2.0])),
    (np.array([1.0, np.nan]), np.array([1.0, np.nan])),
    (np.array([1.0, np.nan]), np.array([1.0, 2.0])),
    (np.array([1.0, 2.0]), np.array([1.0, 3.0])),
    (np.array([1.0, 2.0]), np.array([1.0, 2.0, 3.0])),
    (np.array([[1.0, 2.0]]), np.array([1.0, 2.0])),
    (np.array([-np.inf, 0.0]), np.array([-np.inf, 0.0])),
    (np.array([True, False]), np.array([True, False])),
    (np.array([1, 2], dtype=np.int64), np.array([1.0, 2.0], dtype=np.float32)),
    (np.zeros((0, 3)), np.zeros((0, 3))),
])
def test_equal_is_array_equal_with_equal_nan(a: np.ndarray, b: np.ndarray) -> None:
    assert equal(a, b) is bool(np.array_equal(a, b, equal_nan=True))


def test_a_trace_leaves_no_reference_cycle() -> None:
    torch = pytest.importorskip("torch")
    import mha_tui
    from mha_tui.examples.mygpt import MultiHeadAttention

    torch.manual_seed(0)
    module = MultiHeadAttention(embed_dim=8, num_heads=2).eval()
    x = torch.randn(1, 5, 8)
    mha_tui.trace(module, x)  # warm: first-call caches are not garbage
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        trace = mha_tui.trace(module, x)
        assert trace.stages
        del trace
        assert gc.collect() == 0  # every object was freed by its reference count
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("decimals", [0, 2, 4, 6])
def test_format_column_writes_each_value_as_format_value(dtype: type, decimals: int) -> None:
    from mha_tui.render.values import format_column, format_value

    rng = np.random.default_rng(decimals)
    tricky = [0.0, -0.0, -1e-9, -0.00004, -0.00005, -0.00006, -0.4999, -0.5, -0.9999, -1.0,
              -1.00001, 0.5, 1e6, -1e6, 999999.9, -3.4e38, 3.4e38, np.inf, -np.inf, np.nan,
              -np.nan, 1e-3, -1e-3, -0.005, -0.0049]
    with np.errstate(over="ignore"):  # 3.4e38 is inf in float16: inf is a case too
        values = np.concatenate([np.array(tricky), rng.standard_normal(2000) * 10.0 ** rng.integers(
            -8, 8, 2000)]).astype(dtype)
    assert format_column(values, "float", decimals) == \
        [format_value(v, "float", decimals) for v in values.tolist()]
