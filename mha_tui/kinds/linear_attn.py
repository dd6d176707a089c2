"""linear_attn: a token mixer with no softmax (linear attention's φ(Q) (φ(K)^T V), as
idiap's fast-transformers writes it): its feature map, the keys-times-values product summed
over the tokens first, the normaliser and the queries' product with them. Not softmax
attention: there is no (T, T) score matrix, and no stage of it is called scores.

Recognised from the ops, never from names: in a forward that has no softmax (called or
written out as exp / sum), every op made from the projections before W_O.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace

from ..ops.graph import Graph, hand_written_softmaxes
from ..ops.sizes import Sizes
from ..ops.vocab import SHAPE_OPS, SOFTMAXES
from ..records import Check, OpRecord, Stage
from ..stages import title_of
from ._parts.cell import Cell, Why
from ._parts.maker import StageMaker
from ._parts.op_cell import explain, locate
from ._parts.unit import Unit

KIND = "linear_attn"


def _no_softmax(g: Graph) -> bool:
    """The forward ran to its end, mixes tokens (a product of two x-derived tensors: K^T V)
    and nothing in it is a softmax (called, or written out)."""
    if g.rec.output is None or g.rec.error is not None:
        return False
    if not any(op.name in ("einsum", "matmul", "bmm") and len(g.x_inputs(op)) >= 2
               for op in g.ops):
        return False
    return not any(op.name in SOFTMAXES or op.name == "scaled_dot_product_attention"
                   for op in g.ops) and not hand_written_softmaxes(g)


def mixes_without_softmax(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """An op made from the projections, before W_O, in a forward with no softmax."""
    if op.name in SHAPE_OPS or not g.op_derives(op, {"project", "view", "transpose", KIND}):
        return None
    if g.op_derives(op, {"w_o"}) or g.kind.get(op.index) is not None:
        return None
    return KIND if _no_softmax(g) else None


RULES = (mixes_without_softmax,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    ops = [m.op(i) for i in unit.ops]
    first, last = ops[0], ops[-1]
    src = m.snap(m.x_in(first))
    products = [op for op in ops if op.name in ("einsum", "matmul", "bmm")]
    tensors = [m.b.record(m.tensor_name(op, fallback=op.name), op.out, m.dims(op.out.shape))
               for op in products[-3:]]
    tensors = tensors or [m.b.record(m.tensor_name(last, fallback=last.name), last.out,
                                     m.dims(last.out.shape))]
    square = [op for op in products if op.out.values.ndim >= 2 and
              op.out.values.shape[-2:] == (m.s.T, m.s.T)]
    checks = [Check("no softmax anywhere in the forward", True),
              Check(f"no product makes a (T, T) = ({m.s.T}, {m.s.T}) matrix of scores", not square)]
    explanation = (
        "Linear attention: the queries and keys go through a feature map φ (here elu(x) + 1, "
        "positive), the keys are multiplied with the values and summed over the tokens first "
        "(φ(K)^T V, a d_h × d_h matrix per head), and each query reads that summary, divided "
        "by its dot product with the sum of the keys. No softmax and no T × T score matrix: "
        "the cost grows with T, not T². It is not softmax attention, so mha-tui shows its ops "
        "as one stage and names no scores, mask or softmax in it.")
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=src.shape,
                   shape_out=last.out.shape, dims_in=m.dims(src.shape),
                   dims_out=tensors[-1].dims, title=title_of(KIND), explanation=explanation)


def why(cell: Cell) -> Why:
    """A number of linear attention: the product that made it (φ(Q) with the keys-times-
    values summary and the normaliser, or φ(K)^T V itself), recomputed from its recorded
    operands, term by term."""
    made = explain(cell, *locate(cell, cell.stage.ops))
    return replace(made, kind=KIND, notes=(
        *made.notes, "linear attention: no softmax and no (T, T) scores; each query reads "
                     "φ(K)^T V, the keys times the values summed over the tokens, divided by "
                     "its dot product with the sum of φ(K)"))
