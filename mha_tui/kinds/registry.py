"""The one table of stage kinds: every kind in the order its rules are asked, each row with
the reason for its place, and what the recogniser, the judge, `--why` and the quiz read of it.

Every op that depends on the forward's input x is offered to the rules of these kinds, in
this order, and the first rule that answers gives the op its kind; an op no rule claims is
an `op` stage, shown as it ran. Rules read the kinds of *earlier* ops (`g.op_derives`), so
the order only decides between rules that could claim the *same* op; each row's `place`
says why it is where it is (TorchLens states its postprocessing steps the same way). Kinds
with no rule (embed, op, error) close the table: the recogniser places them itself.

A second order is the forward's, as a learner reads it (`step`): it orders the judge's
rows (the verdict's `differences`, and rows at one position, so it is part of the output)
and the kinds `--why` lists.

A new mechanism (rotary, shared K/V heads ...) is one module in kinds/ and one row here,
placed by the same kind of reason. The contract a kind's module keeps is in base.py.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from . import (
    attend,
    cache,
    concat,
    cosine,
    differential,
    dropout,
    embed,
    error,
    kv_cache,
    kv_repeat,
    linear_attn,
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
from .base import Explaining, Growing, Judging, Naming, Quizzing, Rule


@dataclass(frozen=True)
class Kind:
    """One row of the table: a kind's module (a `base.KindModule`) and what the table says
    about it."""

    module: ModuleType
    place: str
    """Why its rules are asked at this point of the table."""
    step: float | None
    """Where its stage sits in the forward as a learner reads it; None for `aux` ops (a
    cache's cat, shape plumbing), which make no stage of their own."""
    judged: tuple[str, str] | None = None
    """For a kind the check judges: (the kind a row carries when its judge fails on an
    unforeseen module, how the row names it). None: its judge is the module's KIND and name."""
    leads: bool = False
    """Its mechanism changes how the heads are laid out (differential attention's two maps
    per head): a row about heads or values is its consequence, so `check` names the
    mechanism first."""

    @property
    def kind(self) -> str:
        return self.module.KIND

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.module.RULES

    @property
    def builds(self) -> bool:
        """Whether a unit of its ops becomes a stage by its build() (embed and error are
        built by assemble.py from the embedding and the error, not from a unit)."""
        return self.step is not None and self.module not in (embed, error)

    @property
    def judge(self) -> Judging | None:
        return getattr(self.module, "judge", None)

    @property
    def why(self) -> Explaining | None:
        return getattr(self.module, "why", None)

    @property
    def quiz(self) -> Quizzing | None:
        return getattr(self.module, "quiz", None)

    @property
    def mechanism(self) -> Naming | None:
        """What `check` says when the module leaves plain attention at a stage of this kind
        (a mechanism plain attention lacks, with its parameters), or None."""
        return getattr(self.module, "mechanism", None)

    @property
    def expected(self) -> str | None:
        """The `--expect` name that grows the reference by this kind's mechanism (softcap,
        qk_norm, ...; records.request.MECHANISMS), or None."""
        return getattr(self.module, "EXPECTED", None)

    @property
    def reference(self) -> Growing | None:
        """With `--expect` its name: the kind's share of the reference, read from the
        module's own stage (its parameters and words), or None when it has none."""
        return getattr(self.module, "reference", None)

    @property
    def judged_as(self) -> tuple[str, str]:
        return self.judged or (self.kind, self.kind)


KINDS: tuple[Kind, ...] = (
    Kind(sdpa, "first: F.scaled_dot_product_attention is one op that is scores, scale, mask, "
         "softmax and attend at once; nothing after may read it as a part.", 15),
    Kind(cache, "before concat and plumbing: torch.cat onto an empty key/value cache only "
         "passes its input through; concat would otherwise claim a cat downstream of attention.",
         None),
    Kind(kv_cache, "after cache (a cat onto an empty cache is only plumbing), before concat "
         "and plumbing: a decode step's cat of the cached keys with the new one would otherwise "
         "be concat's or an op, and a slice assignment into a cache allocated up front no "
         "one's.", 7.5, judged=("kv_cache", "KV cache")),
    Kind(norm, "anywhere before plumbing and before rotary, scale and mask: it claims "
         "layer_norm / rms_norm ops, which no other rule claims, and the ops of a norm written "
         "out (pow, mean, rsqrt, mul) whose multiplies scale would otherwise claim; placed "
         "early, next to the other ops on x.", 1,
         judged=("norm", "LayerNorm")),
    Kind(w_o, "before project: both claim x @ W; downstream of attend it is the output "
         "projection.", 17, judged=("w_o", "output projection")),
    Kind(residual, "after w_o: it claims the add of W_O's result and the forward's own input "
         "(and a LayerNorm of that sum), which it finds from the w_o ops classified before it.",
         18),
    Kind(qkv_split, "before project, view, transpose and plumbing: a fused layer's split that "
         "cuts the heads too (timm's reshape/permute/unbind, NeoX's and Falcon's view and "
         "slices) is its own stage; project's fused split would otherwise keep it in the "
         "projection.", 3),
    Kind(project, "(its projection, then its fused split) before view, transpose and plumbing: "
         "a fused (C, 3C) layer's split, unflatten and transpose are still the projection when "
         "they only cut Q | K | V apart (GPT-2's split, torch's own MHA).", 2),
    Kind(rotary, "after project, before view, transpose and plumbing: its ops (slices, reshapes "
         "into pairs, cat) are shape ops those rules would otherwise claim; a rotation is found "
         "from the projections its tensors come from, so those are classified first.", 4,
         judged=("rotary", "rotary positions")),
    Kind(kv_repeat, "after rotary (K is turned before its heads are repeated), before view and "
         "plumbing: repeat_kv's expand and reshape are shape ops they would otherwise claim.", 5,
         judged=("kv_repeat", "shared K/V heads")),
    Kind(view, "before transpose, both before concat and plumbing: a head split is a shape op, "
         "and plumbing claims every shape op nobody claimed before it. Its judge judges the "
         "head split, over the view and transpose stages.", 6, judged=("split", "split")),
    Kind(transpose, "after view (see view).", 7),
    Kind(cosine, "after project, before softcap, scale and plumbing: its multiply of the "
         "scores by a learned scale would otherwise be scale's (or no one's), and it claims "
         "only F.normalize of a projection's tensor and a multiply of scores made from it.", 4.5,
         judged=("cosine", "cosine attention")),
    Kind(differential, "before softmax, attend, scale, mask and norm: its λ multiply and "
         "subtraction of two softmax maps, and the norm and scale of their difference, would "
         "otherwise be no one's (or scale's, mask's); it claims only ops made from softmax.",
         14.5, judged=("differential", "differential attention"), leads=True),
    Kind(sinks, "before softmax, mask, scale and concat: its cat of a sink column onto the "
         "scores, and the shift by the row max before softmax, would otherwise be concat's or "
         "no one's.", 11.5, judged=("sinks", "attention sinks")),
    Kind(softcap, "before softmax, mask and scale: the divide and multiply around its tanh "
         "are by one number each, and scale would otherwise claim them.", 9.5,
         judged=("softcap", "soft-capping")),
    Kind(softmax, "(a call, then one written by hand) before mask and scale: a hand-written "
         "softmax's sub and div must not be read as a mask or a scale.", 12),
    Kind(dropout, "anywhere before plumbing: it claims only dropout ops on x-derived tensors, "
         "which no other rule claims.", 13),
    Kind(attend, "before scores: both claim a product of two x-derived tensors; downstream of "
         "softmax it is weights @ V.", 14),
    Kind(scores, "after attend (see attend).", 8),
    Kind(mask, "before position_bias (a bias holding a mask value is a mask), scale and "
         "concat.", 10),
    Kind(position_bias, "after mask and before scale and concat: it claims an add onto the "
         "scores of a finite tensor not made from x.", 11, judged=("pos_bias", "position bias")),
    Kind(scale, "before concat.", 9),
    Kind(linear_attn, "after every kind of softmax attention, before concat and plumbing: it "
         "claims only what no earlier rule did, in a forward with no softmax at all.", 14.2),
    Kind(concat, "after mask and scale, before plumbing.", 16),
    Kind(plumbing, "last of the rules: it is the catch-all for shape ops.", None),
    Kind(embed, "no rule: the embedding lookup before the forward, placed first by assemble.py.",
         0),
    Kind(op, "no rule: what no rule claims is an op stage, shown as it ran (and the fallback "
         "when a kind's build fails).", 19),
    Kind(error, "no rule: the error a forward ended in, placed last by assemble.py.", 20),
)

RULES: tuple[Rule, ...] = tuple(rule for row in KINDS for rule in row.rules)
"""Every rule, in the table's order."""

FORWARD: tuple[Kind, ...] = tuple(sorted((row for row in KINDS if row.step is not None),
                                         key=lambda row: row.step or 0.0))
"""The kinds that make stages, in the forward's order (the judge's, `--why`'s)."""

BY_KIND: dict[str, Kind] = {row.kind: row for row in FORWARD}
"""Stage kind -> its row."""

EXPECTED: dict[str, Kind] = {row.expected: row for row in FORWARD if row.expected}
"""An `--expect` name (softcap, qk_norm, ...) -> the row of the kind that grows it."""


def builder(kind: str) -> ModuleType:
    """The module whose build() makes the stage(s) of a unit of this kind."""
    row = BY_KIND[kind]
    if not row.builds:
        raise KeyError(kind)
    return row.module
