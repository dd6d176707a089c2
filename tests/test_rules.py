"""Each recognition rule on its own: a small hand-built recording (ops, shapes, values, no
torch), classified by the registry's rules, and the kind each op gets.

The end-to-end tests (test_recognise, test_models_traced) trace real modules; these pin
what each rule claims and what it leaves alone, so a new kind's rule is tested the same way.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_tui.kinds.registry import KINDS, RULES, builder
from mha_tui.ops.graph import Graph
from mha_tui.ops.sizes import Sizes
from mha_tui.recognise.classify import classify
from mha_tui.records import ModuleCall, OpRecord, Recording, Ref, Snapshot, Statement, TensorArg

B, T, C, H, D = 1, 3, 4, 2, 2
SIZES = Sizes(B, T, C, H, D)


def _snap(values: np.ndarray) -> Snapshot:
    values = np.asarray(values)
    strides = tuple(s // values.itemsize for s in values.strides) if values.itemsize else ()
    return Snapshot(values=values, shape=tuple(values.shape), strides=strides, contiguous=True,
                    storage=id(values), dtype=str(values.dtype))


def _param(name: str, values: np.ndarray, kind: str = "param") -> Ref:
    return Ref(kind, name=name, snapshot=_snap(values))  # type: ignore[arg-type]


class Tape:
    """A recording written op by op, each op's output computed here with NumPy."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.x_values = rng.standard_normal((B, T, C)).astype(np.float32)
        self.x = Ref("input", name="x")
        self.ops: list[OpRecord] = []
        self.calls: list[ModuleCall] = []  # submodule forwards, as the tracer's hooks saw them

    def values(self, ref: Ref) -> np.ndarray:
        if ref.kind == "input":
            return self.x_values
        if ref.kind == "op":
            assert ref.op is not None
            return self.ops[ref.op].outputs[ref.output].values
        assert ref.snapshot is not None
        return ref.snapshot.values

    def op(self, name: str, inputs: list[Ref], out: np.ndarray | list[np.ndarray], *scalars: object,
           **kwargs: object) -> Ref:
        outs = out if isinstance(out, list) else [out]
        index = len(self.ops)
        self.ops.append(OpRecord(
            index=index, name=name, qualname=name, module="", module_class="", inputs=tuple(inputs),
            args=(*(TensorArg(i) for i in range(len(inputs))), *scalars),
            kwargs=tuple(kwargs.items()), outputs=tuple(_snap(o) for o in outs),
            source=Statement("attn.py", 10 + index, f"t{index} = {name}(...)")))
        return Ref("op", op=index)

    def weight(self, name: str, rows: int = C) -> Ref:
        return _param(name, self.rng.standard_normal((rows, C)).astype(np.float32))

    def linear(self, x: Ref, name: str, rows: int = C) -> Ref:
        w = self.weight(name, rows)
        return self.op("linear", [x, w], self.values(x) @ self.values(w).T)

    def heads(self, t: Ref) -> Ref:
        """(B, T, C) -> view (B, T, h, d_h) -> transpose (B, h, T, d_h)."""
        viewed = self.op("view", [t], self.values(t).reshape(B, T, H, D), B, T, H, D)
        return self.op("transpose", [viewed], self.values(viewed).transpose(0, 2, 1, 3), 1, 2)

    def kinds(self, sizes: Sizes = SIZES) -> list[str | None]:
        rec = Recording("Attn", "attn.py", (("x", _snap(self.x_values)),), tuple(self.ops),
                        tuple(self.calls))
        g = Graph(rec)
        classify(g, sizes)
        return [g.kind.get(i) for i in range(len(self.ops))]

    def kind(self, ref: Ref) -> str | None:
        return self.kinds()[ref.op]  # type: ignore[index]


def _attention_upto_scores(tape: Tape) -> tuple[Ref, Ref, Ref, Ref]:
    """q, k, v projected and split into heads, then q @ k^T: (q, k, v, scores)."""
    q, k, v = (tape.heads(tape.linear(tape.x, f"W_{r}.weight")) for r in "QKV")
    kt = tape.op("transpose", [k], np.swapaxes(tape.values(k), -2, -1), -2, -1)
    scores = tape.op("matmul", [q, kt], tape.values(q) @ tape.values(kt))
    return q, kt, v, scores


def _causal() -> np.ndarray:
    return np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, 0).astype(np.float32)


def _softmax(values: np.ndarray) -> np.ndarray:
    e = np.exp(values - values.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _whole(tape: Tape) -> dict[str, Ref]:
    """The textbook forward, op by op, with a name for each step."""
    q, kt, v, scores = _attention_upto_scores(tape)
    scaled = tape.op("div", [scores], tape.values(scores) / math.sqrt(D), math.sqrt(D))
    mask = _param("causal_mask", _causal(), "buffer")
    masked = tape.op("add", [scaled, mask], tape.values(scaled) + _causal())
    weights = tape.op("softmax", [masked], _softmax(tape.values(masked)), dim=-1)
    context = tape.op("matmul", [weights, v], tape.values(weights) @ tape.values(v))
    moved = tape.op("transpose", [context], tape.values(context).transpose(0, 2, 1, 3), 1, 2)
    merged = tape.op("view", [moved], tape.values(moved).reshape(B, T, C), B, T, C)
    out = tape.linear(merged, "W_O.weight")
    return {"q": q, "kt": kt, "scores": scores, "scaled": scaled, "masked": masked,
            "weights": weights, "context": context, "moved": moved, "merged": merged, "out": out}


# ---------------------------------------------------------------------------- the registry


def test_registry_lists_every_rule_once_in_kind_order() -> None:
    """RULES is the kinds' rules in KINDS order; every kind a rule can give has a builder;
    every row says why it is where it is."""
    assert RULES == tuple(rule for row in KINDS for rule in row.module.RULES)
    assert len(set(RULES)) == len(RULES)
    given = {row.kind for row in KINDS if row.rules} - {"aux"}
    assert all(builder(kind).KIND == kind for kind in given)
    assert all(row.place for row in KINDS)
    order = [row.kind for row in KINDS]
    assert order.index("w_o") < order.index("project")
    assert order.index("attend") < order.index("scores")
    ruled = [row for row in KINDS if row.rules]
    assert ruled[-1].kind == "aux"  # plumbing, the catch-all for shape ops, comes last


def test_textbook_forward_every_op_its_kind() -> None:
    """The whole recipe: each op gets the kind a learner would name."""
    tape = Tape()
    _whole(tape)
    assert tape.kinds() == [
        "project", "view", "transpose", "project", "view", "transpose", "project", "view",
        "transpose", "aux", "scores", "scale", "mask", "softmax", "attend", "concat", "concat", "w_o"]


# ---------------------------------------------------------------------------- one rule each


def test_projection_claims_x_times_a_weight() -> None:
    tape = Tape()
    q = tape.linear(tape.x, "W_Q.weight")
    assert tape.kind(q) == "project"


def test_projection_needs_a_weight_parameter() -> None:
    """x times x (no parameter) is not a projection."""
    tape = Tape()
    xx = tape.op("matmul", [tape.x, tape.x], tape.x_values @ np.swapaxes(tape.x_values, -1, -2))
    assert tape.kind(xx) != "project"


def test_output_projection_claims_the_weight_product_after_attend() -> None:
    tape = Tape()
    steps = _whole(tape)
    assert tape.kind(steps["out"]) == "w_o"


def test_fused_split_keeps_a_fused_layers_split_in_the_projection() -> None:
    """One (3C, C) layer and its split into q, k, v: all the projection."""
    tape = Tape()
    qkv = tape.linear(tape.x, "c_attn.weight", rows=3 * C)
    parts = np.split(tape.values(qkv), 3, axis=-1)
    split = tape.op("split", [qkv], parts, C, dim=2)
    assert tape.kinds()[qkv.op] == "project"  # type: ignore[index]
    assert tape.kind(split) == "project"


def test_a_projecting_layer_call_gives_its_inner_ops_to_the_projection() -> None:
    """GPT-2's Conv1D: view, addmm, view inside one leaf module call, all the projection."""
    tape = Tape()
    tape.x = Ref("input", name="x", snapshot=_snap(tape.x_values))
    flat = tape.op("view", [tape.x], tape.x_values.reshape(B * T, C), B * T, C)
    w = tape.weight("c_attn.weight")
    product = tape.op("addmm", [flat, w], tape.values(flat) @ tape.values(w))
    back = tape.op("view", [product], tape.values(product).reshape(B, T, C), B, T, C)
    tape.calls.append(ModuleCall("c_attn", "Conv1D", False, 0, 3))
    assert tape.kinds() == ["project", "project", "project"]
    assert tape.kind(back) == "project"


def test_a_leaf_call_that_is_attention_itself_keeps_its_ops_kinds() -> None:
    """A wrapped nn.MultiheadAttention is one leaf call (its out_proj is never called as a
    module): its ops are the whole recipe, never all folded into one projection."""
    tape = Tape()
    _whole(tape)
    tape.calls.append(ModuleCall("attn", "MultiheadAttention", True, 0, len(tape.ops)))
    kinds = tape.kinds()
    assert kinds[0] == "project" and kinds[-1] == "w_o"
    assert {"scores", "softmax", "attend", "concat"} <= set(kinds)


def test_head_split_claims_the_view_into_heads() -> None:
    tape = Tape()
    q = tape.linear(tape.x, "W_Q.weight")
    viewed = tape.op("view", [q], tape.values(q).reshape(B, T, H, D), B, T, H, D)
    assert tape.kind(viewed) == "view"


def test_head_split_leaves_a_view_that_does_not_cut_heads() -> None:
    """A view to (B, T * C) is no head split: plumbing."""
    tape = Tape()
    q = tape.linear(tape.x, "W_Q.weight")
    flat = tape.op("view", [q], tape.values(q).reshape(B, T * C), B, T * C)
    assert tape.kind(flat) == "aux"


def test_head_move_claims_the_transpose_after_the_view() -> None:
    tape = Tape()
    q, kt, _, _ = _attention_upto_scores(tape)
    assert tape.kind(q) == "transpose"
    assert tape.kind(kt) == "aux"  # k.transpose(-2, -1) is part of q @ k^T, not a head move


def test_query_key_product_claims_the_scores() -> None:
    tape = Tape()
    _, _, _, scores = _attention_upto_scores(tape)
    assert tape.kind(scores) == "scores"


def test_scale_claims_a_division_of_the_scores_by_one_number() -> None:
    tape = Tape()
    assert tape.kind(_whole(tape)["scaled"]) == "scale"


def test_scale_leaves_a_division_by_a_tensor() -> None:
    tape = Tape()
    _, _, _, scores = _attention_upto_scores(tape)
    other = _param("norms", np.full((T, T), 2.0, np.float32), "const")
    divided = tape.op("div", [scores, other], tape.values(scores) / 2.0)
    assert tape.kind(divided) == "op"


def test_mask_claims_adding_a_minus_inf_buffer() -> None:
    tape = Tape()
    assert tape.kind(_whole(tape)["masked"]) == "mask"


def test_mask_claims_masked_fill_with_a_large_negative() -> None:
    tape = Tape()
    _, _, _, scores = _attention_upto_scores(tape)
    blocked = _param("bias", np.triu(np.ones((T, T), bool), 1), "buffer")
    filled = tape.op("masked_fill", [scores, blocked],
                     np.where(np.triu(np.ones((T, T), bool), 1), -1e9, tape.values(scores)), -1e9)
    assert tape.kind(filled) == "mask"


def test_mask_leaves_adding_a_small_bias() -> None:
    """Adding numbers that block nothing is not a mask."""
    tape = Tape()
    _, _, _, scores = _attention_upto_scores(tape)
    bias = _param("bias", np.ones((T, T), np.float32), "buffer")
    added = tape.op("add", [scores, bias], tape.values(scores) + 1)
    assert tape.kind(added) == "op"


def test_softmax_claims_the_softmax_call() -> None:
    tape = Tape()
    assert tape.kind(_whole(tape)["weights"]) == "softmax"


def test_handwritten_softmax_claims_every_op_of_it() -> None:
    """max, subtract, exp, sum, divide: one softmax."""
    tape = Tape()
    _, _, _, scores = _attention_upto_scores(tape)
    s = tape.values(scores)
    peak = tape.op("amax", [scores], s.max(axis=-1, keepdims=True), -1)
    shifted = tape.op("sub", [scores, peak], s - s.max(axis=-1, keepdims=True))
    e = tape.op("exp", [shifted], np.exp(tape.values(shifted)))
    total = tape.op("sum", [e], tape.values(e).sum(axis=-1, keepdims=True), -1)
    weights = tape.op("div", [e, total], tape.values(e) / tape.values(total))
    kinds = tape.kinds()
    assert [kinds[r.op] for r in (peak, shifted, e, total, weights)] == ["softmax"] * 5  # type: ignore[index]


def test_dropout_claims_a_dropout_on_the_weights() -> None:
    tape = Tape()
    steps = _whole(tape)
    dropped = tape.op("dropout", [steps["weights"]], tape.values(steps["weights"]), p=0.1, training=False)
    assert tape.kind(dropped) == "dropout"


def test_weights_times_values_claims_attend() -> None:
    """A product of two x-derived tensors after softmax is attend, never scores."""
    tape = Tape()
    assert tape.kind(_whole(tape)["context"]) == "attend"


def test_concat_claims_the_heads_put_back_side_by_side() -> None:
    tape = Tape()
    steps = _whole(tape)
    assert tape.kind(steps["moved"]) == "concat"
    assert tape.kind(steps["merged"]) == "concat"


def test_fused_attention_claims_scaled_dot_product_attention() -> None:
    tape = Tape()
    q, k, v = (tape.heads(tape.linear(tape.x, f"W_{r}.weight")) for r in "QKV")
    weights = _softmax(tape.values(q) @ np.swapaxes(tape.values(k), -2, -1) / math.sqrt(D) + _causal())
    fused = tape.op("scaled_dot_product_attention", [q, k, v], weights @ tape.values(v), is_causal=True)
    moved = tape.op("transpose", [fused], tape.values(fused).transpose(0, 2, 1, 3), 1, 2)
    assert tape.kind(fused) == "sdpa"
    assert tape.kind(moved) == "concat"


def test_cache_append_is_plumbing() -> None:
    """torch.cat onto an empty key cache passes k through: no stage of its own."""
    tape = Tape()
    k = tape.heads(tape.linear(tape.x, "W_K.weight"))
    empty = _param("cache_k", np.zeros((B, H, 0, D), np.float32), "buffer")
    appended = tape.op("cat", [empty, k], tape.values(k), dim=2)
    assert tape.kind(appended) == "aux"


def test_plumbing_claims_a_leftover_shape_op() -> None:
    tape = Tape()
    q = tape.linear(tape.x, "W_Q.weight")
    same = tape.op("contiguous", [q], tape.values(q))
    assert tape.kind(same) == "aux"


def test_an_op_no_rule_claims_is_an_op() -> None:
    """Nothing is dropped: tanh on the scores is shown as it ran."""
    tape = Tape()
    _, _, _, scores = _attention_upto_scores(tape)
    squashed = tape.op("tanh", [scores], np.tanh(tape.values(scores)))
    assert tape.kind(squashed) == "op"


@pytest.mark.parametrize("name", ["ones", "triu"])
def test_ops_that_do_not_depend_on_x_get_no_kind(name: str) -> None:
    """A mask built inside the forward (torch.ones(T, T).triu()) is a helper, not a stage."""
    tape = Tape()
    made = tape.op(name, [_param("c", np.ones((T, T), np.float32), "const")], np.ones((T, T)))
    assert tape.kinds()[made.op] is None  # type: ignore[index]


# ---------------------------------------------------------------------------- fused splits


def _timm_split(tape: Tape) -> list[Ref]:
    """timm: qkv(x).reshape(B, T, 3, h, d_h).permute(2, 0, 3, 1, 4).unbind(0)."""
    qkv = tape.linear(tape.x, "qkv.weight", rows=3 * C)
    shaped = tape.op("reshape", [qkv], tape.values(qkv).reshape(B, T, 3, H, D), B, T, 3, H, D)
    moved = tape.op("permute", [shaped], tape.values(shaped).transpose(2, 0, 3, 1, 4), 2, 0, 3, 1, 4)
    parts = tape.op("unbind", [moved], list(tape.values(moved)), 0)
    return [qkv, shaped, moved, parts]


def test_a_fused_split_that_cuts_heads_is_its_own_stage() -> None:
    """timm's reshape/permute/unbind: the heads come out of the split, so it is qkv_split;
    the linear layer stays the projection."""
    tape = Tape()
    qkv, shaped, moved, parts = _timm_split(tape)
    kinds = tape.kinds()
    assert kinds[qkv.op] == "project"  # type: ignore[index]
    assert [kinds[r.op] for r in (shaped, moved, parts)] == ["qkv_split"] * 3  # type: ignore[index]


def test_a_fused_split_into_whole_parts_stays_in_the_projection() -> None:
    """GPT-2's split(C, dim=2) cuts no heads (the view stage does later): still project."""
    tape = Tape()
    qkv = tape.linear(tape.x, "c_attn.weight", rows=3 * C)
    split = tape.op("split", [qkv], np.split(tape.values(qkv), 3, axis=-1), C, dim=2)
    viewed = tape.op("view", [Ref("op", op=split.op, output=0)],
                     np.split(tape.values(qkv), 3, axis=-1)[0].reshape(B, T, H, D), B, T, H, D)
    kinds = tape.kinds()
    assert kinds[split.op] == "project"  # type: ignore[index]
    assert kinds[viewed.op] == "view"  # type: ignore[index]


def test_x_times_a_transposed_weight_is_a_projection() -> None:
    """Falcon's `input @ self.weight.T`: the weight reaches the matmul through a T op."""
    tape = Tape()
    w = tape.weight("query_key_value.weight", rows=(H + 2) * D)
    wt = tape.op("T", [w], tape.values(w).T)
    product = tape.op("matmul", [tape.x, wt], tape.x_values @ tape.values(wt))
    assert tape.kind(product) == "project"


def test_a_multi_query_fused_layer_is_fused_and_split() -> None:
    """Falcon: h query heads and one K and one V head in one (h + 2) d_h wide layer, viewed
    as (B, T, h + 2, d_h) and sliced: the view and slices are the split."""
    tape = Tape()
    w = tape.weight("query_key_value.weight", rows=(H + 2) * D)
    wt = tape.op("T", [w], tape.values(w).T)
    fused = tape.op("matmul", [tape.x, wt], tape.x_values @ tape.values(wt))
    viewed = tape.op("view", [fused], tape.values(fused).reshape(B, T, H + 2, D), B, T, H + 2, D)
    q = tape.op("getitem", [viewed], tape.values(viewed)[..., :-2, :])
    k = tape.op("getitem", [viewed], tape.values(viewed)[..., [-2], :])
    kinds = tape.kinds()
    assert [kinds[r.op] for r in (fused, viewed, q, k)] == [  # type: ignore[index]
        "project", "qkv_split", "qkv_split", "qkv_split"]


def test_fused_width_is_3c_or_h_plus_two_kv_blocks() -> None:
    from mha_tui.kinds.qkv_split import fused_width

    assert fused_width(3 * C, SIZES)
    assert fused_width(C + 2 * D, SIZES)  # one K/V head
    assert not fused_width(C, SIZES) and not fused_width(C + D, SIZES) and not fused_width(4 * C, SIZES)


@pytest.mark.parametrize("roles,layout", [
    ([("Q", [0, 1]), ("K", [2, 3]), ("V", [4, 5])], "[q0 q1 | k0 k1 | v0 v1]"),
    ([("Q", [0, 3]), ("K", [1, 4]), ("V", [2, 5])], "[q0 k0 v0 | q1 k1 v1]"),
    ([("Q", [0, 1, 2, 3]), ("K", [4]), ("V", [5])], "[q0 q1 q2 q3 | k0 | v0]"),
])
def test_layout_text_names_each_block_of_the_fused_output(roles: list, layout: str) -> None:
    from mha_tui.kinds.qkv_split import layout_text

    assert layout_text(roles, sum(len(blocks) for _, blocks in roles)) == layout


# ---------------------------------------------------------------------------- residual


def _residual_tape() -> tuple[Tape, dict[str, Ref]]:
    tape = Tape()
    tape.x = Ref("input", name="x", snapshot=_snap(tape.x_values))
    steps = _whole(tape)
    return tape, steps


def test_the_input_added_back_after_w_o_is_the_residual() -> None:
    """BLOOM's `residual + out` and BERT's `LayerNorm(out + input)`: the add, and the norm of
    the sum, are the residual stage."""
    tape, steps = _residual_tape()
    summed = tape.op("add", [steps["out"], tape.x], tape.values(steps["out"]) + tape.x_values)
    normed = tape.op("layer_norm", [summed], tape.values(summed), (C,), eps=1e-12)
    kinds = tape.kinds()
    assert kinds[steps["out"].op] == "w_o"  # type: ignore[index]
    assert [kinds[summed.op], kinds[normed.op]] == ["residual", "residual"]  # type: ignore[index]


def test_an_add_before_w_o_or_of_no_input_is_no_residual() -> None:
    """x + q (before attention) and out + out (no forward input) are not the residual."""
    tape, steps = _residual_tape()
    early = tape.op("add", [steps["q"], steps["q"]], tape.values(steps["q"]) * 2)
    doubled = tape.op("add", [steps["out"], steps["out"]], tape.values(steps["out"]) * 2)
    kinds = tape.kinds()
    assert kinds[early.op] != "residual" and kinds[doubled.op] != "residual"  # type: ignore[index]


def test_the_scores_are_scaled_once() -> None:
    """Gemma 2's soft-capping divides the scaled scores again: that is not the scale (it
    joined the scale stage and made its "factor 1/sqrt(d_h)" wrong)."""
    tape = Tape()
    *_, scores = _attention_upto_scores(tape)
    scaled = tape.op("mul", [scores], tape.values(scores) / math.sqrt(D), 1 / math.sqrt(D))
    capped = tape.op("div", [scaled], tape.values(scaled) / 0.5, 0.5)
    kinds = tape.kinds()
    assert kinds[scaled.op] == "scale" and kinds[capped.op] != "scale"  # type: ignore[index]


def test_scores_times_one_after_a_scaled_q_is_still_the_scale() -> None:
    """OPT: q scaled before the product, then `scores * 1.0`: both the scale stage."""
    tape = Tape()
    q, kt, _, _ = _attention_upto_scores(tape)
    q_scaled = tape.op("mul", [q], tape.values(q) / math.sqrt(D), 1 / math.sqrt(D))
    scores = tape.op("matmul", [q_scaled, kt], tape.values(q_scaled) @ tape.values(kt))
    times_one = tape.op("mul", [scores], tape.values(scores), 1.0)
    kinds = tape.kinds()
    assert kinds[q_scaled.op] == "scale" and kinds[times_one.op] == "scale"  # type: ignore[index]
