"""Chains of ops from one x-derived tensor to another, for the kinds found from the values
(rotary spelled any way, a norm written out op by op): which tensors an op is made from
through a set of allowed ops, and the ops between a source and an end when everything
x-derived they use comes from that one source.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ...ops.graph import Graph
from ...records import OpRecord, Ref

LIMIT = 48  # ops in one chain, at most


def walk(g: Graph, end: OpRecord, allowed: frozenset[str]) -> list[Ref]:
    """The x-derived tensors the ops up to `end` are made from, through the allowed ops, nearest
    first (by the op that made them)."""
    seen: set[int] = set()
    found: list[Ref] = []
    todo = [ref for ref in end.inputs if g.is_x(ref)]
    while todo and len(seen) <= LIMIT:
        ref = todo.pop()
        if not any(same(ref, f) for f in found):
            found.append(ref)
        op = g.producer(ref)
        if op is None or op.index in seen or op.name not in allowed or \
                g.kind.get(op.index) == "project":
            continue
        seen.add(op.index)
        todo.extend(r for r in op.inputs if g.is_x(r))
    return sorted(found, key=lambda r: -1 if r.op is None else r.op, reverse=True)


def region(g: Graph, end: OpRecord, source: Ref, allowed: frozenset[str]) -> set[int] | None:
    """The ops between `source` and `end` when every x-derived tensor they use comes from
    `source` (through them); None otherwise."""
    ops: set[int] = {end.index}
    todo = [ref for ref in end.inputs if g.is_x(ref)]
    while todo:
        ref = todo.pop()
        if same(ref, source):
            continue
        op = g.producer(ref)
        if op is None or op.name not in allowed or g.kind.get(op.index) == "project":
            return None
        if op.index in ops:
            continue
        ops.add(op.index)
        if len(ops) > LIMIT:
            return None
        todo.extend(r for r in op.inputs if g.is_x(r))
    return ops


def same(a: Ref, b: Ref) -> bool:
    return a.kind == b.kind and a.op == b.op and a.output == b.output and a.name == b.name
