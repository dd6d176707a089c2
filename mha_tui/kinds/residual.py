"""residual: the module's own input added back to the attention output after W_O (BERT's and
RoBERTa's `LayerNorm(dense(h) + input_tensor)`, BLOOM's `residual + dropout(dense(h))`), and
the LayerNorm that follows it when the module normalises there (post-norm).

Recognised from the graph, never from names: an add of two (B, T, C) tensors, one the
output projection's result (or something made from it), the other a forward's own input.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

from ..ops.graph import Graph
from ..ops.numeric import tolerance
from ..ops.sizes import Sizes
from ..records import Check, OpRecord, Ref, Stage, Trace
from ._parts.builder import BTC
from ._parts.cell import Cell, Term, Why, WhyError, where
from ._parts.maker import StageMaker
from ._parts.quizzing import Question, shape_question
from ._parts.unit import Unit
from .norm import norm_terms, recomputed

KIND = "residual"
_ADDS = {"add", "add_"}
_NORMS = {"layer_norm", "rms_norm"}


def _forward_input(ref: Ref) -> bool:
    return ref.kind == "input"


def adds_the_input_back(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """x + attention(x): an add of the output projection's result and a forward input of
    the same shape; or a LayerNorm of that sum (post-norm)."""
    if op.name in _NORMS:
        ref = g.x_inputs(op)[0] if g.x_inputs(op) else None
        source = g.producer(ref) if ref is not None else None
        return KIND if source is not None and g.kind.get(source.index) == KIND else None
    if op.name not in _ADDS:
        return None
    operands = g.tensor_operands(op)
    if len(operands) != 2:
        return None
    inputs = [r for r in operands if _forward_input(r)]
    made = [r for r in operands if not _forward_input(r)]
    if len(inputs) != 1 or len(made) != 1 or not g.derives(made[0], {"w_o"}):
        return None
    if g.snap(inputs[0]).shape != g.snap(made[0]).shape:
        return None
    return KIND


RULES = (adds_the_input_back,)


def mechanism(j: object, stage: Stage) -> str:
    """What `check` says when the module leaves plain attention at this stage."""
    norm = next((op for op in stage.ops if op.name in _NORMS), None)
    then = (f", then a {'LayerNorm' if norm.name == 'layer_norm' else 'RMSNorm'} of the sum "
            f"(post-norm, as BERT's attention block)") if norm is not None else ""
    return (f"a residual add inside the module: the output is x + attention(x){then}, not "
            f"the attention alone; check judges multi-head attention, so return its output "
            f"before the add if that is the exercise")


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    ops = [m.op(i) for i in unit.ops]
    add = next(op for op in ops if op.name in _ADDS)
    norm = next((op for op in ops if op.name in _NORMS), None)
    operands = m.g.tensor_operands(add)
    residual_ref = next(r for r in operands if _forward_input(r))
    attention_ref = next(r for r in operands if not _forward_input(r))
    residual, attention = m.snap(residual_ref), m.snap(attention_ref)
    name = f"{residual_ref.name} + attention output"
    tensors = [
        m.b.record(f"{residual_ref.name} (the module's input)", residual, m.dims(residual.shape, BTC),
                   caption="what the module received: added back unchanged"),
        m.b.record("attention output", attention, m.dims(attention.shape, BTC),
                   caption=f"what attention made of it: {m.origin_name(attention_ref)} (after W_O)"),
        m.b.record(name, add.out, m.dims(add.out.shape, BTC), caption="their sum, token by token"),
    ]
    summed = residual.values.astype(np.float64) + attention.values.astype(np.float64)
    same = bool(np.allclose(summed, add.out.values, **tolerance(atol=1e-6, rtol=1e-5)))
    checks = [Check(f"the sum is {residual_ref.name} + the attention output, entry by entry "
                    f"(recomputed by mha-tui)", same)]
    title = "Residual connection: the module's input added back"
    explanation = (
        f"This module adds its own input, {residual_ref.name}, back to what attention made of "
        "it (the output projection's result): a residual (skip) connection. Each token keeps "
        "what it had and attention only adds a change to it, so a layer can leave a token "
        "almost as it was. Most models do this in the block around attention; this one does it "
        "inside the attention module.")
    if norm is not None:
        normed, eps = recomputed(m, norm)
        what = "RMSNorm" if norm.name == "rms_norm" else "LayerNorm"
        tensors.append(m.b.record(f"{m.tensor_name(norm, fallback='out')} after {what}", norm.out,
                                  m.dims(norm.out.shape, BTC),
                                  caption="each token's numbers normalised: the module's output"))
        checks.append(Check(f"then {what} over each token's {norm.out.shape[-1]} numbers, times "
                            f"the module's weight{'' if what == 'RMSNorm' else ' plus its bias'} "
                            f"(recomputed by mha-tui, eps = {eps:g})", normed))
        title = f"Residual connection and {what}: the input added back, then normalised"
        explanation += (f" Then {what} normalises each token's sum over its "
                        f"{norm.out.shape[-1]} numbers (post-norm: after the residual add, "
                        "not before attention).")
    last = tensors[-1]
    return m.stage(unit, stage_id, KIND, tensors, checks, shape_in=attention.shape,
                   shape_out=last.values.shape, dims_in=tensors[1].dims, dims_out=last.dims,
                   title=title, explanation=explanation)


# ---------------------------------------------------------------------- why this number


def why(cell: Cell) -> Why:
    """The module's input + the attention output at this token and channel; after a
    post-norm, that token's sums normalised: (sum - mean) / √(variance + eps) × gamma + beta, with
    the row the LayerNorm received and its own weight and bias."""
    tensors = cell.stage.tensors
    if len(tensors) < 3:
        raise WhyError(f"stage {cell.stage.id} holds no residual add to explain {cell.name} by")
    residual, attention = tensors[0], tensors[1]
    x_name = residual.name.split(" (")[0]
    spot = ", ".join(map(str, cell.index))
    x, a = float(residual.values[cell.index]), float(attention.values[cell.index])
    total = x + a
    terms = [Term(f"{x_name}[{spot}] (the module's input, recorded)", (), x),
             Term(f"+ attention output[{spot}] (after W_O, recorded)", (), a)]
    sum_text = f"{x_name}[{spot}] + attention output[{spot}]"
    norm = next((op for op in cell.stage.ops if op.name in _NORMS), None)
    if norm is None:
        terms.append(Term("sum", (x, "+", a), total))
        return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
                   f"{cell.name} = {sum_text}", tuple(terms),
                   ("the residual (skip) connection: the token keeps what it had, attention adds "
                    "a change to it",), total, cell.recorded)
    *lead, t, c = cell.index
    rms = norm.name == "rms_norm"
    what = "RMSNorm" if rms else "LayerNorm"
    received = cell.operand(norm, 0)  # the sums the norm received: the module's own add
    row = received[(*lead, t)].astype(np.float64)
    size = row.shape[-1]
    s = float(row[c])
    terms.append(Term(f"{x_name} + attention output (mha-tui)", (x, "+", a), total))
    steps, computed = norm_terms(cell, norm, row, c, "sums")
    terms += steps
    close = abs(total - s) <= 1e-5 * max(1.0, abs(s))
    return Why(cell.stage.id, KIND, cell.record.name, cell.index, where(cell),
               f"{cell.name} = {what}({sum_text}) = "
               + ("sum / √(mean square + eps) × gamma" if rms else
                  "(sum - mean) / √(variance + eps) × gamma + beta"),
               tuple(terms),
               (f"the {what} normalises each token over its {size} sums, as the module's add "
                f"made them (recorded); variance without Bessel's correction, as {what} does"
                if not rms else f"the {what} divides each token's {size} sums, as the module's "
                "add made them (recorded), by their root mean square",
                f"gamma{'' if rms else ' and beta'}: the {what}'s own weight"
                + ("" if rms else " and bias") + f", at channel {c}",
                f"mha-tui's {x_name} + attention output {'equals' if close else 'differs from'} the "
                f"module's sum {s:.6g}" + ("" if close else f" by {abs(total - s):.3g}")),
               computed, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The shape once the input is added back (and normalised): the module's output."""
    return (shape_question(stage, stage.tensors[-1], "the residual add"),) if stage.tensors else ()
