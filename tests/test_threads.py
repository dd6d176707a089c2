"""While the recogniser recomputes products beside a torch forward, NumPy's BLAS runs on
one thread (pipeline/threads.py), and the user's setting is back afterwards."""

from __future__ import annotations

import pytest

threadpoolctl = pytest.importorskip("threadpoolctl")
torch = pytest.importorskip("torch")


def _blas_threads() -> list[int]:
    return [info["num_threads"] for info in threadpoolctl.threadpool_info()
            if info["user_api"] == "blas"]


def test_the_recogniser_runs_numpys_blas_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_tui
    import mha_tui.recognise as recognise_package
    from mha_tui.examples.mygpt import MultiHeadAttention

    seen: list[list[int]] = []
    real = recognise_package.recognise

    def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(_blas_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(recognise_package, "recognise", watched)
    torch.manual_seed(0)
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        trace = mha_tui.trace(MultiHeadAttention(embed_dim=8, num_heads=2).eval(),
                              torch.randn(1, 4, 8))
        after = _blas_threads()
    assert trace.stages and seen
    assert before and all(n == 2 for n in before)  # the setting the test made
    assert seen == [[1] * len(before)]  # one thread while recognising
    assert after == before  # and the user's setting back
