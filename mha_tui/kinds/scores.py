"""scores: q @ k^T, a product of two x-derived tensors that is not yet weighted (baddbmm's
added mask shown as its own stage).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, masks_somewhere
from ..ops.numeric import products_agree, token_axes, tolerance
from ..ops.sizes import Sizes
from ..ops.vocab import MATMULS
from ..records import Check, OpRecord, Snapshot, Stage, Trace
from ._parts.builder import BHTD, BHTT
from ._parts.cell import (
    Cell,
    Term,
    Why,
    WhyError,
    broadcast_lead,
    dot,
    expanded_from,
    fused_argument,
    head_prefix,
    reindex,
    shared_note,
    where,
)
from ._parts.maker import StageMaker, batched_product, broadcast_heads, synthetic, words
from ._parts.mask_fill import written
from ._parts.mask_shape import blocks_word, mask_shape, token_names
from ._parts.op_cell.reading import bracket
from ._parts.product_cell import by_rows, called, generic, summed_over
from ._parts.quizzing import (
    EXPANDED,
    Question,
    cell_index,
    head_of_interest,
    key_name,
    last_query,
    number_text,
    token_name,
)
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "scores"


def query_key_product(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """A product of two x-derived tensors not downstream of softmax (that is attend) and not
    of another scores or attend product: q @ k^T."""
    if op.name not in MATMULS or len(g.x_inputs(op)) < 2:
        return None
    if g.op_derives(op, {"softmax", "dropout"}) or g.op_derives(op, {"scores", "attend"}):
        return None
    # only a forward that ran to its output says what follows: one that raised may stop
    # before its softmax, and its product is still the scores
    finished = g.rec.output is not None and g.rec.error is None
    return "scores" if not finished or _normalised_later(g, op) else None


_NORMALISERS = {"softmax", "_softmax", "softmax_", "log_softmax", "exp", "sigmoid"}


def _normalised_later(g: Graph, op: OpRecord) -> bool:
    """Scores are turned into weights downstream (a softmax, written out or not): linear
    attention's φ(K)^T V, a product of two x-derived tensors that nothing normalises, is
    not a score matrix."""
    todo, seen = [op.index], set()
    while todo:
        i = todo.pop()
        for c in g.consumers[i]:
            if c in seen:
                continue
            seen.add(c)
            if g.ops[c].name in _NORMALISERS:
                return True
            todo.append(c)
    return False


RULES = (query_key_product,)


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    values, snap = m.four_d(unit, BHTT)
    ok = m.unit_products_agree(unit, lambda op: _product(m, op))
    first = m.op(unit.ops[0])
    name = m.tensor_name(first, fallback="scores")
    h = m.s.h
    what = "einsum" if first.name == "einsum" else "batched matmul"
    shared_kv = broadcast_heads(m.g, first, h)
    checks = [Check(batched_product(h, "Q_i @ K_i^T", what) if not m.b.per_head and not shared_kv
                    else f"one {what} = {h} per-head Q_i @ K_0^T: K has one head, and the "
                         f"matmul broadcasts it to all {h} query heads (no copy is made)"
                    if shared_kv else f"each head's own q @ k^T, {h} heads side by side", ok)]
    fused_mask = next((op for op in (m.op(i) for i in unit.ops) if op.name == "baddbmm"
                       and _very_negative_anywhere(m, op)), None)
    src = m.snap(first.inputs[1] if first.name == "baddbmm" and len(first.inputs) == 3
                 else m.x_in(first))
    if fused_mask is not None:
        return _scores_and_mask(m, unit, stage_id, fused_mask, values, snap, src)
    fused_bias = next((op for op in (m.op(i) for i in unit.ops) if op.name == "baddbmm"
                       and baddbmm_factors(op)[1] != 0  # beta 0: the input is ignored
                       and len(op.inputs) == 3 and m.snap(op.inputs[0]).values.size > 1
                       and np.ptp(m.snap(op.inputs[0]).values) > 0), None)
    if fused_bias is not None:
        return _scores_and_bias(m, unit, stage_id, fused_bias, values, snap, src)
    rec = m.b.record(name, snap, BHTT if values.ndim == 4 else None, values=values,
                        caption="row: query token · column: key token")
    m.out_of_kind["scores"] = (values, snap)
    alpha = baddbmm_factors(first)[0] if first.name == "baddbmm" else 1.0
    title, note = None, ""
    if shared_kv:
        title = f"Raw attention scores: Q @ K^T, one K/V head for all {h} query heads"
    if alpha != 1.0:  # GPT-NeoX: baddbmm(zeros, q, k^T, alpha=1/sqrt(d_h))
        title = "Attention scores, scaled inside baddbmm"
        note = (f"torch.baddbmm(..., alpha={alpha:.6g}) multiplies q @ k^T by alpha in the same "
                f"call: these scores are already scaled"
                + (f" by 1/sqrt(d_h) = 1/sqrt({m.s.d_h})" if abs(alpha * np.sqrt(m.s.d_h) - 1)
                   < 1e-6 else "") + "; no separate scale step follows.")
    return m.stage(unit, stage_id, "scores", [rec], checks, shape_in=src.shape,
                      shape_out=values.shape if m.b.per_head else snap.shape,
                      dims_in=m.dims(src.shape, BHTD, ("T", "d_h")),
                      dims_out=rec.dims, title=title, note=note)

def _product(m: StageMaker, op: OpRecord) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """What the product op computes from its two operands (baddbmm adds its scaled input)."""
    if op.name == "einsum":
        equation = next((x for x in op.args if isinstance(x, str)), "")
        return lambda a, c: np.einsum(equation, a, c)
    if op.name == "baddbmm":
        alpha, beta = baddbmm_factors(op)
        if not beta:  # the input is ignored (torch.empty: any bytes, NaN included)
            return lambda a, c: alpha * (a @ c)
        given = m.snap(op.inputs[0]).values
        return lambda a, c: beta * given + alpha * (a @ c)
    return np.matmul


def _scores_and_mask(m: StageMaker, unit: Unit, stage_id: str, op: OpRecord, values: np.ndarray,
                     snap: Snapshot, src: Snapshot) -> list[Stage]:
    """torch.baddbmm(mask, q, k^T) adds the mask in the same call as the product: the
    product alone is mha-tui's expansion, the masked result is torch's own."""
    a, c = (m.snap(r).values for r in m.g.x_inputs(op)[:2])
    raw = (a @ c).astype(a.dtype)
    raw4 = raw.reshape(values.shape) if raw.size == values.size else raw
    bias_ref = m.g.other_inputs(op)[0]
    label = ("torch.baddbmm(mask, q, k^T) computes q @ k^T and adds the mask in one call; "
             "this stage's product alone is computed by mha-tui from its inputs, the next "
             "stage shows torch's own result.")
    scores = m.stage(unit, stage_id, "scores", [
        m.b.record("q @ k^T", synthetic(raw4), BHTT if raw4.ndim == 4 else None,
                      caption="row: query token · column: key token (mha-tui's expansion)")],
        [Check(f"q @ k^T, {m.s.h} heads, computed here from baddbmm's inputs", None)],
        shape_in=src.shape, shape_out=snap.shape, dims_in=m.dims(src.shape, BHTD),
        dims_out=BHTT, note=label, title="Raw attention scores (mha-tui's expansion)")
    wrote = written(m.g, op)  # what baddbmm's added mask holds, not a threshold on the sum
    blocked = wrote.reshape(values.shape) if wrote is not None and wrote.size == values.size \
        else values <= -1e4
    kept = bool(np.allclose(values[~blocked], raw4[~blocked], **tolerance(atol=1e-6, rtol=1e-5))) \
        if raw4.shape == values.shape else True
    n_inf = int(np.isneginf(values).sum())
    bias = m.snap(bias_ref)
    title, explanation = words("mask")
    # what the mask blocks, read from the entries (padding ...)
    shape = mask_shape(blocked, token_names(m.b.config.tokens))
    if shape.kind != "causal" and blocked.any():
        title, explanation = shape.title, shape.explanation
    mask = Stage(
        id="mask", title=title, code=scores.code,
        explanation=explanation, shape_in=snap.shape, shape_out=snap.shape,
        dims_in=BHTT, dims_out=BHTT,
        tensors=(m.b.record(m.spelled(bias_ref, op), bias,
                               m.dims(bias.shape, ("T", "T"), ("B", "T", "T")),
                               caption="added by baddbmm: 0 where a token may look, -inf where not"),
                 m.b.record(m.tensor_name(op, fallback="scores"), snap, BHTT, values=values)),
        checks=(Check(f"{n_inf} of {int(blocked.sum())} blocked entries are exactly -inf",
                      n_inf == int(blocked.sum())),
                Check("entries the mask lets through equal the product "
                      "(allclose, rtol=1e-05, atol=1e-06)", kept)),
        kind="mask", source=scores.source, ops=scores.ops,
        blocks=blocks_word(shape) if blocked.any() else "none")
    m.made["mask"] = mask
    m.out_of_kind["scores"] = (raw4, snap)
    return [scores, mask]

def baddbmm_factors(op: OpRecord) -> tuple[float, float]:
    """torch.baddbmm(input, b1, b2, beta=, alpha=) computes beta * input + alpha * (b1 @ b2)."""
    alpha, beta = op.kwarg("alpha", 1.0), op.kwarg("beta", 1.0)
    return (float(alpha) if isinstance(alpha, int | float) else 1.0,
            float(beta) if isinstance(beta, int | float) else 1.0)


def scaled_inside(g: Graph) -> float | None:
    """The alpha of a baddbmm that computed the scores, when it scales them (BLOOM, NeoX)."""
    for op in g.ops:
        if g.kind.get(op.index) == "scores" and op.name == "baddbmm":
            alpha, _ = baddbmm_factors(op)
            if alpha != 1.0:
                return alpha
    return None


def _scores_and_bias(m: StageMaker, unit: Unit, stage_id: str, op: OpRecord, values: np.ndarray,
                     snap: Snapshot, src: Snapshot) -> list[Stage]:
    """alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(d_h)) (BLOOM): the product, its scaling and
    the position bias in one call. The scaled product is mha-tui's expansion from the call's
    inputs; the next stage adds the bias and shows torch's own result."""
    from .position_bias import bias_stage

    alpha, beta = baddbmm_factors(op)
    bias_ref = op.inputs[0]  # baddbmm(input, batch1, batch2): the bias comes first
    a, c = (m.snap(r).values.astype(np.float64) for r in op.inputs[1:3])
    scaled = (alpha * (a @ c)).astype(values.dtype)
    scaled4 = scaled.reshape(values.shape) if scaled.size == values.size else scaled
    d_h = m.s.d_h
    factor = (f"alpha = {alpha:.6g} = 1/sqrt({d_h})" if abs(alpha * np.sqrt(d_h) - 1) < 1e-6
              else f"alpha = {alpha:.6g}")
    label = (f"torch.baddbmm(bias, q, k^T, beta={beta:g}, alpha={alpha:.6g}) computes "
             f"{factor} times q @ k^T and adds the bias in one call: the scaling happens here, "
             f"inside baddbmm. This stage's scaled product is computed by mha-tui from the call's "
             f"inputs; the next stage adds the bias and shows torch's own result.")
    scores = m.stage(unit, stage_id, "scores", [
        m.b.record("alpha * (q @ k^T)", synthetic(scaled4), BHTT if scaled4.ndim == 4 else None,
                   caption=f"row: query token · column: key token, already scaled ({factor}; "
                           f"mha-tui's expansion)")],
        [Check(f"q @ k^T times {factor}, {m.s.h} heads, computed here from baddbmm's inputs",
               None)],
        shape_in=src.shape, shape_out=snap.shape, dims_in=m.dims(src.shape, BHTD),
        dims_out=BHTT, note=label, title="Raw attention scores, scaled inside baddbmm")
    bias = beta * m.snap(bias_ref).values.astype(np.float64)
    if bias.ndim == 3 and values.ndim == 4 and bias.shape[0] == values.shape[0] * values.shape[1]:
        bias = bias.reshape(values.shape[0], values.shape[1], *bias.shape[1:])
    stage = bias_stage(m, "pos_bias", np.broadcast_to(bias, values.shape), scaled4, values,
                       base=scores, bias_name=m.spelled(bias_ref, op))
    m.made["pos_bias"] = stage
    m.out_of_kind["scores"] = (scaled4, snap)
    return [scores, stage]


def _very_negative_anywhere(m: StageMaker, op: OpRecord) -> bool:
    if op.name == "baddbmm" and baddbmm_factors(op)[1] == 0:
        return False  # beta 0: torch ignores the input, whatever its bytes hold
    others = m.g.other_inputs(op)
    return bool(others) and masks_somewhere(m.g, others[0])


# ---------------------------------------------------------------------- judging


def scores_row(j: Judge, stage: Stage) -> Row:
    ops = j.main_ops(stage, {"matmul", "bmm", "baddbmm", "einsum"})
    ok, worst = products_agree(j.g, ops)
    shapes_ok = all((op.out.shape[q], op.out.shape[k]) == (j.T_q, j.T_k)
                    for op in ops for q, k in [token_axes(op)])
    shape = "(T_q, T_k)" if j.g.key_names else "(T, T)"
    return j.row(stage, "scores", ok and shapes_ok, worst,
                    f"scores = Q_i @ K_i^T, a {shape} matrix per head")


def judge(j: Judge) -> list[Row]:
    """Each scores stage (sdpa's expansion is judged by sdpa)."""
    return [scores_row(j, s) for s in j.trace.stages if s.kind == "scores" and not j.is_sdpa(s)]


def why(cell: Cell) -> Why:
    """A score: Q's row dotted with K's row, the d_h products and their sum."""
    if not cell.ops("matmul", "bmm") and cell.ops("baddbmm"):
        return _baddbmm_why(cell)
    if not cell.ops("matmul", "bmm") and cell.ops("einsum"):
        return _einsum_why(cell)
    op, index = cell.per_head(cell.ops("matmul", "bmm"))
    queries, keys_t = cell.operand(op, 0), cell.operand(op, 1)
    *lead, i, j = index
    at_q, at_k = broadcast_lead(queries, lead), broadcast_lead(keys_t, lead)
    head = ", ".join(map(str, cell.index[:-2]))
    k_head = head if at_k == tuple(lead) else ", ".join(map(str, at_k))
    return score_why(cell, queries[(*at_q, i)], keys_t[(*at_k, slice(None), j)],
                     f"Q[{head}, {i}, :]", f"K[{k_head}, {j}, :]",
                     ("Q and K are the matmul's recorded inputs (K as K^T: its column "
                      f"{j})", *shared_note(at_k, lead, "K")))


def _einsum_why(cell: Cell) -> Why:
    """torch.einsum("bqhd,bkhd->bhqk", q, k), or any subscripts: the query's row dotted with
    the key's, read from the einsum's recorded inputs."""
    c, f = by_rows(cell)
    if len(f.summed) != 1:
        return generic(c, f"{called(c)} sums over {', '.join(f.summed)}: not one dot product "
                          "of a query and a key")
    q_name, k_name = (f"{name}{bracket(at)}" for name, at in zip(f.names, f.at, strict=True))
    return score_why(cell, f.a, f.b, q_name, k_name,
                     (f"Q and K are {called(c)}'s recorded inputs, {f.names[0]} and "
                      f"{f.names[1]}; {summed_over(f)}",))


def _baddbmm_why(cell: Cell) -> Why:
    """torch.baddbmm(input, q, k^T, beta=, alpha=) = beta · input + alpha · (q @ k^T) in one
    call. The stage holds the module's own output (GPT-NeoX: scaled inside), or mha-tui's
    expansion of its product (nn.MultiheadAttention, BLOOM: the input is added next stage)."""
    op = cell.ops("baddbmm")[-1]
    values = cell.record.values
    if op.out.values.size != values.size:
        raise WhyError(f"cannot tell which op of stage {cell.stage.id} made {cell.name}")
    *lead, i, j = reindex(cell.index, values.shape, op.out.shape)
    alpha, beta = baddbmm_factors(op)
    head = ", ".join(map(str, cell.index[:-2]))
    made = score_why(cell, cell.operand(op, 1)[(*lead, i)],
                     cell.operand(op, 2)[(*lead, slice(None), j)], f"q[{head}, {i}, :]",
                     f"k[{head}, {j}, :]", ("q and k^T are torch.baddbmm's recorded inputs (K as "
                                            f"K^T: its column {j})",))
    own = holds_own(op, values)
    terms, total = list(made.terms), made.computed
    if alpha != 1.0:
        terms.append(Term(f"× alpha = {alpha:.6g}", (total, "×", alpha), alpha * total))
        total *= alpha
    if own and beta != 0.0:
        added = beta * float(np.broadcast_to(cell.operand(op, 0), op.out.shape)[(*lead, i, j)])
        terms.append(Term("+ beta × input", (total, "+", added), total + added))
        total += added
    made = replace(made, terms=tuple(terms), computed=total,
                   formula=made.formula + (f" × {alpha:.6g}" if alpha != 1.0 else ""))
    if own:
        return made
    return replace(made, recorded_by="mha-tui's expansion's", notes=(
        *made.notes, f"torch.baddbmm(input, q, k^T) computes beta · input + alpha · (q @ k^T) in "
        "one call and records only that: this stage's numbers are mha-tui's expansion of its "
        f"product{' times alpha' if alpha != 1.0 else ''}, computed by mha-tui from its inputs, "
        "not by the module; the next stage adds the input and shows torch's own result"))


def holds_own(op: OpRecord, values: np.ndarray) -> bool:
    """Whether a stage's tensor holds the op's own output (baddbmm's sum with its input), not
    mha-tui's expansion of its product."""
    return op.out.values.size == values.size and np.array_equal(
        op.out.values.reshape(values.shape), values, equal_nan=True)


def score_why(cell: Cell, query: np.ndarray, key: np.ndarray, q_name: str, k_name: str,
              notes: tuple[str, ...]) -> Why:
    """The arithmetic of one score, whoever computed its inputs: query · key, the d_h
    products and their sum (a matmul's scores; sdpa's expansion)."""
    *_, i, j = cell.index
    h = head_prefix(cell)
    terms, many, total = dot(cell, query, key, [f"d{k}: Q[{h}{i}, {k}] × K[{h}{j}, {k}]"
                                                for k in range(len(query))], "products")
    return Why(cell.stage.id, "scores", cell.record.name, cell.index, where(cell),
               f"{cell.name} = {q_name} · {k_name}  (a dot product over d_h = {len(query)})",
               terms, (*notes, *many), total, cell.recorded)


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """One score: head 1's last query against the first key; with F.scaled_dot_product_attention
    sharing K/V heads itself (enable_gqa=True), which K/V head the last query head reads."""
    if not stage.tensors or len(stage.tensors[-1].shape) < 2:
        return ()
    record = stage.tensors[-1]
    head = head_of_interest(record)
    i = last_query(trace, record)
    index = cell_index(record, head=head, row=i, col=0)
    value = float(record.values[index])
    spot = f"{record.name}[{', '.join(map(str, index))}]"
    per_kv, h_kv = _shared_by(stage, trace)
    kv = head // per_kv
    product = f"Q[{head}, {i}, :] · K[{head}, 0, :]"
    asked, source = "Q's row dotted with K's row.", f"the module's own {spot}, recorded ({product})"
    fused = next((op for op in stage.ops if op.name == "baddbmm"), None)
    if expanded_from(stage):
        source = f"mha-tui's expansion's {spot} (Q[{head}, {i}, :] · K[{kv}, 0, :]), {EXPANDED}"
    elif fused is not None:
        alpha, _ = baddbmm_factors(fused)
        times = f" × alpha = {alpha:.6g}" if alpha != 1.0 else ""
        if alpha != 1.0:
            asked = f"Q's row dotted with K's row, times alpha = {alpha:.6g}."
        source = (f"the module's own {spot}, recorded ({product}{times}, plus baddbmm's input)"
                  if holds_own(fused, record.values) else
                  f"mha-tui's expansion's {spot}: torch.baddbmm's product ({product}{times}), "
                  f"computed by mha-tui from its recorded inputs; the module recorded only "
                  f"baddbmm's sum with its input")
    questions = [Question(
        stage.id, "value", f"In head {head}, what is the score of query "
        f"{token_name(trace, i)} (row {i}) against key {key_name(trace, 0)} "
        f"(column 0), {spot}? {asked}", "number", value, number_text(value), source)]
    if per_kv > 1 and "h" in record.dims:
        last = record.shape[record.dims.index("h")] - 1
        questions.append(Question(
            stage.id, "kv_head", f"Which K/V head does query head {last} read?", "integer",
            last // per_kv, str(last // per_kv),
            f"enable_gqa=True: F.scaled_dot_product_attention shares each of K's {h_kv} heads "
            f"between {per_kv} query heads (the recorded q has {h_kv * per_kv} heads, k "
            f"{h_kv}): query head j reads K/V head j // {per_kv}, here {last} // {per_kv} = "
            f"{last // per_kv}"))
    return tuple(questions)


def _shared_by(stage: Stage, trace: Trace) -> tuple[int, int]:
    """Query heads per K/V head, and the K/V heads, when the stage is the expansion of an
    F.scaled_dot_product_attention that shares K/V heads itself (enable_gqa=True); else 1."""
    op = expanded_from(stage)
    if op is None or fused_argument(op, "enable_gqa") is not True or trace.recording is None:
        return 1, 0
    q, k = (trace.recording.snapshot(r).shape for r in op.inputs[:2])
    if len(q) < 3 or len(k) != len(q) or not k[-3] or q[-3] % k[-3] or q[-3] == k[-3]:
        return 1, 0
    return q[-3] // k[-3], k[-3]
