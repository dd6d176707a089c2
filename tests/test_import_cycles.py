"""No import cycle among mha_tui's modules, counting every import statement (those inside
functions too). The order of the layers is pyproject's import-linter `layers` contract; this
test adds what it cannot see: no two modules of one layer import each other either."""

from __future__ import annotations

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
