"""The manual's Performance page (docs/performance.md) holds the prose `make bench` writes
(benchmarks/readme.py): an edit made in the page only would be overwritten by the next
bench run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .conftest import ROOT


def test_the_performance_page_prose_is_the_benchs_own() -> None:
    spec = importlib.util.spec_from_file_location("bench_readme", Path(ROOT) / "benchmarks" / "readme.py")
    assert spec is not None and spec.loader is not None
    readme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme)
    assert readme.PAGE == Path(ROOT) / "docs" / "performance.md"
    text = readme.PAGE.read_text(encoding="utf-8")
    section = text[text.index(readme.HEADING):]
    assert readme.INTRO in section, "docs/performance.md's intro differs from benchmarks/readme.py"
    assert readme.HOW in section, "the page's 'how these are reached' differs from benchmarks/readme.py"


def test_the_files_the_performance_page_names_exist() -> None:
    """A file named in the prose (`ops/numeric.py`) is mha-tui's (or the repository's, with its
    folder): a move leaves no stale name behind."""
    import re

    text = (Path(ROOT) / "docs" / "performance.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/]+\.py)`", text))
    assert len(named) >= 8
    missing = [n for n in named if not (Path(ROOT, "mha_tui", n).exists() or Path(ROOT, n).exists())]
    assert sorted(missing) == []
