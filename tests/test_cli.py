"""The command line: help and version without torch, one-line refusals, both entry points."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mha_tui import __version__
from mha_tui.cli import app

from .conftest import ROOT, run_cli


def test_version_and_help_with_typer_runner() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"mha-tui {__version__}\n"
    result = runner.invoke(app, ["explain", "--help"])
    assert result.exit_code == 0
    for flag in ("--heads", "--embed-dim", "--seed", "--no-causal", "--max-seq-len", "--dump",
                 "--format", "--width", "--full", "--color", "--ascii", "--stage"):
        assert flag in result.output
    assert "\x1b[" not in result.output


def test_usage_names_the_sentence_in_capitals() -> None:
    """`mha-tui explain [OPTIONS] SENTENCE`, as the README writes it (was `{sentence}`)."""
    result = CliRunner().invoke(app, ["explain", "--help"])
    assert "Usage: mha-tui explain [OPTIONS] SENTENCE\n" in result.output
    assert "{" not in result.output.splitlines()[0]
    missing = run_cli("explain")
    assert missing.returncode == 2
    assert missing.stderr == b"mha-tui: error: Missing argument 'SENTENCE'.\n"


@pytest.mark.parametrize("command,named", [
    (["explain", "I love AI !", "--dump", "-", "--module"], "--module"), (["check"], "check")])
def test_a_module_spec_that_is_not_python_says_to_give_a_py_file(command: list[str],
                                                                 named: str) -> None:
    """`--module README.md:X` said "no module named 'README.md'"; check names its own
    argument (it has no --module)."""
    result = run_cli(*command, "README.md:X")
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode() == (
        f"mha-tui: error: {named} takes FILE.py:Class or package.module:Class; 'README.md' is "
        "a file but not Python source: give a .py file (FILE.py:Class) or an importable "
        "package.module\n")


def test_no_arguments_prints_help() -> None:
    result = run_cli()
    assert result.returncode == 0 and result.stderr == b""
    assert b"explain" in result.stdout and b"Usage" in result.stdout


def test_python_dash_m_and_console_script_agree() -> None:
    module = run_cli("--version")
    assert module.returncode == 0 and module.stdout.decode() == f"mha-tui {__version__}\n"
    script = Path(sys.executable).parent / "mha-tui"
    if script.exists():
        assert subprocess.run([str(script), "--version"], capture_output=True).stdout == module.stdout


def _modules_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    return set(out.stdout.split())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["explain", "--help"],
                                  ["explain", "I love AI !", "--heads", "3", "--seed", "1"]])
def test_help_version_and_refusals_import_neither_torch_nor_textual(argv: list[str]) -> None:
    """Nor pydantic: Typer 0.29 coerces every option through it (0.3 s on every command)."""
    code = (f"sys.argv = ['mha-tui', *{argv!r}]\nfrom mha_tui.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    loaded = _modules_after(code)
    assert "mha_tui.cli" in loaded
    assert "torch" not in loaded and "textual" not in loaded and "pydantic" not in loaded


def test_transcript_path_never_imports_textual() -> None:
    code = ("from mha_tui.config import Config\nfrom mha_tui.pipeline import run_trace\n"
            "from mha_tui.write.dump import to_text, to_json\n"
            "from mha_tui.render.options import RenderOptions\n"
            "t = run_trace(Config('I love AI !'))\nto_text(t, RenderOptions()); to_json(t)")
    loaded = _modules_after(code)
    assert "torch" in loaded and "rich" in loaded
    assert "textual" not in loaded and "typer" not in loaded


def test_not_a_terminal_prints_the_transcript() -> None:
    result = run_cli("explain", "I love AI !")
    assert result.returncode == 0 and result.stderr == b""
    assert result.stdout == (Path(ROOT) / "tests/golden/default.txt").read_bytes()


BAD = [
    (["explain", "I love AI !", "--heads", "3"], "valid head counts for 4: 1, 2, 4"),
    (["explain", "", "--heads", "2"], "the sentence is empty"),
    (["explain", "   \t  "], "the sentence is empty"),
    (["explain", "a b c d e", "--max-seq-len", "4"], "has 5 tokens but --max-seq-len is 4"),
    (["explain", "a", "--heads", "0"], "--heads must be a positive whole number, got 0"),
    (["explain", "a", "--heads", "-2"], "--heads must be a positive whole number, got -2"),
    (["explain", "a", "--embed-dim", "0"], "--embed-dim must be a positive whole number"),
    (["explain", "a", "--embed-dim", "100000"], "above this tool's ceiling of 4096"),
    (["explain", "a", "--max-seq-len", "0"], "--max-seq-len must be a positive whole number"),
    (["explain", "a", "--max-seq-len", "99999"], "above this tool's ceiling of 4096"),
    (["explain", "a", "--heads", "8", "--embed-dim", "4"], "valid head counts for 4: 1, 2, 4"),
    (["explain", "a", "--seed", "-1"], "--seed must be between 0 and"),
    (["explain", "a", "--heads", "two"], "Invalid value for '--heads'"),
    (["explain", "a", "--format", "xml"], "'xml' is not one of"),
    (["explain", "a", "--stage", "nope"], "choose one of: embed, project, view, transpose"),
    (["explain", "a", "--width", "5"], "--width must be between 40 and 400"),
    (["explain", "a", "--bogus"], "No such option: --bogus"),
    (["explain"], "Missing argument 'SENTENCE'"),
    (["explain", "a", "--dump", "/"], "is a folder"),
    (["explain", "a", "--dump", "/tmp/" + "x" * 300], "File name too long"),
    (["explain", "a", "--dump", "/nonexistent-dir/"], "names a folder"),
    (["explain", " ".join(["w"] * 4097), "--max-seq-len", "4096"],
     "4097 tokens, above this tool's ceiling of 4096 (--max-seq-len 4096 at most)"),
    (["explain", " ".join(["w"] * 2048), "--embed-dim", "4096", "--heads", "4096",
      "--max-seq-len", "2048"], "needs about 448.9 GiB of memory for its tensors"),
    (["explain", "a", "--dump", "/nonexistent-dir/x.txt"], "does not exist"),
    (["explain", "a", "--dump", "/proc/version"], "not writable"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a[1:])[:60] or "none" for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(argv: list[str], message: str) -> None:
    result = run_cli(*argv)
    err = result.stderr.decode("utf-8")
    assert result.returncode == 2, err
    assert message in err
    assert err.count("\n") == 1 and err.startswith("mha-tui: error: ")
    assert "Traceback" not in err and result.stdout == b""


def test_the_app_paints_without_torch_or_numpy_loaded() -> None:
    """Everything the first frame needs is importable without torch (and NumPy)."""
    loaded = _modules_after("import mha_tui.cli, mha_tui.app.run")
    assert "textual" in loaded
    assert "torch" not in loaded and "numpy" not in loaded and "pygments" not in loaded


def test_max_seq_len_hint_never_exceeds_the_ceiling() -> None:
    result = run_cli("explain", " ".join(["w"] * 5000))
    err = result.stderr.decode()
    assert result.returncode == 2 and "4096" in err and "5000" in err
    assert "--max-seq-len 5000" not in err


def _run_with_stdout(stdout, preexec=None) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    return subprocess.run([sys.executable, "-m", "mha_tui", "explain", "I love AI !", "--dump",
                           "-"], stdout=stdout, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                          timeout=120, preexec_fn=preexec)


def test_dump_to_a_closed_stdout_is_one_line() -> None:
    result = _run_with_stdout(subprocess.DEVNULL, preexec=lambda: os.close(1))
    assert result.returncode == 2
    assert result.stderr == (b"mha-tui: error: --dump -: standard output is closed; "
                             b"give --dump PATH to write the transcript to a file\n")


def test_dump_to_a_full_disk_is_one_line() -> None:
    with open("/dev/full", "wb") as full:  # only written to, like `> /dev/full`
        result = _run_with_stdout(full)
    assert result.returncode == 1
    assert result.stderr == (b"mha-tui: error: could not write the transcript to standard "
                             b"output: No space left on device\n")


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried "
    "to allocate 4294967296 bytes.")])
def test_running_out_of_memory_is_one_line_exit_1(monkeypatch, capsys, error) -> None:
    import mha_tui.pipeline
    from mha_tui import cli

    def exhausted(config, source=None, *, loaded=None):  # run_trace's signature
        raise error

    monkeypatch.setattr(mha_tui.pipeline, "run_trace", exhausted)
    monkeypatch.setattr(sys, "argv", ["mha-tui", "explain", "I love AI !", "--dump", "-"])
    with pytest.raises(SystemExit) as stop:
        cli.main()
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("mha-tui: error: ran out of memory for 4 tokens") and err.count("\n") == 1


def test_memory_estimate_reads_meminfo_and_says_both_figures(tmp_path: Path) -> None:
    from mha_tui import budget
    from mha_tui.config import Config

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000000 kB\nMemAvailable:     512000 kB\n")
    available = budget.available_memory(str(meminfo), cgroup=str(tmp_path))
    assert available == budget.Available(512000 * 1024, "MemAvailable in /proc/meminfo")
    config = Config(" ".join(f"w{i}" for i in range(512)), embed_dim=768, num_heads=12,
                    max_seq_len=512)
    assert budget.trace_elements(config) == 21_496_320  # what the JSON of this size holds
    problem = budget.memory_problem(config, available)
    assert problem is not None and "needs about" in problem and "500.0 MiB is available" in problem
    assert budget.memory_problem(config, budget.Available(8 << 30, "x")) is None
    tiny = Config("I love AI !")  # a tight machine is not a reason to refuse a tiny run
    assert budget.memory_problem(tiny, budget.Available(1 << 20, "x")) is None
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("973741824\n")
    capped = budget.available_memory(str(meminfo), cgroup=str(tmp_path))
    assert capped == budget.Available(100_000_000, "the cgroup's memory.max")
    assert budget.available_memory(str(tmp_path / "absent"), cgroup=str(tmp_path / "x")) is not None


@pytest.mark.parametrize(("words", "C", "h"), [(5, 8, 2), (12, 16, 4), (7, 6, 3)])
def test_element_estimate_counts_what_the_trace_records(words: int, C: int, h: int) -> None:
    from mha_tui import budget
    from mha_tui.config import Config
    from mha_tui.pipeline import run_trace

    config = Config(" ".join(f"t{i % 4}" for i in range(words)), embed_dim=C, num_heads=h)
    trace = run_trace(config)
    recorded = sum(r.values.size for s in trace.stages for r in (*s.tensors, *s.aside))
    assert budget.trace_elements(config) == recorded


def test_an_address_space_limit_too_small_is_refused_before_the_run(tmp_path: Path) -> None:
    """`ulimit -v` a little above what the imports map: the estimate sees that the tensors
    cannot fit and refuses up front (a failed allocation inside BLAS would end the process
    from C, with no chance of a clean message)."""
    import resource

    probe = subprocess.run(
        [sys.executable, "-c", "import torch, numpy, rich, mha_tui.tracing, mha_tui.write.dump\n"
         "print(open('/proc/self/status').read().split('VmSize:')[1].split()[0])"],
        capture_output=True, text=True, cwd=ROOT, check=True)
    limit = (int(probe.stdout) << 10) + (350 << 20)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    target = tmp_path / "t.json"
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    argv = [sys.executable, "-m", "mha_tui", "explain", " ".join(f"w{i}" for i in range(1024)),
            "--embed-dim", "768", "--heads", "12", "--max-seq-len", "1024", "--format", "json",
            "--dump", str(target)]
    result = subprocess.run(argv, capture_output=True, env=env, cwd=ROOT, timeout=300,
                            preexec_fn=cap)
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "needs about" in err and "ulimit -v" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_finished_run_called_in_process_returns_to_its_caller(tmp_path: Path) -> None:
    """The command skips torch's teardown with os._exit, but only as the command itself: a
    finished `explain --dump` or `check` run through Typer's CliRunner (a test, a notebook)
    returns its exit code, and the caller goes on. Run in a child, since the old behaviour
    ended the calling process with status 0 (a pytest run would stop silently, green)."""
    out = tmp_path / "t.json"
    script = (
        "from typer.testing import CliRunner\n"
        "from mha_tui.cli import app\n"
        f"for args in (['explain', 'I love AI !', '--dump', {str(out)!r}, '--format', 'json'],\n"
        f"             ['explain', 'I love AI !', '--quiz', '--dump', {str(out)!r} + '.txt'],\n"
        "             ['check', '--model', 'mygpt', '--format', 'csv']):\n"
        "    print('returned', CliRunner().invoke(app, args).exit_code, flush=True)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=ROOT,
                            timeout=300, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("returned 0") == 3, result.stdout + result.stderr
    assert out.read_text().startswith("{")


def test_dump_to_stdout_in_process_goes_to_the_callers_stdout() -> None:
    """Trial 15: `--dump -` through CliRunner (or into a notebook cell, or under
    redirect_stdout) writes into the sys.stdout the caller put in place, as print() does; it
    went to descriptor 1 directly, so `.stdout` was "" and the transcript landed in the
    terminal. Run in a child, whose own descriptor 1 must then stay free of the transcript."""
    script = (
        "import contextlib, io, json\n"
        "from typer.testing import CliRunner\n"
        "from mha_tui.cli import app\n"
        "text = CliRunner().invoke(app, ['explain', 'I love AI !', '--dump', '-'])\n"
        "data = CliRunner().invoke(app, ['explain', 'I love AI !', '--dump', '-', '--format', 'json'])\n"
        "redirected = io.StringIO()\n"
        "with contextlib.redirect_stdout(redirected):\n"
        "    app(['explain', 'I love AI !', '--quiz', '--dump', '-'], standalone_mode=False)\n"
        "print(json.dumps([text.exit_code, text.stdout, data.exit_code, data.stdout,\n"
        "                  redirected.getvalue()]))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=ROOT,
                            timeout=300, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1, result.stdout[:300]  # only the child's own line
    code, text, json_code, data, quiz = json.loads(result.stdout)
    assert code == 0 and text.startswith("sentence I love AI !") and "10/11 concat" in text
    assert json_code == 0 and json.loads(data)["stages"]
    assert quiz.startswith("mha-tui quiz:") and "Answer key" in quiz


def test_stage_takes_a_modules_own_stages(tmp_path: Path) -> None:
    """--stage/--only make a slide of any stage a module has (timm's qkv_split, an op stage),
    not only the eleven of plain attention; a name that is no stage of any kind is refused
    before the run."""
    timm = Path(ROOT) / "tests" / "fixtures" / "public" / "timm_attention.py"
    out = tmp_path / "slide.txt"
    result = CliRunner().invoke(app, ["explain", "I love AI !", "-C", "8", "--module",
                                      f"{timm}:Attention", "--no-causal", "--stage", "qkv_split",
                                      "--only", "--dump", str(out)])
    assert result.exit_code == 0, result.output
    headings = [line for line in out.read_text().splitlines() if re.match(r"\d+/\d+ ", line)]
    assert len(headings) == 1 and headings[0].startswith("3/9 qkv_split")
    result = CliRunner().invoke(app, ["explain", "I love AI !", "--stage", "bogus", "--dump", "-"])
    assert result.exit_code == 2
    assert "--stage 'bogus' is not a stage" in result.stderr


def test_the_help_of_hf_says_encoders_too() -> None:
    """--hf explains BERT, RoBERTa, DistilBERT and T5's encoder as well as causal LMs; its
    help must not say "causal LM" alone."""
    result = CliRunner().invoke(app, ["explain", "--help"], terminal_width=200)
    help_text = " ".join(result.output.split())
    assert "Hugging Face model (a causal LM, or an encoder such as BERT or T5)" in help_text
