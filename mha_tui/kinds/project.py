"""project: x times a weight parameter, before attention (nn.Linear, x @ W, addmm, einsum,
a fused (C, 3C) layer and its split).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from ..ops.graph import Graph, reaching_output
from ..ops.numeric import (
    added_bias,
    allclose,
    close,
    einsum_spec,
    f64,
    head_axis_product,
    linear_parts,
)
from ..ops.sizes import Sizes
from ..ops.vocab import PRODUCTS, PROJECTIONS, SHAPE_OPS, SPLITS
from ..records import Check, OpRecord, Ref, Snapshot, Stage, TensorRecord, Trace
from ._parts.builder import BTC, Builder
from ._parts.cell import Cell, Why
from ._parts.maker import StageMaker, api_name
from ._parts.product_cell import projection_why
from ._parts.quizzing import Question, shape_question
from ._parts.unit import Unit

if TYPE_CHECKING:
    from ._parts.judging import Judge, Row


KIND = "project"


_TRANSPOSES = {"T", "t", "mT", "transpose"}


def stored_weight(g: Graph, ref: Ref) -> tuple[Ref, bool] | None:
    """The 2-D weight parameter an operand is, and whether the product reads it transposed:
    W itself (x @ W, addmm, nn.Linear's weight), or W.T / W.t() / W.transpose(0, 1) of a
    parameter (Falcon's `input @ self.weight.T`)."""
    if ref.kind in ("param", "const", "buffer"):
        return (ref, False) if g.snap(ref).ndim == 2 else None
    op = g.producer(ref)
    if op is None or g.from_x[op.index] or not op.inputs:
        return None
    if op.name in _MADE_FROM and g.snap(ref).ndim == 2 and _from_parameter(g, op.inputs[0]):
        return ref, False  # Whisper's weight.to(x.dtype), open_clip's in_proj_weight.chunk(3)
    if op.name not in _TRANSPOSES or len(op.inputs) != 1:
        return None
    inner = op.inputs[0]
    if inner.kind in ("param", "const", "buffer"):
        return (inner, True) if g.snap(inner).ndim == 2 else None
    made = stored_weight(g, inner)
    return (inner, True) if made is not None and made[0] == inner and not made[1] else None


# A weight made from a parameter by ops that keep its numbers (a dtype cast, a cut of a
# fused weight): still the layer's weight.
_MADE_FROM = {"to", "type_as", "float", "half", "bfloat16", "contiguous", "detach", "clone",
              "chunk", "split", "unbind", "getitem", "narrow"}


def _from_parameter(g: Graph, ref: Ref, steps: int = 6) -> bool:
    """ref is a parameter, or made from one by _MADE_FROM ops and transposes only."""
    for _ in range(steps):
        if ref.kind in ("param", "const", "buffer"):
            return True
        op = g.producer(ref)
        if op is None or g.from_x[op.index] or op.name not in _MADE_FROM | _TRANSPOSES or \
                not op.inputs:
            return False
        ref = op.inputs[0]
    return False


def weight_product(g: Graph, op: OpRecord) -> bool:
    """x times a weight parameter (nn.Linear, x @ W, x @ W.T, addmm, einsum with W)."""
    if op.name not in PROJECTIONS or len(g.x_inputs(op)) != 1:
        return False
    if head_axis_product(g, op):  # W_Q (h, C, d_h) read by einsum: a (h*d_h, C) layer
        return linear_parts(g, op) is not None
    return any(stored_weight(g, r) is not None for r in g.other_inputs(op))


def projection(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """x times a weight parameter: a projection to queries, keys or values (the output
    projection, downstream of attend, is claimed before this rule by w_o)."""
    return "project" if weight_product(g, op) else None


def fused_split(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """What happens to a fused (C, 3C) projection until it is cut into q, k, v: split,
    chunk, unbind, or torch's own unflatten/transpose/getitem. Still the projection."""
    if op.name not in SHAPE_OPS or not g.x_inputs(op):
        return None
    ref = g.x_inputs(op)[0]
    source = g.producer(ref)
    if source is None or source.index not in g.fused:
        return None
    if op.name not in SPLITS | {"getitem"}:
        g.fused.add(op.index)  # still the whole fused tensor, reshaped
    return "project"


def bias_of_projection(g: Graph, op: OpRecord, sizes: Sizes) -> str | None:
    """The bias a projection adds apart from its product (`x @ self.W_q + self.b_q`,
    TransformerLens' `einsum(...) + self.b_Q` with b_Q of shape (h, d_h), `... + self.b_O`
    after W_O): still that projection (or W_O), whose kind it takes. The product has no bias
    of its own, and the add is the one `added_bias` finds for it."""
    if op.name not in ("add", "add_"):
        return None
    for ref in op.inputs:
        product = g.producer(ref) if ref.kind == "op" else None
        if product is None or product.name not in PROJECTIONS or \
                g.kind.get(product.index) not in ("project", "w_o"):
            continue
        parts = linear_parts(g, product)
        found = added_bias(g, product)
        if parts is not None and parts[2] is None and found is not None and found[0] is op:
            return g.kind[product.index]
    return None


RULES = (projection, fused_split, bias_of_projection)

PER_HEAD_PROJECT = (
    "Each of the {h} heads is its own module with its own query, key and value layers, C in "
    "and d_h out. Their outputs are shown side by side, d_h channels per head, exactly as one "
    "fused C x C layer per role would hold them: the same numbers, laid out the fused way.")
FUSED_PROJECT = (
    "One layer computes queries, keys and values at once: its output has 3C channels, and "
    "split (or chunk) cuts it into q, k and v of C channels each, windows onto the same memory. "
    "Within each, channels 0..d_h-1 will become head 0, the next d_h head 1, and so on.")
FUSED_WHOLE = (
    "One layer computes queries, keys and values at once: each token gets {W} channels that "
    "hold its q, k and v side by side, one weight row per channel. The next stage cuts them "
    "apart, and into heads.")
MATMUL_PROJECT = (
    "x times a (C, C) weight stored as (in, out): output channel j is column j of the weight "
    "(nn.Linear stores the transpose). Output channels 0..d_h-1 will become head 0, the next "
    "d_h head 1, and so on.")
EINSUM_ROWS_PROJECT = (
    "x times a (C, C) weight stored as (out, in), as nn.Linear stores it: the einsum sums over "
    "the weight's second axis, so output channel j is row j of the weight (x @ W.T). Output "
    "channels 0..d_h-1 will become head 0, the next d_h head 1, and so on.")
EINSUM_ROWS_W_O = (
    "A final C x C projection mixes the heads: the einsum reads W stored as (out, in), as "
    "nn.Linear stores it (x @ W.T), so every output channel is a weighted sum over all C input "
    "channels, so over every head.")
HEAD_AXIS_PROJECT = (
    "Each weight has a head axis (TransformerLens' and ARENA's W_Q of shape (h, C, d_h)): the "
    "einsum gives every token d_h channels per head at once. It is one (h*d_h, C) linear "
    "layer, shown as such: rows d_h at a time are one head's.")
MATMUL_W_O = (
    "A final C x C projection, x @ W with W stored as (in, out), mixes the heads: every output "
    "channel is a weighted sum over all C input channels, so over every head.")


def build(m: StageMaker, unit: Unit, stage_id: str) -> Stage:
    return build_projection(m, unit, stage_id)


def build_projection(m: StageMaker, unit: Unit, stage_id: str, kind: str = "project") -> Stage:
    b, g, s = m.b, m.g, m.s
    mains = [m.op(i) for i in unit.ops if m.op(i).name not in ("split", "chunk", "unbind",
                                                                     "tensor_split", "getitem")]
    products = [op for op in mains if op.name in ("linear", "addmm", "matmul", "mm", "einsum")]
    splits = [m.op(i) for i in unit.ops if m.op(i).name in ("split", "chunk", "unbind",
                                                                  "tensor_split", "getitem")]
    x_ref = m.x_in(m.op(min(i for i in unit.ops if m.g.x_inputs(m.op(i)))))
    x_snap = m.snap(x_ref)
    tensors: list[TensorRecord] = []
    outputs: list[TensorRecord] = []
    ok_all = True
    has_bias = False
    any_transposed = False  # x @ W.T written out (Falcon), not nn.Linear
    einsum_rows = False  # einsum("btc,oc->bto", x, W): W read as (out, in)
    by_role: dict[str, list[OpRecord]] = {}
    for op in products:
        by_role.setdefault(b.role(op) if kind == "project" else "O", []).append(op)
    heads_split = kind == "project" and s.h > 1
    for role, ops in by_role.items():
        ops = sorted(ops, key=lambda o: g.head.get(o.index, 0))
        weights, biases, outs = [], [], []
        for op in ops:
            found = [f for f in (stored_weight(g, r) for r in g.other_inputs(op)) if f]
            head_axis = not found and head_axis_product(g, op)  # W_Q (h, C, d_h)
            w_ref, transposed = found[0] if found else \
                (next(r for r in g.other_inputs(op) if m.snap(r).ndim == (3 if head_axis else 2)),
                 False)
            any_transposed |= transposed
            w = m.snap(w_ref)
            bias_refs = [r for r in g.other_inputs(op) if m.snap(r).ndim == 1]
            # Recomputed at the module's own precision (float32 at least): the tolerance below
            # is float32's, and a float64 copy of x and W cost more than the forward at C 768.
            xin = m.snap(m.x_in(op)).values
            precision = np.promote_types(np.promote_types(xin.dtype, w.values.dtype), np.float32)
            xin = xin.astype(precision, copy=False)
            wv = w.values.astype(precision, copy=False)
            # nn.Linear stores (out, in) and computes x @ W.T; addmm / x @ W use (in, out);
            # an einsum reads W as its subscripts say ("btc,oc->bto": (out, in))
            read_out_in = op.name == "einsum" and (head_axis or _einsum_reads_rows(g, op, w_ref))
            stored_out_in = op.name == "linear" or transposed or read_out_in
            any_transposed |= read_out_in
            einsum_rows |= read_out_in
            product = xin @ (wv.T if stored_out_in else wv) if op.name != "einsum" else \
                _einsum_product(g, op, m, precision)
            added = added_bias(g, op)  # `x @ W + self.b` / `einsum(...) + self.b_Q`, written apart
            if added is not None and added[0].index not in unit.ops:
                added = None
            if added is not None and not bias_refs:
                bias_refs = [added[1]]
            last = _result_of(m, added[0] if added is not None else op, unit)
            if product is not None:
                if bias_refs:
                    product = product + m.snap(bias_refs[0]).values
                    has_bias = True
                ok_all &= allclose(product.reshape(last.values.shape), last.values,
                                   atol=1e-5, rtol=1e-4)
            weights.append((w_ref, w, stored_out_in))
            biases.extend((r.name, m.snap(r)) for r in bias_refs)
            outs.append((op, last))
        _projection_records(m, role, ops, weights, biases, outs, tensors, outputs,
                                 heads_split, kind)
    if splits and kind == "project":
        outputs = _split_records(m, splits, heads_split)
    checks = []
    names = ", ".join(r.name for r in outputs) or "the outputs"
    layer = ("nn.Linear" if any(o.name == "linear" for o in products)
             else products[0].name if products else "")
    checks.append(Check(f"{names} {'each equal' if len(outputs) > 1 else 'equals'} "
                        f"x @ W{'.weight.T' if layer == 'nn.Linear' else '.T' if any_transposed else ''}"
                        f"{' + b' if has_bias else ''} ({layer}"
                        f"{', with bias' if has_bias else ', no bias'})", ok_all))
    if m.b.head_modules and kind == "project":
        checks.append(Check(f"each of the {s.h} heads ran as its own module with its own "
                            f"layers; shown side by side as one fused module would hold them",
                            None))
    out_snap = outputs[0] if outputs else None
    shape_out = out_snap.shape if out_snap else x_snap.shape
    explanation = None
    title = None
    fused = kind == "project" and any(op.index in g.fused for op in products)
    if fused:
        title = "Project to queries, keys and values with one fused layer"
    if kind == "project":
        if m.b.per_head:
            explanation = PER_HEAD_PROJECT.format(h=s.h)
        elif splits:
            explanation = FUSED_PROJECT
        elif fused:
            explanation = FUSED_WHOLE.format(W=products[0].out.shape[-1])
        elif layer != "nn.Linear":
            explanation = EINSUM_ROWS_PROJECT if einsum_rows else MATMUL_PROJECT
        head_axis_all = all(head_axis_product(g, op) for op in products)
        if head_axis_all and products:
            explanation = HEAD_AXIS_PROJECT + _apart(m, products)
        widths = {role: int(np.prod(ops[0].out.shape[2:])) if head_axis_product(g, ops[0])
                  else ops[0].out.shape[-1] for role, ops in by_role.items() if ops}
        if not m.b.per_head and not splits and not fused and any(w != s.C for w in widths.values()):
            explanation = _narrow_explanation(widths, s.C, s.d_h)
    elif layer != "nn.Linear":
        explanation = (EINSUM_ROWS_W_O if einsum_rows else MATMUL_W_O) + _apart(m, products)
    if kind == "project" and explanation and not explanation.endswith(_apart(m, products)):
        explanation += _apart(m, products)
    stage = m.stage(unit, stage_id, kind, tensors + outputs, checks, explanation=explanation,
                       title=title,
                       shape_in=x_snap.shape, shape_out=shape_out,
                       dims_in=m.dims(x_snap.shape, BTC),
                       dims_out=out_snap.dims if out_snap else BTC)
    return stage

def _apart(m: StageMaker, products: list[OpRecord]) -> str:
    """The words for biases added apart from the products (`+ self.b_Q`), from their shapes."""
    found = [f for f in (added_bias(m.g, op) for op in products) if f is not None]
    if not found:
        return ""
    names = ", ".join(f"{ref.name} {tuple(m.snap(ref).shape)}" for _, ref in found)
    per_head = all(m.snap(ref).ndim == 2 for _, ref in found)
    return (f" The bias{'es' if len(found) > 1 else ''} ({names}) "
            f"{'are' if len(found) > 1 else 'is'} added after the product, on a line of "
            f"{'their' if len(found) > 1 else 'its'} own: the same numbers for every token"
            + (", one d_h block per head." if per_head else "."))


def _einsum_reads_rows(g: Graph, op: OpRecord, w_ref: Ref) -> bool:
    """einsum("btc,oc->bto", x, W): W's second letter is the one summed, so the einsum reads
    W as (out, in), as nn.Linear stores it (x @ W.T); "btc,cd->btd" reads it as (in, out)."""
    spec, operands = einsum_spec(op), g.tensor_operands(op)
    if spec is None or w_ref not in operands or len(operands) != 2:
        return False
    ins, out = spec
    letters = ins[operands.index(w_ref)]
    return len(letters) == 2 and letters[0] in out and letters[1] not in out


def _einsum_product(g: Graph, op: OpRecord, m: StageMaker, precision: np.dtype) -> np.ndarray | None:
    """The einsum recomputed from its recorded operands, at the module's precision."""
    spec, operands = einsum_spec(op), g.tensor_operands(op)
    if spec is None or len(spec[0]) != len(operands):
        return None
    ins, out = spec
    return np.einsum(f"{','.join(ins)}->{out}",
                     *(m.snap(r).values.astype(precision, copy=False) for r in operands))


def _narrow_explanation(widths: dict[str, int], C: int, d_h: int) -> str:
    """The words when the projections are not all C x C (shared K/V heads): their true shapes."""
    shapes = "; ".join(f"{role}: ({w}, {C}), {w // d_h} head{'s' if w // d_h != 1 else ''} of "
                       f"d_h = {d_h}" for role, w in sorted(widths.items(),
                                                              key=lambda item: "QKV?".find(item[0])))
    return (f"Linear layers turn every token into a query (what it looks for), a key (what it "
            f"offers) and a value (what it passes on). They are not all C x C here: {shapes} "
            f"(weights stored as (out, in), x @ W.T). The key and value layers make fewer heads "
            f"than the query layer; those K/V heads are shared between query heads further on.")


def _result_of(m: StageMaker, op: OpRecord, unit: Unit) -> Snapshot:
    """The projection's result after its own plumbing (Conv1D's view back to 3-D)."""
    result = op.out
    for i in sorted(unit.ops):
        later = m.op(i)
        if i > op.index and later.name in ("view", "reshape") and later.inputs and \
                later.inputs[0].op == op.index:
            result = later.out
    return result

def _projection_records(m: StageMaker, role: str, ops: list[OpRecord], weights: list, biases: list,
                        outs: list, tensors: list[TensorRecord], outputs: list[TensorRecord],
                        heads_split: bool, kind: str) -> None:
    b, s = m.b, m.s
    if not ops:
        return
    first_w_ref, first_w, out_in = weights[0]
    name = m.tensor_name(ops[0], fallback="out" if kind == "w_o" else role)
    leaf = ops[0].module.rsplit(".", 1)[-1]
    if leaf and leaf not in ops[0].source.text:  # the line is inside the layer (Conv1D)
        name = "out" if kind == "w_o" else f"{ops[0].module}(x)"
    if len(ops) > 1:  # one layer per head: rows stacked as a fused layer's
        values = np.concatenate([w.values if o else w.values.T for _, w, o in weights], axis=0)
        w_name = re.sub(r"\.\d+(?=\.|$)", ".*", first_w_ref.name)
        w_rec = b.record(f"{w_name}", first_w, ("C_out", "C_in"), values=values, head_split=0,
                         caption=f"each head's own layer, stacked: rows {s.d_h} at a time are "
                                 f"one head's (stored as (out, in) per head)")
        out_values = np.concatenate([last.values for _, last in outs], axis=-1)
        out_rec = b.record(name, outs[0][1], BTC if out_values.shape[-1] == s.C else None,
                           values=out_values, head_split=2,
                           caption=f"heads side by side: channels {s.d_h} at a time come "
                                   f"from one head's module")
    else:
        last = outs[0][1]
        if out_in:
            caption = (f"stored as (out, in); {name} = x @ {first_w_ref.name}.T"
                       f"{' + bias' if biases else ''}")
            dims = ("C_out", "C_in")
            split_axis = 0
        else:
            caption = f"stored as (in, out); {name} = x @ {first_w_ref.name}{' + bias' if biases else ''}"
            dims = ("C_in", "C_out")
            split_axis = 1
        wide = first_w.values.shape[split_axis] == s.C
        if kind == "project" and heads_split and wide:
            caption += f"; {'rows' if out_in else 'columns'} {s.d_h} at a time feed one head"
        if kind == "w_o":
            caption = (f"stored as ({'out, in' if out_in else 'in, out'}); columns in blocks "
                       f"of d_h come from one head each, and every row reads all of them"
                       if out_in else
                       "stored as (in, out); rows in blocks of d_h come from one head each, "
                       "and every column reads all of them")
            split_axis = 1 if out_in else 0
        laid = None
        if first_w.values.ndim == 3:  # a head-axis weight, shown as the layer it is
            lin = linear_parts(m.g, ops[0])
            laid = None if lin is None else lin[1]
            caption = (f"stored with a head axis as {tuple(first_w.values.shape)}; shown as the "
                       f"{'(h*d_h, C)' if kind == 'project' else '(C, h*d_h)'} (out, in) layer "
                       f"it is, blocks of d_h={s.d_h} one head each")
            wide = True
        w_rec = b.record(first_w_ref.name, first_w, dims, values=laid,
                         head_split=split_axis if (wide or kind == "w_o") and s.h > 1 else None,
                         caption=caption)
        # What the trace knows the output is: K or V with h_kv heads (where it goes), a
        # fused q | k | v (the op the classifier found fused), else (B, T, C).
        prefer: list[tuple[str, ...]] = []
        if kind == "project" and ops[0].index in m.g.fused:
            prefer = [d for d in [b.fused(last.shape[-1])] if d]
        elif kind == "project" and role in ("K", "V"):
            prefer = list(b.kv(BTC))
        dims = m.dims(last.shape, *prefer, BTC)
        kv_heads = dims[-1:] == ("h_kv*d_h",)
        per_head = kind == "project" and s.h > 1 and (last.shape[-1] == s.C or kv_heads)
        out_rec = b.record(name, last, dims,
                           share=("x", m.snap(m.x_in(ops[0]))),
                           head_split=2 if per_head else None,
                           caption=f"channels in blocks of d_h={s.d_h}, one block per K/V head "
                                   f"({b.h_kv} of them)" if kv_heads else
                           f"channels in blocks of d_h={s.d_h}, one block per head"
                           if kind == "project" and last.shape[-1] == s.C and heads_split else
                           _fused_caption(dims, s.C) if kind == "project" else "")
    tensors.append(w_rec)
    for bias_name, bias in biases[:1] if len(ops) == 1 else []:
        name_of_bias = bias_name or f"{first_w_ref.name.rsplit('.', 1)[0]}.bias"
        if bias.values.ndim == 2:  # b_Q (h, d_h): one d_h block per head, added to each token
            tensors.append(b.record(name_of_bias, bias, ("h", "d_h"),
                                    caption=f"added after the product: one d_h = {s.d_h} block "
                                            f"per head, the same for every token"))
        else:
            tensors.append(b.record(name_of_bias, bias, ("C",)))
    outputs.append(out_rec)

def _fused_caption(dims: tuple[str, ...], C: int) -> str:
    if dims[-1:] == ("3C",):
        return f"q, k and v side by side: 3C = {3 * C} channels per token"
    if dims[-1:] == ("(h+2*h_kv)*d_h",):
        return "q (h heads), k and v (h_kv heads each) side by side, d_h channels per head"
    return ""


def _split_records(m: StageMaker, splits: list[OpRecord], heads_split: bool) -> list[TensorRecord]:
    b, s = m.b, m.s
    records = []
    for op in splits:
        source = m.snap(m.x_in(op))
        for n, out in enumerate(op.outputs):
            part = n
            if op.name == "getitem" and len(op.args) > 1 and isinstance(op.args[1], int):
                part = op.args[1]
            name = m.tensor_name(op, part, fallback="qkv"[part] if part < 3 else f"part{part}")
            records.append(b.record(name, out, m.dims(out.shape, BTC),
                                    share=("the fused projection", source),
                                    head_split=2 if out.shape[-1] == s.C and s.h > 1 else None,
                                    caption=f"part {part} of the fused (C, 3C) projection; "
                                            f"channels in blocks of d_h={s.d_h}"))
    return records


def add_param_check(stages: list[Stage], n_params: int, b: Builder) -> None:
    """The first projection stage also says how many parameters the module has."""
    for i, stage in enumerate(stages):
        if stage.kind == "project":
            C = b.sizes.C
            four = n_params == 4 * C * C
            label = (f"the module has {n_params} parameters = 4 * C^2 = 4 * {C}^2, whatever h is"
                     if four else f"the module has {n_params} parameters")
            stages[i] = replace(stage, checks=(*stage.checks, Check(label, None)))
            return


# ---------------------------------------------------------------------- judging


def linear_row(j: Judge, stage: Stage, kind: str) -> Row:
    ops = [op for op in stage.ops if op.name in PRODUCTS and j.g.from_x[op.index]
           and linear_parts(j.g, op) is not None]
    if not ops:
        return j.row(stage, kind, None, None, "no weight product recognised; not judged")
    worst, ok, bias = 0.0, True, False
    for op in ops:
        x, w, b = linear_parts(j.g, op)  # type: ignore[misc]
        made = op.out
        added = added_bias(j.g, op) if b is None else None
        if added is not None and added[0] in stage.ops:  # `x @ W + self.b`, written apart
            made, b = added[0].out, f64(j.g.snap(added[1]).values).reshape(-1)
        # a head-axis W_O reads z (B, T, h, d_h) as its (B, T, h*d_h) flattening
        expected = f64(j.g.snap(x).values).reshape(-1, w.shape[1]) @ w.T + (0 if b is None else b)
        good, d = close(made.values, expected.reshape(made.shape))
        ok &= good
        worst = max(worst, d)
        bias |= b is not None
    b_text = " + b" if bias else ""
    checked = (f"Q, K, V = x @ W^T{b_text}: linear maps of the input x" if kind == "project"
               else f"out = concat @ W_O^T{b_text}: a linear map of the concat")
    return j.row(stage, kind, ok, worst, checked)

# ------------------------------------------------------------ head forms


def judge(j: Judge) -> list[Row]:
    """Each projection stage: Q, K, V are linear maps of x, each role from its own."""
    rows = [linear_row(j, s, "project") for s in j.trace.stages if s.kind == "project"]
    return rows + own_projections(j) + two_sequences(j)


_ROLE_WORDS = {"Q": "queries", "K": "keys", "V": "values"}


def two_sequences(j: Judge) -> list[Row]:
    """Cross-attention: Q made from the query sequence, K and V from the context. The
    classic bug -- keys or values from the query sequence -- is wrong at the projection that
    read the wrong input (with T_q != T_k the forward then fails further on; with T_q ==
    T_k nothing else would tell)."""
    query, context = j.g.query_names, j.g.key_names
    if not context:
        return []
    stage = next((s for s in j.trace.stages if s.kind == "project"), None)
    given = _torch_attention_given(j)
    if given is not None:
        return [given]
    found: list[tuple[str, OpRecord]] = []
    for role, entries in j.head_operands().items():
        for _, ref, _consumer in entries:
            _, _, product, _ = j.chain_to_projection(ref, through=True)
            if product is not None:
                found.append((role, product))
    if j.g.rec.error is not None and {role for role, _ in found} == {"Q", "K"}:
        # The forward failed before the values were used (T_q != T_k): the projection that
        # is neither Q's nor K's is V's.
        used = {op.index for _, op in found}
        found += [("V", op) for op in j.g.ops if j.kind(op) == "project" and op.index not in used
                  and linear_parts(j.g, op) is not None]
    for role, product in found:
        reads = j.g.reads[product.index]
        want, other = (query, context) if role == "Q" else (context, query)
        if reads & want or not reads & other:
            continue
        made = "the context" if role == "Q" else "the query sequence"
        should = "the query sequence" if role == "Q" else "the context"
        given = ", ".join(sorted(reads & other))
        return [j.row(j.stage_of.get(product.index, stage), "project", False, None,
                      "Q from the query sequence, K and V from the context",
                      source=product.source,
                      diagnosis=("wrong_sequence",
                                 f"the {_ROLE_WORDS[role]} are made from {made} ({given}): "
                                 f"cross-attention makes them from {should}"))]
    return [j.row(stage, "project", True, None,
                  f"Q from the query sequence ({', '.join(sorted(query))}), K and V from the "
                  f"context ({', '.join(sorted(context))})")]


def _torch_attention_given(j: Judge) -> Row | None:
    """nn.MultiheadAttention called with its key or value from the query sequence
    (`self.attn(x, x, context)`): wrong at the learner's call, from the arguments torch's
    module was given (its forward may fail before any projection: key and value of other
    lengths)."""
    query, context = j.g.query_names, j.g.key_names
    for call in j.g.rec.calls:
        if call.class_name != "MultiheadAttention" or not call.library:
            continue
        given = dict(call.inputs)
        for name, role in (("key", "keys"), ("value", "values")):
            ref = given.get(name)
            if ref is None:
                continue
            reads = (frozenset({ref.name}) if ref.kind == "input" else
                     j.g.reads[ref.op] if ref.kind == "op" and ref.op is not None else frozenset())
            if reads & query and not reads & context:
                stage = next((s for s in j.trace.stages if s.kind == "project"), None)
                return j.row(stage, "project", False, None,
                             "Q from the query sequence, K and V from the context",
                             source=call.source,
                             diagnosis=("wrong_sequence",
                                        f"the {role} are made from the query sequence "
                                        f"({', '.join(sorted(reads & query))}): "
                                        f"nn.MultiheadAttention's {name} is the context in "
                                        f"cross-attention"))
    return None


def own_projections(j: Judge) -> list[Row]:
    """Q, K and V each cut from a projection of their own. `context = weights @ q` or
    `scores = q @ q.T` reads one projection in two roles; copied in by role, the reference
    would get that projection's weights twice and agree, so it is judged here: the role that
    took another's projection is wrong at the line that used it, and a projection whose
    output reaches nothing is named."""
    taken: list[tuple[str, OpRecord, np.ndarray]] = []  # role, projection product, its part
    for role, entries in j.head_operands().items():
        for _, ref, consumer in entries:
            part, _, product, _ = j.chain_to_projection(ref, through=True)
            if part is None or product is None:
                continue
            first = next((other for other, op, values in taken if other != role
                          and op.index == product.index and values.shape == part.shape
                          and np.array_equal(values, part, equal_nan=True)), None)
            if first is None:
                taken.append((role, product, part))
                continue
            line = j.where(product.source)[1]
            words = (f"{role} is cut from the projection that made {first} (line {line}): "
                     f"multi-head attention gives Q, K and V a projection each")
            unused = [op for op in _unused_projections(j) if op.index != product.index]
            if unused:
                words += "; " + ", ".join(
                    f"{op.module or api_name(op)}'s output (line {j.where(op.source)[1]})"
                    for op in unused) + " never reaches the output"
            stage = next((s for s in j.trace.stages
                          if any(op.index == consumer.index for op in s.ops)), None)
            kind = stage.kind if stage is not None else "project"
            return [j.row(stage, kind, False, None,
                          f"{role} comes from its own projection",
                          source=consumer.source, diagnosis=("role_shared", words))]
    return []


def _unused_projections(j: Judge) -> list[OpRecord]:
    """The linear maps of x whose output reaches nothing the forward returned."""
    reaches = reaching_output(j.g.rec)
    return [op for op in j.g.ops if j.g.from_x[op.index] and not reaches[op.index]
            and op.name in PRODUCTS and linear_parts(j.g, op) is not None]


def why(cell: Cell) -> Why:
    """A channel of Q, K or V: the token's x dotted with one row of the weight (nn.Linear,
    F.linear, NumPy's x @ W), or with the column or row of a raw weight parameter the product
    reads (x @ W, torch.matmul, x @ W.T, einsum: product_cell)."""
    return projection_why(cell, "W")


def quiz(stage: Stage, trace: Trace) -> tuple[Question, ...]:
    """The shape of a projection's result."""
    return (shape_question(stage, stage.tensors[-1], "the projection"),) if stage.tensors else ()
