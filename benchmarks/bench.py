"""mha-tui's speed, as ratios against `python -c "import torch"` measured in the same run.

    make bench                # or: .venv/bin/python benchmarks/bench.py [--runs N] [--check]

Startup figures are whole processes (median of N runs); the app's first paint and first
values come from marks the app writes when MHA_TUI_MARKS is set, while it runs in a
pseudo-terminal; key-press repaint is timed inside the app (its repaint_seconds hook,
from the key's handler to the end of the next screen refresh). Peak memory is each
process's own ru_maxrss. `--check` exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
PYTHON = str(BIN / "python")
MHA = [str(BIN / "mha-tui")]  # the console script, as a user runs it
SENTENCE = "I love AI !"
# A learner's file for the --module row: nanoGPT-style, fused projection and SDPA.
LEARNER = str(Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nanogpt_attn.py")
GPT2_512 = " ".join(f"w{i}" for i in range(512))  # GPT-2 small sizes, 512 tokens
JSON_OUT = os.path.join(tempfile.gettempdir(), "mha-tui-bench.json")


HF_SENTENCE = "The cat sat on the mat"
# The app at GPT-2 small's sizes with 128 tokens.
BIG_SENTENCE = " ".join(f"w{i}" for i in range(128))
BIG = ["--embed-dim", "768", "--heads", "12", "--max-seq-len", "128"]


def tiny_hf_model(directory: Path) -> Path | None:
    """The tests' tiny GPT-2 and byte-level tokenizer, saved to directory (None without the
    [hf] extra): transformers' import time and the model's own forward, not a download."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.hf_models import save_tiny_gpt2

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    return save_tiny_gpt2(directory)


@dataclass
class Run:
    seconds: float
    max_rss_kib: int


def run_process(argv: list[str], env: dict[str, str] | None = None) -> Run:
    """Wall time and peak RSS of one whole process, output discarded."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)} exited {proc.returncode}")
    return Run(elapsed, usage.ru_maxrss)


def app_in_pty(*extra: str, sentence: str = SENTENCE) -> tuple[float, float, int]:
    """One run of the app in a 100x32 pseudo-terminal: seconds to first paint and to first
    values (from the app's marks), and its peak RSS (KiB). extra: more `explain` arguments."""
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks"
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 32, 100, 0, 0))
        env = {**os.environ, "MHA_TUI_MARKS": str(marks), "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        started = time.time()
        proc = subprocess.Popen([*MHA, "explain", sentence, *extra], stdin=slave, stdout=slave,
                                stderr=slave, env=env, close_fds=True)
        os.close(slave)

        def drain() -> None:  # a pty nobody reads fills up and blocks the app
            try:
                while os.read(master, 65536):
                    pass
            except OSError:
                return

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.time() + 60
        seen: dict[str, float] = {}
        while time.time() < deadline and "values" not in seen:
            time.sleep(0.005)
            if marks.exists():
                for line in marks.read_text().splitlines():
                    name, stamp = line.split()
                    seen[name] = float(stamp)
        os.write(master, b"q")
        _, _, usage = os.wait4(proc.pid, 0)
        os.close(master)
    if "values" not in seen:
        raise SystemExit("bench: the app never showed its values")
    return seen["paint"] - started, seen["values"] - started, usage.ru_maxrss


async def _repaints(config_args: dict, warm: bool) -> float:
    from mha_tui.app import ExplainApp
    from mha_tui.config import Config
    from mha_tui.pipeline import run_trace

    trace = run_trace(Config(**config_args))
    app = ExplainApp(trace.config, trace=trace)
    app._cache_disabled = not warm
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        app.repaint_seconds.clear()
        for key in ["right"] * 10 + ["left"] * 10 + ["right"] * 10:
            await pilot.press(key)
            await pilot.pause()
            if not warm:
                app._cache.clear()
        return statistics.median(app.repaint_seconds)


def repaint_ms(config_args: dict, warm: bool) -> float:
    return 1000 * asyncio.run(_repaints(config_args, warm))


@dataclass
class Row:
    what: str
    value: str
    ratio: float | None
    target: str
    ok: bool | None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()
    n = args.runs

    # Round-robin: every round runs the floor and each command once, so that a noisy
    # moment on the machine hits them alike; medians over the rounds.
    commands = {
        "floor": ([PYTHON, "-c", "import torch"], None),
        "version": ([*MHA, "--version"], None),
        "help": ([*MHA, "--help"], None),
        "completion": ([*MHA], {"_MHA_TUI_COMPLETE": "complete_bash",
                               "COMP_WORDS": "mha-tui expl", "COMP_CWORD": "1"}),
        "dump": ([*MHA, "explain", SENTENCE, "--dump", "-"], None),
        "raschka": ([*MHA, "explain", SENTENCE, "--model", "raschka", "--dump", "-"], None),
        "module": ([*MHA, "explain", SENTENCE, "--module", f"{LEARNER}:CausalSelfAttention",
                    "--dump", "-"], None),
        # The NumPy blueprint: no torch on this path at all.
        "numpy": ([*MHA, "explain", SENTENCE, "--model", "blueprint", "--dump", "-"], None),
        # GPT-2 small's sizes, every number: 2.4 M values in column blocks, ~25 MB of text.
        "full": ([*MHA, "explain", SENTENCE, "--embed-dim", "768", "--heads", "12", "--full",
                  "--dump", "-"], None),
        # ... and with 512 tokens as JSON: 21.5 M values, 227 MB, streamed into a file.
        "json_gpt2": ([*MHA, "explain", GPT2_512, "--embed-dim", "768", "--heads", "12",
                       "--max-seq-len", "512", "--format", "json", "--dump", JSON_OUT], None),
    }
    # --hf on a tiny GPT-2 (3 layers, C=16) built here offline, when the [hf] extra is there.
    hf_dir = tempfile.TemporaryDirectory(prefix="mha-tui-bench-")
    tiny = tiny_hf_model(Path(hf_dir.name))
    if tiny is not None:
        commands["hf"] = ([*MHA, "explain", HF_SENTENCE, "--hf", str(tiny), "--dump", "-"], None)
    samples: dict[str, list[Run]] = {name: [] for name in commands}
    apps: list[tuple[float, float, int]] = []
    numpy_apps: list[tuple[float, float, int]] = []
    big_apps: list[tuple[float, float, int]] = []
    for _ in range(n):
        for name, (argv, env) in commands.items():
            samples[name].append(run_process(argv, env))
        apps.append(app_in_pty())
        big_apps.append(app_in_pty(*BIG, sentence=BIG_SENTENCE))
        numpy_apps.append(app_in_pty("--model", "blueprint"))
    result = {name: Run(statistics.median(r.seconds for r in runs),
                        int(statistics.median(r.max_rss_kib for r in runs)))
              for name, runs in samples.items()}
    floor, dump = result["floor"], result["dump"]
    f = floor.seconds
    rows: list[Row] = [Row('python -c "import torch" (the floor)', f"{f:.3f} s", 1.0, "", None)]
    for name, what, limit in [("version", "mha-tui --version", 0.25),
                              ("help", "mha-tui --help", 0.25),
                              ("completion", "shell completion (bash)", 0.25),
                              ("dump", f'explain "{SENTENCE}" --dump -', 1.10),
                              ("raschka", "  same, --model raschka", 1.10),
                              ("module", "  same, --module nanogpt_attn.py:CausalSelfAttention",
                               1.10),
                              ("numpy", f'explain "{SENTENCE}" --model blueprint --dump -', 0.30),
                              ("full", "C=768 h=12 --full --dump - (2.4 M numbers)", 3.0),
                              ("json_gpt2", "JSON, C=768 h=12 T=512 (21.5 M values, 227 MB)",
                               2.00)]:
        ratio = result[name].seconds / f
        rows.append(Row(what, f"{result[name].seconds:.3f} s", ratio, f"<= {limit:.2f} x",
                        ratio <= limit))

    if "hf" in result:
        rows.append(Row(f'explain "{HF_SENTENCE}" --hf (tiny GPT-2) --dump -',
                        f"{result['hf'].seconds:.3f} s", result["hf"].seconds / f, "", None))

    paint = statistics.median(a[0] for a in apps)
    values = statistics.median(a[1] for a in apps)
    app_rss = int(statistics.median(a[2] for a in apps))
    rows.append(Row("app: first paint (header, rail, loading)", f"{paint:.3f} s", paint / f,
                    "<= 0.20 x", paint / f <= 0.20))
    rows.append(Row("app: first stage's values on screen", f"{values:.3f} s", values / f,
                    "<= 1.05 x", values / f <= 1.05))
    big_values = statistics.median(a[1] for a in big_apps)
    rows.append(Row("  same, C=768 h=12 T=128", f"{big_values:.3f} s", big_values / f,
                    "<= 1.30 x", big_values / f <= 1.30))
    numpy_values = statistics.median(a[1] for a in numpy_apps)
    rows.append(Row("app, --model blueprint (NumPy): first values", f"{numpy_values:.3f} s",
                    numpy_values / f, "< the torch module's", numpy_values < values))

    # Tracing overhead at GPT-2 small's sizes, in one process: ratios over the plain forward.
    overhead = subprocess.run([PYTHON, str(Path(__file__).with_name("trace_overhead.py")),
                               "--runs", str(n)], capture_output=True, text=True, check=True)
    for size, limit in zip(json.loads(overhead.stdout), (8.0, 4.0), strict=True):
        ours = size["mha_tui"] / size["plain"]
        theirs = None if size["torchlens"] is None else size["torchlens"] / size["plain"]
        rows.append(Row(f"mha_tui.trace over a plain forward, C=768 h=12 T={size['tokens']}",
                        f"{size['mha_tui']:.3f} s", None, f"<= {limit:.0f} x, < TorchLens",
                        ours <= limit and (theirs is None or ours < theirs)))
        rows[-1].value += f" ({ours:.1f} x the forward's {size['plain'] * 1000:.1f} ms)"
        rows.append(Row("  same, TorchLens's trace", "not installed (.[bench])" if theirs is None
                        else f"{size['torchlens']:.3f} s ({theirs:.1f} x)", None, "", None))

    default = {"sentence": SENTENCE}
    gpt2 = {"sentence": " ".join(f"w{i}" for i in range(128)), "embed_dim": 768,
            "num_heads": 12, "max_seq_len": 128}
    for label, cfg, limit, cold_limit in [("C=4 h=2 T=4", default, 12.0, 20.0),
                                          ("C=768 h=12 T=128", gpt2, 50.0, None)]:
        warm = repaint_ms(cfg, warm=True)
        cold = repaint_ms(cfg, warm=False)
        rows.append(Row(f"key -> repaint, {label} (median)", f"{warm:.1f} ms", None,
                        f"<= {limit:.0f} ms", warm <= limit))
        rows.append(Row("  same, first visit, cache cold", f"{cold:.1f} ms", None,
                        "" if cold_limit is None else f"<= {cold_limit:.0f} ms",
                        None if cold_limit is None else cold <= cold_limit))

    for what, rss, limit in [("peak memory, dump", dump.max_rss_kib, 60),
                             ("peak memory, app", app_rss, 60),
                             ("peak memory, JSON C=768 h=12 T=512",
                              result["json_gpt2"].max_rss_kib, 250)]:
        extra = (rss - floor.max_rss_kib) / 1024
        rows.append(Row(what, f"{rss / 1024:.0f} MiB", None, f"<= floor + {limit} MiB",
                        extra <= limit))
    rows.insert(1, Row("peak memory, the floor", f"{floor.max_rss_kib / 1024:.0f} MiB", None, "",
                       None))

    print(f"mha-tui benchmark: {n} runs each, medians; {os.cpu_count()} cores, "
          f"Python {sys.version.split()[0]}\n")
    print("| measure | value | x floor | target | met |")
    print("| --- | ---: | ---: | --- | --- |")
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
        met = {True: "yes", False: "**no**", None: ""}[row.ok]
        print(f"| {row.what} | {row.value} | {ratio} | {row.target} | {met} |")
    Path(JSON_OUT).unlink(missing_ok=True)
    missed = [row.what for row in rows if row.ok is False]
    if missed:
        print(f"\nmissed: {'; '.join(missed)}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
