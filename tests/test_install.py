"""mha-tui installs into a learner's existing environment without replacing its torch.

pyproject.toml asks for a torch range; this project's own set-up pins the CPU build in
constraints.txt, which the Makefile hands to pip. The wheel carries the tutorials' modules.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT

PROJECT = Path(ROOT)


def _dependencies() -> dict[str, str]:
    deps = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0]: d for d in deps}


def test_torch_is_a_range_and_the_exact_pin_lives_in_the_constraints_file() -> None:
    deps = _dependencies()
    assert "==" not in deps["torch"] and ">=" in deps["torch"], deps["torch"]
    assert "safetensors" in deps
    pins = _pins()
    assert pins["torch"] == "2.13.0"
    install = [line for line in (PROJECT / "Makefile").read_text().splitlines()
               if "pip install" in line and "-e" in line]
    assert install and all(re.search(r"-c \S*constraints.txt", line) for line in install)


def _pins() -> dict[str, str]:
    lines = (PROJECT / "constraints.txt").read_text().splitlines()
    return {_canonical(name): version for name, version in
            (line.split("==") for line in lines if "==" in line and not line.startswith("#"))}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_package_of_the_set_up_is_pinned_to_what_is_installed() -> None:
    """The same commit installs the same set next month: every distribution in this
    environment (but mha-tui itself) has its exact version in constraints.txt. A package the
    set-up gains without a pin, or a pin that no longer matches, fails here (`make pins`)."""
    from importlib.metadata import distributions

    pins = _pins()
    installed = {_canonical(d.metadata["Name"]): d.version for d in distributions()}
    installed = {name: version.split("+")[0] for name, version in installed.items()
                 if name not in {"mha-tui", "pip", "setuptools", "wheel"}}
    # make bench adds TorchLens and what it needs on top of the pinned set.
    extra = {name for name in installed if name not in pins} - _needed_by("torchlens")
    assert extra == set()
    wrong = {name: (pins[name], version) for name, version in installed.items()
             if name in pins and pins[name] != version}
    assert wrong == {}


def _needed_by(root: str) -> set[str]:
    """root and every distribution its requirements reach, where installed."""
    from importlib.metadata import PackageNotFoundError, requires

    seen: set[str] = set()
    todo = [root]
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        try:
            needs = requires(name) or []
        except PackageNotFoundError:
            continue
        seen.add(name)
        todo += [re.split(r"[<>=!~ \[;(]", need, maxsplit=1)[0] for need in needs if "extra ==" not in need]
    return seen


def test_no_dependency_of_the_package_is_pinned_exactly() -> None:
    """A learner's environment with another Textual (or torch, rich, ...) can install
    mha-tui; the exact versions this project tests with live in constraints.txt."""
    deps = _dependencies()
    assert [d for d in deps.values() if "==" in d] == []
    assert ">=" in deps["textual"] and "<" in deps["textual"], deps["textual"]


def test_the_snapshot_tests_run_on_the_pinned_textual() -> None:
    from importlib.metadata import version

    pins = dict(line.split("==") for line in (PROJECT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert version("textual") == pins["textual"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources (the build leaves nothing in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(PROJECT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "tests", "screenshots", "benchmarks"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", str(src), "-w", str(tmp / "dist")], check=True, capture_output=True)
    (built,) = (tmp / "dist").glob("mha_tui-*.whl")
    return built


def test_the_wheel_carries_the_examples_and_the_app_style(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("course", "raschka", "many_eyes"):
        assert f"mha_tui/examples/{name}.py" in names
    assert {"mha_tui/load/modules.py", "mha_tui/app/app.tcss", "mha_tui/web/app_index.html"} <= names


def test_installing_into_an_environment_with_torch_installs_only_mha_tui(wheel: Path,
                                                                         tmp_path: Path) -> None:
    """pip, offline, into this environment (torch 2.13.0 already there): the plan is to
    install mha-tui and nothing else; torch stays."""
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet",
                    "--report", str(report), str(wheel)], check=True, capture_output=True)
    planned = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert planned == ["mha-tui"]
