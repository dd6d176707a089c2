"""How much slower a forward pass is when mha-tui traces it, and when TorchLens does.

    .venv/bin/python benchmarks/trace_overhead.py [--tokens 128 512] [--runs 5] [--clock cpu]

One process, the mygpt chapter's module at GPT-2 small's sizes (C 768, h 12): the plain
forward under torch.no_grad(), `mha_tui.trace` (record, recognise, every stage's tensors and
checks), and TorchLens's `trace` (every op's activation saved) when it is installed
(`pip install -e ".[bench]"`). Medians of --runs after one warm-up each; the ratios are over
the plain forward measured in the same run. `--clock wall` (default) times with the wall
clock; `--clock cpu` with this process's CPU time (`time.process_time`), which a loaded
machine disturbs far less: run it with one thread (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1),
or the time other threads spend waiting counts too. Prints one JSON list; benchmarks/bench.py
turns it into rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

CLOCK = time.perf_counter


def _median_seconds(run, runs: int) -> float:
    run()  # warm-up: first-call costs (allocators, lazy imports) are not the steady state
    times = []
    for _ in range(runs):
        started = CLOCK()
        run()
        times.append(CLOCK() - started)
    return statistics.median(times)


def measure(tokens: int, runs: int) -> dict[str, float | None]:
    import torch

    import mha_tui
    from mha_tui.examples.mygpt import MultiHeadAttention

    torch.manual_seed(0)
    module = MultiHeadAttention(embed_dim=768, num_heads=12, max_seq_len=tokens, dropout=0.0).eval()
    x = torch.randn(1, tokens, 768)

    def plain() -> None:
        with torch.no_grad():
            module(x)

    result: dict[str, float | None] = {
        "tokens": tokens,
        "plain": _median_seconds(plain, runs),
        "mha_tui": _median_seconds(lambda: mha_tui.trace(module, x), runs),
        "torchlens": None,
    }
    if importlib.util.find_spec("torchlens") is not None:
        import torchlens

        result["torchlens"] = _median_seconds(lambda: torchlens.trace(module, x), runs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    print(json.dumps([measure(t, args.runs) for t in args.tokens]))


if __name__ == "__main__":
    main()
