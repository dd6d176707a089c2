"""Every `mha-tui ...` command that the README and the manual (docs/) show runs here.

The commands are read from the pages' fenced code blocks: each `mha-tui ...` line of a `sh`
block (`.venv/bin/mha-tui` and `python -m mha_tui` too; a trailing `# comment` is the shell's),
and each `$ mha-tui ...` line of a console block, whose following lines are the output the
page shows (and `$ echo $?` the exit code). They run as a reader types them, in a folder
holding the files they name (`my_attn.py`, `rope.py`, `submissions/`, `trained.pt`, a tiny
GPT-2 in a hub cache of its own ...), each made from the tests' fixtures below, never
downloaded. A shown output must be the output, byte for byte.

Each command runs in-process through Typer's CliRunner (torch is imported once; a command
shown on two pages runs once), except `serve`, which runs as a process until it says where
it listens, and grading a folder, which runs as a process started with the folder, so that
its 20 s wait for a forward that never returns overlaps the other commands. Stdout is not a
terminal, so a command that opens the app in a terminal (`explain` without `--dump`) prints
its text transcript instead, as it does in a pipe. What a command needs to run here that
the page does not say is in ADJUST, with the reason: the only place where a run differs
from the page.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from .conftest import ROOT, sigint_as_a_terminal_gives_it

PAGES = [Path(ROOT, "README.md"), *sorted(Path(ROOT, "docs").rglob("*.md"))]
FIXTURES = Path(ROOT, "tests", "fixtures")
MISTAKES = FIXTURES / "mistakes"
MECHANISMS = FIXTURES / "mechanisms"
PROGRAM = re.compile(r"^(?:\.venv/bin/)?mha-tui\s|^python -m mha_tui\s")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Shown:
    """One command as a page shows it, and what the page says it prints and returns."""

    page: str
    line: int
    command: str
    output: str | None = None  # a console block's lines after the command, when shown
    exit_code: int | None = None  # a console block's `$ echo $?`

    @property
    def argv(self) -> list[str]:
        words = shlex.split(self.command, comments=True)
        return words[3:] if words[:3] == ["python", "-m", "mha_tui"] else words[1:]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def shown_commands() -> list[Shown]:
    found: list[Shown] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(ROOT).as_posix()
        for block in FENCE.finditer(text):
            lang, body = block.groups()
            first = text.count("\n", 0, block.start(2)) + 1
            lines = body.splitlines()
            if lang == "sh":
                found += [Shown(name, first + i, line.strip()) for i, line in enumerate(lines)
                          if PROGRAM.match(line.strip())]
            elif lines and lines[0].startswith("$ "):
                found += _console(name, first, lines)
    return found


def _console(page: str, first: int, lines: list[str]) -> list[Shown]:
    """`$ command` lines, each with the lines up to the next `$`; `$ echo $?` and its one line
    give the previous command's exit code."""
    starts = [i for i, line in enumerate(lines) if line.startswith("$ ")] + [len(lines)]
    found: list[Shown] = []
    for start, end in pairwise(starts):
        command = lines[start][2:]
        if command == "echo $?":
            found[-1] = Shown(found[-1].page, found[-1].line, found[-1].command, found[-1].output,
                              int(lines[start + 1]))
        elif PROGRAM.match(command):
            found.append(Shown(page, first + start, command, "\n".join(lines[start + 1:end]) + "\n"))
    return found


SHOWN = shown_commands()

# What a command needs here that the page does not say: (extra arguments, {shown text: the
# text this run prints instead}), with why.
ADJUST: dict[str, tuple[list[str], dict[str, str]]] = {}


def _adjusted(shown: Shown) -> tuple[list[str], str | None]:
    argv, output = shown.argv, shown.output
    for prefix, (extra, replace) in ADJUST.items():
        if shlex.join(argv).startswith(prefix):
            argv = [*argv, *extra]
            for old, new in replace.items():
                output = None if output is None else output.replace(old, new)
    return argv, output


# ---------------------------------------------------------------- the reader's folder


def _class_source(path: Path, name: str, rename: str) -> str:
    source = path.read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)
    return "\n".join(source.splitlines()[node.lineno - 1:node.end_lineno]).replace(
        f"class {name}(", f"class {rename}(", 1)


def _submission(folder: Path, name: str, line: str) -> None:
    """correct.py with `line` at the top of its forward (as tests/test_grade.py makes them)."""
    first = "        B, T, C = x.shape\n"
    source = (MISTAKES / "correct.py").read_text()
    (folder / f"{name}.py").write_text(source.replace(first, f"{first}        {line}\n", 1))


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    output: str  # stdout and stderr
    exception: BaseException | None = None


RAN: dict[tuple[str, ...], Ran] = {}  # by argv: a command shown on two pages runs once
GRADING: dict[tuple[str, ...], subprocess.Popen[str]] = {}  # started with the reader's folder


def _grades_a_folder(argv: list[str]) -> bool:
    return argv[0] == "check" and argv[1].endswith("/")


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder a reader runs the pages' commands in, with every file they name."""
    import torch

    from .hf_models import hub_cache_layout, save_tiny_gpt2

    home = tmp_path_factory.mktemp("reader")
    # my_attn.py: the check page's module (scaled by 1/sqrt(C), its report shown line for
    # line), and a causal multi-head class with a qkv_bias (Raschka's) for --init.
    my_attn = (MISTAKES / "scale_sqrt_c.py").read_text()
    raschka = Path(ROOT, "mha_tui", "examples", "raschka.py")
    my_attn += "\n\n" + _class_source(raschka, "MultiHeadAttention", "CausalAttention") + "\n"
    (home / "my_attn.py").write_text(my_attn)
    namespace: dict[str, object] = {}
    exec(compile(my_attn, "my_attn.py", "exec"), namespace)
    torch.manual_seed(1)
    torch.save(namespace["MultiHeadAttention"](4, 2).state_dict(), home / "trained.pt")
    # other_attn.py: a reference with biases, which Raschka's out_proj bias needs.
    other = Path(ROOT, "mha_tui", "examples", "course.py").read_text()
    (home / "other_attn.py").write_text(other + "\n\nAttention = MultiHeadAttention\n")
    # The check page's mechanisms, each a public style from tests/fixtures/mechanisms.
    for name, fixture, cls in [("rope", "llama_rotary", "LlamaAttention"),
                               ("bloom", "alibi", "BloomAttention"),
                               ("local", "sliding_window", "SlidingWindowAttention"),
                               ("encoder", "timm_fused", "Attention")]:
        source = (MECHANISMS / f"{fixture}.py").read_text()
        if name == "local":  # the exercise's window, as `--window 4` says
            source = source.replace("window: int = 2", "window: int = 4")
        (home / f"{name}.py").write_text(f"{source}\n\nAttention = {cls}\n")
    # The NumPy page's learner class.
    numpy_attn = (FIXTURES / "numpy_attn.py").read_text()
    (home / "my_numpy_attn.py").write_text(numpy_attn + "\n\nMyAttention = NumpyAttention\n")
    # The grading page's class: one of each verdict.
    submissions = home / "submissions"
    submissions.mkdir()
    for name, mistake in [("ada", "softmax_axis"), ("bo", "correct"), ("cy", "single_view"),
                          ("dee", "mask_after_softmax")]:
        shutil.copy(MISTAKES / f"{mistake}.py", submissions / f"{name}.py")
    _submission(submissions, "eve", "import time; time.sleep(600)")  # waits out --timeout
    _submission(submissions, "fay", "import sys; sys.exit(0)")
    # The grading page's class graded with --context: a right cross-attention and one whose
    # keys come from the query sequence, each wrapping torch's nn.MultiheadAttention.
    cross = home / "cross_submissions"
    cross.mkdir()
    right = (FIXTURES / "two_sequences.py").read_text()
    (cross / "right.py").write_text(f"{right}\n\nAttention = DecoderCrossAttention\n")
    (cross / "keys_from_x.py").write_text(f"{right}\n\nAttention = MemoryKeysFromTgt\n")
    # The --hf page's encoder-decoder: a tiny Marian (tests/hf_families.py) in its place.
    from .hf_families import build

    build("marian", home / "opus-mt-en-fr")
    # --hf: a saved model, also laid out as GPT-2 (a tiny stand-in with its architecture, 6
    # layers) in a hub cache of the reader's own (HF_HUB_CACHE): mha-tui never downloads.
    save_tiny_gpt2(home / "my-saved-model", n_layer=6)
    hub_cache_layout(home / "hub", "openai-community/gpt2", home / "my-saved-model")
    # --dtype: a tiny Llama saved in bfloat16, as the checkpoints people download are.
    from .hf_families import build

    build("llama", home / "llama-bf16", dtype="bfloat16")
    env = {**os.environ, "HF_HUB_CACHE": str(home / "hub")}
    for argv in {tuple(shown.argv) for shown in SHOWN if _grades_a_folder(shown.argv)}:
        GRADING[argv] = subprocess.Popen([sys.executable, "-m", "mha_tui", *argv], cwd=home,
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True)
    yield home
    for process in GRADING.values():
        process.kill()
        process.wait()
    GRADING.clear()
    RAN.clear()


@pytest.fixture
def in_reader(reader: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(reader)
    monkeypatch.setenv("HF_HUB_CACHE", str(reader / "hub"))
    return reader


# Options that only the app shows (refused without a terminal): a command holding one, and
# no --dump, runs in a pseudo-terminal, waits for the app's values and quits with q.
IN_A_TERMINAL = {"--check": "marks the stages in the app's rail"}


def _in_a_terminal(argv: list[str]) -> bool:
    return argv[0] == "explain" and "--dump" not in argv and bool(IN_A_TERMINAL.keys() & set(argv))


# ---------------------------------------------------------------- the commands


def test_the_pages_show_commands_and_outputs() -> None:
    """The reader finds what the parser finds: the pages' commands, shown outputs among them."""
    assert len(SHOWN) >= 40
    assert {shown.page for shown in SHOWN} >= {"README.md", "docs/check.md", "docs/hf.md"}
    assert sum(shown.output is not None for shown in SHOWN) >= 2
    assert any(shown.exit_code == 3 for shown in SHOWN)


# Grading a folder last: its process, started with the folder, runs while the others do.
IN_PROCESS = sorted((s for s in SHOWN if s.argv[0] != "serve" and not _in_a_terminal(s.argv)),
                    key=lambda s: _grades_a_folder(s.argv))


@pytest.mark.parametrize("shown", IN_PROCESS, ids=str)
def test_a_shown_command_runs(shown: Shown, in_reader: Path) -> None:
    """The command runs as the page writes it: explain and --help exit 0, check gives a
    verdict (0, 1, or 3 for a folder holding submissions that cannot be judged), never a usage
    error or a traceback; where the page shows the output, it is the output."""
    argv, output = _adjusted(shown)
    result = _run(argv)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if shown.exit_code is not None:
        assert result.exit_code == shown.exit_code, result.output
    elif argv[0] == "check":
        allowed = {0, 1, 3} if Path(argv[1]).is_dir() else {0, 1}
        assert result.exit_code in allowed, result.output
    else:
        assert result.exit_code == 0, result.output
    if output is not None:
        assert result.stdout == output


def _run(argv: list[str]) -> Ran:
    key = tuple(argv)
    if key not in RAN:
        if key in GRADING:
            stdout, stderr = GRADING[key].communicate(timeout=300)
            RAN[key] = Ran(GRADING[key].returncode, stdout, stdout + stderr)
        else:
            from mha_tui.cli import app

            result = CliRunner().invoke(app, argv)
            RAN[key] = Ran(result.exit_code, result.stdout, result.output, result.exception)
    return RAN[key]


@pytest.mark.parametrize("shown", [s for s in SHOWN if _in_a_terminal(s.argv)], ids=str)
def test_a_shown_app_command_opens_the_app(shown: Shown, in_reader: Path) -> None:
    """The command opens the app in a terminal, shows the module's values, and q quits."""
    from .test_terminal import run_in_pty

    sentence = shown.argv[:2]
    assert sentence[0] == "explain"
    session = run_in_pty(*shown.argv[2:], sentence=sentence[1], cwd=in_reader,
                         env={"HF_HUB_CACHE": str(in_reader / "hub")})
    assert session.code == 0, session.output[-2000:]
    assert b"Traceback" not in session.output + session.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("shown", [s for s in SHOWN if s.argv[0] == "serve"], ids=str)
def test_a_shown_serve_command_listens(shown: Shown, in_reader: Path) -> None:
    """`serve` as the page writes it, on a free port of this machine (the page's 8000 may be
    taken; `--host 0.0.0.0` becomes 127.0.0.1: nothing here is served beyond this machine):
    it says where it serves, and Ctrl+C stops it."""
    argv = [*shown.argv, "--port", str(_free_port())]
    argv = ["127.0.0.1" if word == "0.0.0.0" else word for word in argv]
    env = {**os.environ, "HF_HUB_CACHE": str(in_reader / "hub")}
    server = subprocess.Popen([sys.executable, "-m", "mha_tui", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=in_reader,
                              preexec_fn=sigint_as_a_terminal_gives_it)
    try:
        line = server.stdout.readline() if server.stdout else ""
        assert f"serving the app on http://127.0.0.1:{argv[-1]}" in line, server.stderr
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
