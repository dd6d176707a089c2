"""Every x-dependent op given a kind by the registry's rules, in order; ops inside a
library module that projects (GPT-2's Conv1D: view, addmm, view) all join that projection.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from ..kinds.qkv_split import fused_width
from ..kinds.registry import RULES
from ..ops.graph import Graph
from ..ops.sizes import Sizes
from ..ops.vocab import PROJECTIONS


def classify(g: Graph, sizes: Sizes) -> None:
    """Give every x-dependent op a kind; rules in the registry's order, the first that answers wins."""
    for op in g.ops:
        if not g.from_x[op.index] or op.index in g.for_python:
            continue
        kind = "op"
        for rule in RULES:
            found = rule(g, op, sizes)
            if found:
                kind = found
                break
        g.kind[op.index] = kind
        if kind == "project" and op.name in PROJECTIONS and fused_width(op.out.shape[-1], sizes):
            g.fused.add(op.index)
    _fold_library_calls(g)


def _fold_library_calls(g: Graph) -> None:
    """Every x-dependent op inside a leaf module call that projects (GPT-2's Conv1D:
    view, addmm, view) belongs to that projection. A leaf call that does more than one
    projection's work (a wrapped nn.MultiheadAttention, whose out_proj is never called as a
    module) is attention itself: its ops keep their own kinds."""
    children = {c.path for c in g.rec.calls}
    for call in g.rec.calls:
        if any(p != call.path and p.startswith(call.path + ".") for p in children):
            continue
        inside = [i for i in range(call.first, call.end) if g.from_x[i]]
        kinds = {g.kind[i] for i in inside}
        projections = kinds & {"project", "w_o"}
        if len(projections) != 1 or kinds - {"project", "w_o", "aux", "op"}:
            continue
        (kind,) = projections
        for i in inside:
            g.kind[i] = kind
