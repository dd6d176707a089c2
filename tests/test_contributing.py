"""CONTRIBUTING.md's map of the house is pyproject's import-linter `layers` contract: the
same layers, in the same order, each with the same packages; and the files it names exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from .conftest import ROOT

CONTRIBUTING = Path(ROOT, "CONTRIBUTING.md")


def _contract_layers() -> list[str]:
    """The layers contract, top first, each as CONTRIBUTING writes it: `app` | `notebook`."""
    config = tomllib.loads(Path(ROOT, "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [re.sub(r"mha_tui\.(\w+)", r"`\1`", layer).replace("|", "\\|") for layer in layers]


def _map_layers() -> list[str]:
    text = CONTRIBUTING.read_text(encoding="utf-8")
    table = text.split("## The map of the house", 1)[1].split("\n\n| layer |", 1)[1]
    rows = [line for line in table.split("\n\n", 1)[0].splitlines()[2:]]
    return [row.split(" | ", 1)[0].removeprefix("| ") for row in rows]


def test_the_map_is_the_layers_contract() -> None:
    assert _map_layers() == _contract_layers()


def test_the_files_and_folders_contributing_names_exist() -> None:
    text = CONTRIBUTING.read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:mha_tui|tests|docs|benchmarks)/[\w/.]*|[\w.]+\.(?:toml|txt|md))`", text))
    named |= set(re.findall(r"\]\(([\w/.]+)\)", text))
    assert len(named) >= 5
    assert sorted(n for n in named if not Path(ROOT, n).exists()) == []
