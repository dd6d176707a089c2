"""The module's own source line behind an op: one statement, read from the file that ran.

Shared by every array library's adapter (torch_ops, numpy_ops), so it imports neither:
pure Python (ast, linecache). Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import ast
import linecache
import textwrap
from functools import lru_cache
from types import CodeType

from ..records import Statement

# Compound statements: the simple statement inside them is what ran.
_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While,
             ast.With, ast.Try, ast.AsyncFor, ast.AsyncWith, ast.Match)


def _spans(text: str, offset: int) -> tuple[tuple[int, int], ...]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    return tuple(sorted((node.lineno + offset, (node.end_lineno or node.lineno) + offset)
                        for node in ast.walk(tree)
                        if isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND)))


@lru_cache(maxsize=512)
def _statements(filename: str, first: int = 0, last: int = 0) -> tuple[tuple[int, int], ...]:
    """(first, last) line of every simple statement in a function (or a whole file).

    Parsing only the function that ran keeps this cheap even inside torch's 6,000-line
    functional.py; a function that does not parse on its own falls back to the file."""
    lines = linecache.getlines(filename)
    if first and last >= first:
        snippet = textwrap.dedent("".join(lines[first - 1:last]))
        spans = _spans(snippet, first - 1)
        if spans:
            return spans
    return _spans("".join(lines), 0)


def statement_at(filename: str, line: int, code: CodeType | None = None) -> tuple[int, int]:
    """The smallest simple statement around a line (a multi-line call shows whole).

    code: the function's code object, when known, so that only that function is parsed."""
    first = last = 0
    if code is not None:
        first = code.co_firstlineno
        last = max((ln for _, _, ln in code.co_lines() if ln is not None), default=0)
    best = (line, line)
    for start, end in _statements(filename, first, last):
        if start <= line <= end and (best == (line, line) or end - start < best[1] - best[0]):
            best = (start, end)
    return best


@lru_cache(maxsize=4096)
def source_at(filename: str, line: int, function: str = "", code: CodeType | None = None) -> Statement:
    """The statement that ran at filename:line, read from that file."""
    first, last = statement_at(filename, line, code)
    lines = [linecache.getline(filename, n).rstrip("\n") for n in range(first, last + 1)]
    text = textwrap.dedent("\n".join(lines)).strip("\n")
    return Statement(file=filename, line=first, text=text, end_line=last, function=function)
