"""The module's own source line behind an op: one statement, read from the file that ran.

Shared by every array library's adapter (torch_ops, numpy_ops), so it imports neither:
pure Python (ast, linecache). Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import ast
import linecache
import textwrap
from functools import lru_cache

from ..records import Source

# Compound statements: the simple statement inside them is what ran.
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While,
             ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith, ast.Match)


@lru_cache(maxsize=256)
def _statements(filename: str) -> tuple[tuple[int, int], ...]:
    """(first, last) line of every simple statement in a file, innermost last."""
    text = "".join(linecache.getlines(filename))
    if not text:
        return ()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND):
            spans.append((node.lineno, node.end_lineno or node.lineno))
    return tuple(sorted(spans))


def statement_at(filename: str, line: int) -> tuple[int, int]:
    """The smallest simple statement around a line (a multi-line call shows whole)."""
    best = (line, line)
    for first, last in _statements(filename):
        if first <= line <= last and (best == (line, line) or last - first < best[1] - best[0]):
            best = (first, last)
    return best


@lru_cache(maxsize=4096)
def source_at(filename: str, line: int, function: str = "") -> Source:
    """The statement that ran at filename:line, read from that file."""
    first, last = statement_at(filename, line)
    lines = [linecache.getline(filename, n).rstrip("\n") for n in range(first, last + 1)]
    text = textwrap.dedent("\n".join(lines)).strip("\n")
    return Source(file=filename, line=first, text=text, end_line=last, function=function)
