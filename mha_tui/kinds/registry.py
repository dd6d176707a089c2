"""The stage kinds in the order their rules are asked, and which module builds each kind.

Every op that depends on the forward's input x is offered to the rules of these kinds, in
this order, and the first rule that answers gives the op its kind; an op no rule claims is
an `op` stage, shown as it ran. Rules read the kinds of *earlier* ops (`g.op_derives`), so
the order below only decides between rules that could claim the *same* op. The contracts,
each with its reason (TorchLens states its postprocessing steps the same way):

- sdpa first: F.scaled_dot_product_attention is one op that is scores, scale, mask,
  softmax and attend at once; nothing after may read it as a part.
- cache before concat and plumbing: torch.cat onto an empty key/value cache only passes
  its input through; concat would otherwise claim a cat downstream of attention.
- norm anywhere before plumbing: it claims only layer_norm / rms_norm ops, which no other
  rule claims; placed early, next to the other ops on x.
- w_o before project: both claim x @ W; downstream of attend it is the output projection.
- residual after w_o: it claims the add of W_O's result and the forward's own input (and
  a LayerNorm of that sum), which it finds from the w_o ops classified before it.
- qkv_split before project, view, transpose and plumbing: a fused layer's split that cuts
  the heads too (timm's reshape/permute/unbind, NeoX's and Falcon's view and slices) is its
  own stage; project's fused split would otherwise keep it in the projection.
- project (its projection, then its fused split) before view, transpose and plumbing: a
  fused (C, 3C) layer's split, unflatten and transpose are still the projection when they
  only cut Q | K | V apart (GPT-2's split, torch's own MHA).
- rotary after project, before view, transpose and plumbing: its ops (slices, reshapes
  into pairs, cat) are shape ops those rules would otherwise claim; a rotation is found
  from the projections its tensors come from, so those are classified first.
- kv_repeat after rotary (K is turned before its heads are repeated), before view and
  plumbing: repeat_kv's expand and reshape are shape ops they would otherwise claim.
- position_bias after mask (a bias holding a mask value is a mask) and before scale and
  concat: it claims an add onto the scores of a finite tensor not made from x.
- view before transpose, both before concat and plumbing: a head split is a shape op, and
  plumbing claims every shape op nobody claimed before it.
- softmax (a call, then one written by hand) before mask and scale: a hand-written
  softmax's sub and div must not be read as a mask or a scale.
- attend before scores: both claim a product of two x-derived tensors; downstream of
  softmax it is weights @ V.
- mask and scale before concat; plumbing last: it is the catch-all for shape ops.

A new mechanism (rotary, shared K/V heads ...) is one module in kinds/ and one line here,
placed by the same kind of reason. Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from types import ModuleType

from . import (
    attend,
    cache,
    concat,
    dropout,
    kv_repeat,
    mask,
    norm,
    op,
    plumbing,
    position_bias,
    project,
    qkv_split,
    residual,
    rotary,
    scale,
    scores,
    sdpa,
    sinks,
    softcap,
    softmax,
    transpose,
    view,
    w_o,
)

KINDS: tuple[ModuleType, ...] = (
    sdpa,
    cache,
    norm,
    w_o,
    residual,
    qkv_split,
    project,
    rotary,
    kv_repeat,
    view,
    transpose,
    sinks,
    softcap,
    softmax,
    dropout,
    attend,
    scores,
    mask,
    position_bias,
    scale,
    concat,
    plumbing,
)

# Every rule, in the order above.
RULES = tuple(rule for kind in KINDS for rule in kind.RULES)

# kind -> the module whose build() makes its stage(s). `aux` ops (cache, plumbing) make no
# stage of their own; `embed` and `error` are placed by assemble.py, not by a unit.
BUILDERS: dict[str, ModuleType] = {
    kind.KIND: kind for kind in (norm, project, qkv_split, rotary, kv_repeat, view, transpose,
                                 scores, scale, mask, position_bias, sinks, softcap,
                                 softmax, dropout, attend,
                                 concat, w_o, residual, sdpa, op)
}

# The check judges kind by kind in this order: (module with judge(j), the kind a row carries
# when that judge fails on an unforeseen module, how the row names it). The head split is one
# judgement over the view and transpose stages (view.judge); sdpa judges its five expanded
# stages at once. The order fixes the order of the verdict's `differences` and of rows at
# the same position, so it is part of the output.
JUDGES: tuple[tuple[ModuleType, str, str], ...] = (
    (norm, "norm", "LayerNorm"),
    (project, "project", "project"),
    (rotary, "rotary", "rotary positions"),
    (kv_repeat, "kv_repeat", "shared K/V heads"),
    (view, "split", "split"),
    (scores, "scores", "scores"),
    (scale, "scale", "scale"),
    (mask, "mask", "mask"),
    (position_bias, "pos_bias", "position bias"),
    (softcap, "softcap", "soft-capping"),
    (sinks, "sinks", "attention sinks"),
    (softmax, "softmax", "softmax"),
    (dropout, "dropout", "dropout"),
    (attend, "attend", "attend"),
    (sdpa, "sdpa", "sdpa"),
    (concat, "concat", "concat"),
    (w_o, "w_o", "output projection"),
    (op, "op", "op"),
)
