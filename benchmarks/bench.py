"""mha-tui's speed, as ratios against `python -c "import torch"` measured in the same run.

    make bench                # or: .venv/bin/python benchmarks/bench.py [--runs N] [--check]
    .venv/bin/python benchmarks/bench.py --only hf,hf_refuse   # some rows, docs/performance.md untouched

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
ROOT = Path(__file__).resolve().parent.parent
HF_ROWS = Path(__file__).with_name("hf_rows.py")
HF_SHAPES = Path(__file__).with_name("hf_shapes.py")
# The checkpoints of hf_shapes.py (GBs): built once, kept between runs, never committed.
SHAPES_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mha-tui-bench"
# (name, layer shown, what else runs: the full load and transformers' forward need the
# whole model in memory: not for the 8B, 15 GiB of bf16 weights)
SHAPE_ROWS = (("llama-3.2-1b", 8, True), ("llama-3.2-3b", 14, True), ("llama-3-8b", 16, False))
# Every measured process starts from this small launcher (see its docstring).
LAUNCH = [PYTHON, "-I", "-S", str(Path(__file__).with_name("launch.py"))]
# Rounds of every command: 5 keep `make bench` near 5 minutes on the 2-core development
# machine when it is quiet (a round is ~35 s; the once-only rows ~2 min) and under 12 at a
# load of 4; --runs changes it.
RUNS = 5
# `--only` names of the app's rows (beside the whole-process commands' names).
APP_ROWS = ("app", "app_big", "app_numpy", "repaint", "keys", "grade300", "hf_shapes")
# Grading: a class of 20 correct submissions every round; once, 300 generated from the
# tests' mistakes (a class's mix: right, wrong in 15 ways, one crashing), end to end, sandboxed
# where bwrap works (as `check` does by default).
MISTAKES = ROOT / "tests" / "fixtures" / "mistakes"
CLASS_SIZE, BIG_CLASS = 20, 300


def make_class(folder: Path, size: int, *, mixed: bool) -> Path:
    """`size` submissions: copies of the correct module, or (mixed) of every mistake in turn."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = sorted(p for p in MISTAKES.glob("*.py") if p.name != "__init__.py")
    if not mixed:
        sources = [MISTAKES / "correct.py"]
    for i in range(size):
        source = sources[i % len(sources)]
        (folder / f"student{i:03d}_{source.stem}.py").write_text(source.read_text())
    return folder


def grade_argv(folder: Path) -> list[str]:
    return [*MHA, "check", str(folder), "--class", "MultiHeadAttention", "--format", "csv"]
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


def _launched(result: Path) -> dict:
    return json.loads(result.read_text(encoding="utf-8"))


def run_process(argv: list[str], env: dict[str, str] | None = None, expect: int = 0) -> Run:
    """Wall time and peak RSS of one whole process, output discarded (through launch.py,
    so that the peak is the command's own, not the benchmark's)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        subprocess.run([*LAUNCH, str(result), *argv], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        done = _launched(result)
    if done["code"] != expect:
        raise SystemExit(f"bench: {' '.join(argv)[:200]} exited {done['code']}")
    return Run(done["seconds"], done["max_rss_kib"])


def app_in_pty(*extra: str, sentence: str = SENTENCE) -> tuple[float, float, int]:
    """One run of the app in a 100x32 pseudo-terminal: seconds to first paint and to first
    values (from the app's marks), and its peak RSS (KiB). extra: more `explain` arguments."""
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks"
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 32, 100, 0, 0))
        env = {**os.environ, "MHA_TUI_MARKS": str(marks), "TERM": "xterm-256color"}
        env.pop("NO_COLOR", None)
        result = Path(tmp) / "result.json"
        proc = subprocess.Popen([*LAUNCH, str(result), *MHA, "explain", sentence, *extra],
                                stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
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
        proc.wait()
        os.close(master)
        done = _launched(result)
    if "values" not in seen:
        raise SystemExit("bench: the app never showed its values")
    started = done["started"]
    return seen["paint"] - started, seen["values"] - started, done["max_rss_kib"]


# A bare Textual app in the same harness: the floor for "key -> visible" (one Static that
# changes on every key).
BARE_APP = """
from textual.app import App
from textual.widgets import Static


class Bare(App):
    count = 0

    def compose(self):
        yield Static("0")

    def on_key(self, event):
        if event.key == "q":
            self.exit()
            return
        self.count += 1
        self.query_one(Static).update(str(self.count))


Bare().run()
"""


def keys_in_pty(argv: list[str], presses: int, *, marks: bool) -> list[float]:
    """Seconds from writing a key to a pseudo-terminal until the app's repaint has been
    written to it (the end of the burst of output the key caused), for `presses` keys:
    right arrow five times, then left five times, and so on. marks: wait for the app's
    "values" mark (mha-tui) before the first key; else for its first output."""
    with tempfile.TemporaryDirectory() as tmp:
        mark_file = Path(tmp) / "marks"
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 32, 100, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color"}
        if marks:
            env["MHA_TUI_MARKS"] = str(mark_file)
        env.pop("NO_COLOR", None)
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                close_fds=True)
        os.close(slave)
        chunks: list[float] = []  # when each piece of output arrived

        def drain() -> None:
            try:
                while os.read(master, 65536):
                    chunks.append(time.perf_counter())
            except OSError:
                return

        threading.Thread(target=drain, daemon=True).start()

        def quiet(after: float, gap: float, limit: float) -> float | None:
            """The last output after `after` once none came for `gap` seconds."""
            deadline = time.perf_counter() + limit
            while time.perf_counter() < deadline:
                time.sleep(0.002)
                seen = [t for t in chunks if t > after]
                if seen and time.perf_counter() - seen[-1] >= gap:
                    return seen[-1]
            return None

        deadline = time.time() + 60
        while time.time() < deadline:
            time.sleep(0.01)
            if (marks and mark_file.exists() and "values" in mark_file.read_text()) or \
                    (not marks and chunks):
                break
        quiet(0.0, 1.0, 30)  # the first screen (and the app's own warm-up) settled
        latencies = []
        for i in range(presses):
            key = b"\x1b[C" if (i // 5) % 2 == 0 else b"\x1b[D"
            started = time.perf_counter()
            os.write(master, key)
            done = quiet(started, 0.15, 5)
            if done is not None:
                latencies.append(done - started)
            time.sleep(0.05)
        os.write(master, b"q")
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.close(master)
    if not latencies:
        raise SystemExit(f"bench: {' '.join(argv)[:80]} never repainted after a key")
    return latencies


async def _repaints(config_args: dict, warm: bool) -> float:
    from mha_tui.app.explain import ExplainApp
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


def _ratio_row(what: str, seconds: float, floor: float, limit: float | None) -> Row:
    ratio = seconds / floor
    return Row(what, f"{seconds:.3f} s", ratio, "" if limit is None else f"<= {limit:.2f} x",
               None if limit is None else ratio <= limit)


def _app_rows(rows: list[Row], f: float, apps: list[tuple[float, float, int]],
              big_apps: list[tuple[float, float, int]],
              numpy_apps: list[tuple[float, float, int]]) -> None:
    """The app's first paint and first values (the rows whose runs were made)."""
    values = None
    if apps:
        paint = statistics.median(a[0] for a in apps)
        values = statistics.median(a[1] for a in apps)
        rows.append(_ratio_row("app: first paint (header, rail, loading)", paint, f, 0.20))
        rows.append(_ratio_row("app: first stage's values on screen", values, f, 1.05))
    if big_apps:
        big_values = statistics.median(a[1] for a in big_apps)
        rows.append(_ratio_row("  same, C=768 h=12 T=128", big_values, f, 1.30))
    if numpy_apps:
        numpy_values = statistics.median(a[1] for a in numpy_apps)
        rows.append(Row("app, --model blueprint (NumPy): first values", f"{numpy_values:.3f} s",
                        numpy_values / f, "< the torch module's",
                        None if values is None else numpy_values < values))


def _key_rows(rows: list[Row], n: int, repaint: bool, keys: bool) -> None:
    """Key -> repaint inside the app (repaint) and written to a pseudo-terminal (keys)."""
    default = {"sentence": SENTENCE}
    gpt2 = {"sentence": " ".join(f"w{i}" for i in range(128)), "embed_dim": 768,
            "num_heads": 12, "max_seq_len": 128}
    for label, cfg, limit, cold_limit in [("C=4 h=2 T=4", default, 12.0, 20.0),
                                          ("C=768 h=12 T=128", gpt2, 50.0, None)]:
        if not repaint:
            break
        warm = repaint_ms(cfg, warm=True)
        cold = repaint_ms(cfg, warm=False)
        rows.append(Row(f"key -> repaint, {label} (median)", f"{warm:.1f} ms", None,
                        f"<= {limit:.0f} ms", warm <= limit))
        rows.append(Row("  same, first visit, cache cold", f"{cold:.1f} ms", None,
                        "" if cold_limit is None else f"<= {cold_limit:.0f} ms",
                        None if cold_limit is None else cold <= cold_limit))
    if not keys:
        return
    # Key -> the repaint written to a pseudo-terminal, whole process, beside a bare Textual app.
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as bare:
        bare.write(BARE_APP)
    presses = 10 * max(2, n)
    ours_keys = statistics.median(keys_in_pty([*MHA, "explain", SENTENCE], presses, marks=True))
    bare_keys = statistics.median(keys_in_pty([PYTHON, bare.name], presses, marks=False))
    os.unlink(bare.name)
    rows.append(Row("key -> repaint written to the terminal (pty, median)",
                    f"{ours_keys * 1000:.1f} ms", None, "<= 25 ms", ours_keys <= 0.025))
    rows.append(Row("  same, a bare Textual app", f"{bare_keys * 1000:.1f} ms", None, "", None))


def _overhead(n: int, *, cpu: bool) -> list[dict]:
    """benchmarks/trace_overhead.py in a process of its own: wall clock with torch's and
    NumPy's default threads, or CPU time with one thread each (steadier on a loaded machine)."""
    env = {**os.environ}
    argv = [PYTHON, str(Path(__file__).with_name("trace_overhead.py")), "--runs", str(n)]
    if cpu:
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        argv += ["--clock", "cpu"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout)


def _big_class_row(folder: Path, floor: float) -> Row:
    """Once: 300 generated submissions graded end to end, every one in the CSV."""
    make_class(folder, BIG_CLASS, mixed=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        csv_out = Path(tmp) / "grades.csv"
        argv = [*LAUNCH, str(result), "sh", "-c", 'exec "$@" > "$0"', str(csv_out),
                *grade_argv(folder)]
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = _launched(result)
        rows = csv_out.read_text(encoding="utf-8").splitlines()[1:]
    if len(rows) != BIG_CLASS:
        raise SystemExit(f"bench: grading {BIG_CLASS} submissions gave {len(rows)} rows")
    seconds = done["seconds"]
    return Row(f"check: {BIG_CLASS} generated submissions (every mistake in turn), end to end, "
               f"{seconds:.0f} s", f"{seconds / BIG_CLASS:.3f} s", seconds / BIG_CLASS / floor,
               "", None)


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
    return done.stdout.strip() if done.returncode == 0 else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS,
                        help=f"rounds of every command (default {RUNS}: about 5 minutes on "
                             "the 2-core development machine when it is quiet)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    parser.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md",
                        help="the manual's page whose Performance table is replaced (default: "
                             "the repository's docs/performance.md)")
    parser.add_argument("--no-page", action="store_true", help="print the table only")
    parser.add_argument("--only", metavar="NAME,...", default=None,
                        help="run only these rows beside the floor (whole processes: version, "
                             "help, completion, grade, dump, raschka, module, numpy, full, "
                             "json_gpt2, "
                             "hf, hf_refuse; the app: " + ", ".join(APP_ROWS) + "; hf_shapes: "
                             "the 1B, 3B and 8B Llama shapes; hf_70b: a layer of the 70B "
                             "shape streamed, about 11 minutes, never in the default run) "
                             "and print "
                             "their table; the page is left as it is")
    args = parser.parse_args()
    only = None if args.only is None else set(args.only.split(","))
    if only is not None:
        args.no_page = True
    n = args.runs
    started = time.time()
    # mha-tui's modules from bytecode, as after `pip install` (which compiles them) or a first
    # run: with PYTHONDONTWRITEBYTECODE set (as on the development machine) an editable
    # install compiles every module from source again in every measured process, while the
    # floor's torch is read from its .pyc files.
    subprocess.run([PYTHON, "-m", "compileall", "-q", str(ROOT / "mha_tui")], check=True)
    load_before = os.getloadavg()

    # Round-robin: every round runs the floor and each command once, so that a noisy
    # moment on the machine hits them alike; medians over the rounds.
    classes = tempfile.TemporaryDirectory(prefix="mha-tui-bench-class-")
    small_class = make_class(Path(classes.name) / "twenty", CLASS_SIZE, mixed=False)
    commands: dict[str, tuple[list[str], dict[str, str] | None, int]] = {
        "floor": ([PYTHON, "-c", "import torch"], None, 0),
        "grade": (grade_argv(small_class), None, 0),
        "version": ([*MHA, "--version"], None, 0),
        "help": ([*MHA, "--help"], None, 0),
        "completion": ([*MHA], {"_MHA_TUI_COMPLETE": "complete_bash",
                               "COMP_WORDS": "mha-tui expl", "COMP_CWORD": "1"}, 0),
        "dump": ([*MHA, "explain", SENTENCE, "--dump", "-"], None, 0),
        "raschka": ([*MHA, "explain", SENTENCE, "--model", "raschka", "--dump", "-"], None, 0),
        "module": ([*MHA, "explain", SENTENCE, "--module", f"{LEARNER}:CausalSelfAttention",
                    "--dump", "-"], None, 0),
        # The NumPy blueprint: no torch on this path at all.
        "numpy": ([*MHA, "explain", SENTENCE, "--model", "blueprint", "--dump", "-"], None, 0),
        # GPT-2 small's sizes, every number: 2.4 M values in column blocks, ~25 MB of text.
        "full": ([*MHA, "explain", SENTENCE, "--embed-dim", "768", "--heads", "12", "--full",
                  "--dump", "-"], None, 0),
        # ... and with 512 tokens as JSON: 21.5 M values, 227 MB, streamed into a file.
        "json_gpt2": ([*MHA, "explain", GPT2_512, "--embed-dim", "768", "--heads", "12",
                       "--max-seq-len", "512", "--format", "json", "--dump", JSON_OUT], None, 0),
    }
    # --hf, offline, when the [hf] extra is there: the tests' tiny GPT-2 (3 layers, C 16), and
    # a GPT-2 with GPT-2 small's shapes (random weights, benchmarks/hf_rows.py).
    hf_dir = tempfile.TemporaryDirectory(prefix="mha-tui-bench-")
    tiny = tiny_hf_model(Path(hf_dir.name) / "tiny")
    big: Path | None = None
    sentences: dict[str, str] = {}
    if tiny is not None:
        commands["hf"] = ([*MHA, "explain", HF_SENTENCE, "--hf", str(tiny), "--dump", "-"],
                          None, 0)
        big = Path(hf_dir.name) / "gpt2-small-shapes"
        built = subprocess.run([PYTHON, str(HF_ROWS), "build", str(big)], capture_output=True,
                               text=True, check=True)
        sentences = json.loads(built.stdout)
        # More tokens than the model's 1,024 positions: refused before any weight loads.
        commands["hf_refuse"] = ([*MHA, "explain", sentences["too_long"], "--hf", str(big),
                                  "--dump", "-"], None, 2)
    if only is not None:
        unknown = only - set(commands) - set(APP_ROWS)
        if unknown:
            raise SystemExit(f"bench: --only: no such row {', '.join(sorted(unknown))}")
        commands = {name: command for name, command in commands.items()
                    if name in only or name == "floor"}
    samples: dict[str, list[Run]] = {name: [] for name in commands}
    apps: list[tuple[float, float, int]] = []
    numpy_apps: list[tuple[float, float, int]] = []
    big_apps: list[tuple[float, float, int]] = []
    for _ in range(n):
        for name, (argv, env, expect) in commands.items():
            samples[name].append(run_process(argv, env, expect))
        if only is None or "app" in only:
            apps.append(app_in_pty())
        if only is None or "app_big" in only:
            big_apps.append(app_in_pty(*BIG, sentence=BIG_SENTENCE))
        if only is None or "app_numpy" in only:
            numpy_apps.append(app_in_pty("--model", "blueprint"))
    result = {name: Run(statistics.median(r.seconds for r in runs),
                        int(statistics.median(r.max_rss_kib for r in runs)))
              for name, runs in samples.items()}
    floor = result["floor"]
    f = floor.seconds
    rows: list[Row] = [Row('python -c "import torch" (the floor)', f"{f:.3f} s", 1.0, "", None),
                       Row("peak memory, the floor", f"{floor.max_rss_kib / 1024:.0f} MiB", None,
                           "", None)]
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
        if name in result:
            rows.append(_ratio_row(what, result[name].seconds, f, limit))
    if "grade" in result:
        rows.append(_ratio_row(f"check: a class of {CLASS_SIZE} correct submissions, each "
                               "sandboxed (per submission)", result["grade"].seconds / CLASS_SIZE,
                               f, 0.25))
    if only is None or "grade300" in only:
        rows.append(_big_class_row(Path(classes.name) / "three-hundred", f))
    if "hf" in result:
        rows.append(_ratio_row(f'explain "{HF_SENTENCE}" --hf (tiny GPT-2) --dump -',
                               result["hf"].seconds, f, None))
    if "hf_refuse" in result:
        rows.append(_ratio_row("--hf, 1,100 tokens for 1,024 positions: refused",
                               result["hf_refuse"].seconds, f, 0.30))
    if only is not None:
        for name in sorted(only & set(result)):
            rows.append(Row(f"peak memory, {name}", f"{result[name].max_rss_kib / 1024:.0f} MiB",
                            None, "", None))
        _app_rows(rows, f, apps, big_apps, numpy_apps)
        if apps:
            rows.append(Row("peak memory, app",
                            f"{statistics.median(a[2] for a in apps) / 1024:.0f} MiB", None, "",
                            None))
        _key_rows(rows, n, "repaint" in only, "keys" in only)
        if "hf_shapes" in only and tiny is not None:
            _shape_rows(rows)
        if "hf_70b" in only:
            _row_70b(rows)
        hf_dir.cleanup()
        classes.cleanup()
        return _report(rows, started, load_before, n, args)

    _app_rows(rows, f, apps, big_apps, numpy_apps)
    app_rss = int(statistics.median(a[2] for a in apps))

    # Tracing overhead at GPT-2 small's sizes, in one process: ratios over the plain forward,
    # by the wall clock (default threads) and in CPU time (one thread).
    wall, cpu = _overhead(n, cpu=False), _overhead(n, cpu=True)
    for w, c, limit in zip(wall, cpu, (8.0, 4.0), strict=True):
        for size, clock in ((w, "wall clock, default threads"), (c, "CPU time, 1 thread")):
            ours = size["mha_tui"] / size["plain"]
            theirs = None if size["torchlens"] is None else size["torchlens"] / size["plain"]
            rows.append(Row(f"mha_tui.trace over a plain forward, C=768 h=12 T={size['tokens']}"
                            f" ({clock})",
                            f"{ours:.1f} x the forward's {size['plain'] * 1000:.1f} ms", None,
                            f"<= {limit:.0f} x, < TorchLens",
                            ours <= limit and (theirs is None or ours < theirs)))
            rows.append(Row("  same, TorchLens's trace", "not installed (.[bench])"
                            if theirs is None else f"{theirs:.1f} x", None, "", None))

    _key_rows(rows, n, True, True)

    for what, rss, limit in [("peak memory, dump", result["dump"].max_rss_kib, 60),
                             ("peak memory, app", app_rss, 60),
                             ("peak memory, JSON C=768 h=12 T=512",
                              result["json_gpt2"].max_rss_kib, 250)]:
        extra = (rss - floor.max_rss_kib) / 1024
        rows.append(Row(what, f"{rss / 1024:.0f} MiB", None, f"<= floor + {limit} MiB",
                        extra <= limit))
    if big is not None:
        # Once each (memory varies little): mha-tui on 1,000 tokens, and the model's own
        # forward with every layer's attention weights returned.
        ours_hf = run_process([*MHA, "explain", sentences["fits"], "--hf", str(big), "--dump",
                               JSON_OUT])
        own = run_process([PYTHON, str(HF_ROWS), "forward", str(big)])
        rows.append(Row("peak memory, --hf GPT-2 small's shapes, 1,000 tokens",
                        f"{ours_hf.max_rss_kib / 1024:.0f} MiB", None,
                        f"<= {own.max_rss_kib / 1024:.0f} + 300 MiB (its own forward with "
                        "output_attentions)", ours_hf.max_rss_kib <= own.max_rss_kib + 300 * 1024))
        _shape_rows(rows)
    hf_dir.cleanup()
    classes.cleanup()
    Path(JSON_OUT).unlink(missing_ok=True)
    return _report(rows, started, load_before, n, args)


def _mib(run: Run) -> str:
    return f"{run.max_rss_kib / 1024:.0f} MiB"


def _shape_rows(rows: list[Row]) -> None:
    """Llama-3.2-1B, -3B and Llama-3-8B shapes in bf16 (benchmarks/hf_shapes.py), once each:
    mha-tui streamed (the default), loaded whole (--no-stream), and transformers' own bf16
    forward with output_attentions, on the same 12 tokens."""
    for name, layer, whole in SHAPE_ROWS:
        directory = SHAPES_CACHE / name
        subprocess.run([PYTHON, str(HF_SHAPES), "build", name, str(directory)], check=True)
        sentence = subprocess.run([PYTHON, str(HF_SHAPES), "sentence", str(directory)],
                                  capture_output=True, text=True, check=True).stdout.strip()
        explain = [*MHA, "explain", sentence, "--hf", str(directory), "--layer", str(layer),
                   "--dump", JSON_OUT]
        streamed = run_process(explain)
        what = f"--hf {name} shapes (bf16 file), layer {layer}, 12 tokens"
        if not whole:
            rows.append(Row(f"{what}: streamed", f"{_mib(streamed)}, {streamed.seconds:.1f} s",
                            None, "<= 4 GiB", streamed.max_rss_kib <= 4 * 2**20))
            continue
        own = run_process([PYTHON, str(HF_SHAPES), "forward", str(directory)])
        rows.append(Row(f"{what}: peak memory streamed", _mib(streamed), None,
                        f"<= transformers' bf16 forward ({_mib(own)})",
                        streamed.max_rss_kib <= own.max_rss_kib))
        rows.append(Row("  same, time streamed", f"{streamed.seconds:.1f} s", None,
                        f"<= 1.5 x transformers' {own.seconds:.1f} s",
                        streamed.seconds <= 1.5 * own.seconds))
        # Loaded whole: refused (exit 2) where the estimate says it cannot fit.
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "result.json"
            subprocess.run([*LAUNCH, str(result), *explain, "--no-stream"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            done = _launched(result)
        rows.append(Row("  same, --no-stream (every weight loaded)",
                        f"{done['max_rss_kib'] / 1024:.0f} MiB, {done['seconds']:.1f} s"
                        if done["code"] == 0 else f"refused before loading (exit {done['code']})",
                        None, "", None))
        rows.append(Row("  same, transformers' bf16 forward, output_attentions",
                        f"{_mib(own)}, {own.seconds:.1f} s", None, "", None))


def _row_70b(rows: list[Row]) -> None:
    """Llama-3-70B's shapes (benchmarks/hf_shapes.py: all zero, 30 sparse shards of 5 GB, no
    disk), layer 40 streamed on 12 tokens, once (about 11 minutes on 2 cores: `--only hf_70b`
    only): its peak against the memory estimate `--hf` checks before loading."""
    name, layer = "llama-3-70b", 40
    directory = SHAPES_CACHE / name
    subprocess.run([PYTHON, str(HF_SHAPES), "build", name, str(directory)], check=True)
    sentence = subprocess.run([PYTHON, str(HF_SHAPES), "sentence", str(directory)],
                              capture_output=True, text=True, check=True).stdout.strip()
    estimate = int(subprocess.run(
        [PYTHON, "-c", "import sys; from mha_tui import budget; from mha_tui.load.hf_files "
         "import exact_tokens, run_shape; d, s = sys.argv[1], sys.argv[2]; print(budget."
         "hf_streamed_bytes(run_shape(d, exact_tokens(d, s), s, None), int(sys.argv[3])))",
         str(directory), sentence, str(layer)],
        capture_output=True, text=True, check=True).stdout)
    with tempfile.TemporaryDirectory() as tmp:  # text: a JSON of this layer is about 2 GB
        streamed = run_process([*MHA, "explain", sentence, "--hf", str(directory), "--layer",
                                str(layer), "--dump", str(Path(tmp) / "70b.txt")])
    rows.append(Row(f"--hf {name} shapes (sparse bf16 shards), layer {layer}, 12 tokens: "
                    "streamed", f"{_mib(streamed)}, {streamed.seconds:.1f} s", None,
                    f"<= its estimate ({estimate / 2**20:.0f} MiB)",
                    streamed.max_rss_kib * 1024 <= estimate))


def _report(rows: list[Row], started: float, load_before: tuple[float, float, float], n: int,
            args: argparse.Namespace) -> int:
    """Print the table (and write it into docs/performance.md unless told not to)."""
    load_after = os.getloadavg()
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    header = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, commit {commit}; "
              f"{n} runs each, medians; {os.cpu_count()} cores, Python {sys.version.split()[0]}; "
              f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
              f"({(time.time() - started) / 60:.0f} min)")
    table = ["| measure | value | x floor | target | met |", "| --- | ---: | ---: | --- | --- |"]
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}"
        met = {True: "yes", False: "**no**", None: ""}[row.ok]
        table.append(f"| {row.what} | {row.value} | {ratio} | {row.target} | {met} |")
    missed = [row.what.strip() for row in rows if row.ok is False]
    print(f"mha-tui benchmark: {header}\n")
    print("\n".join(table))
    if missed:
        print(f"\nmissed: {'; '.join(missed)}")
    if not args.no_page:
        from readme import write_performance

        write_performance(args.page, header, table, missed)
        print(f"\nwrote the table into {args.page}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
