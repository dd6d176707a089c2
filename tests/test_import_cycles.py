"""No import cycle among mha_tui's modules, counting every import statement (those inside
functions too): the one-way flow load -> trace -> recognise -> judge -> render ->
(dump | app | check) <- cli holds in the code, not only in the README."""

from __future__ import annotations

import subprocess
import sys

import pytest

grimp = pytest.importorskip("grimp")  # import-linter's own graph builder (the dev extra)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return groups


def test_no_import_cycle_even_through_function_level_imports() -> None:
    """grimp reads every import statement: lazy ones inside functions and those under
    `if TYPE_CHECKING:` included."""
    graph = grimp.build_graph("mha_tui", cache_dir=None)  # never a stale cached graph
    assert _cycles(graph) == []


FIRST_IMPORT = """
import importlib, pkgutil, sys
import mha_tui
names = [m.name for m in pkgutil.walk_packages(mha_tui.__path__, "mha_tui.")
         if not m.name.endswith("__main__")]
for name in names:
    for loaded in [k for k in sys.modules if k == "mha_tui" or k.startswith("mha_tui.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ImportError as error:
        print(name, error)
"""


def test_every_module_imports_when_it_is_the_first_one_imported() -> None:
    """A cycle grimp does not see: importing a.b runs a/__init__ first, so a package whose
    __init__ imports a submodule that comes back round (judge.numeric -> recognise/__init__
    -> recognise.run -> ... -> judge.numeric) fails when the cycle's module is imported first.
    Each module is imported in a fresh mha_tui (torch and NumPy stay loaded), in one process."""
    result = subprocess.run([sys.executable, "-c", FIRST_IMPORT], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: two modules importing each other are one group."""
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]


def test_mha_tui_check_stays_the_notebook_function_once_the_judge_is_imported() -> None:
    """`mha_tui.check(module)` (README, notebook) is a function, and importing the judging
    package (as every check does) does not rebind that name: the package is `mha_tui.judge`."""
    import mha_tui
    import mha_tui.judge
    from mha_tui.notebook import check

    assert mha_tui.check.__module__ == "mha_tui" and callable(mha_tui.check)
    assert mha_tui.check.__doc__ and check.__doc__
