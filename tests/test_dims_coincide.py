"""Axis labels when two sizes coincide (trial findings 11, 24, 25): T == d_h or T == C.

A stage that knows what a tensor is says so (the sdpa expansion's attend output is
(B, h, T, d_h)); an op stage takes its input's dims from the stage that made it and keeps
them through the op where it can (a mean over heads drops h); where only sizes are known
and two label sets fit, no guess is picked silently (neutral d0, d1, ...).
"""

from __future__ import annotations

from pathlib import Path

from mha_tui.config import Config, Source
from mha_tui.kinds._parts.builder import BHTD, BHTT, Builder
from mha_tui.ops.sizes import Sizes
from mha_tui.pipeline import checked
from mha_tui.records.request import Request

FIXTURES = Path(__file__).parent / "fixtures"
SENTENCE = "I love AI !"  # T = 4


def traced(spec: str, **config: object):
    cfg = Config(SENTENCE, **config)  # type: ignore[arg-type]
    run, _ = checked(Request(cfg, Source(module=spec)))
    return run(cfg)


def stage(trace, stage_id: str):
    return next(s for s in trace.stages if s.id == stage_id)


def test_the_sdpa_expansion_labels_attends_output_d_h_when_t_equals_d_h() -> None:
    """timm's Attention at C = 8, 2 heads: T = 4 = d_h. attend's output was (B, h, T, T)
    with token names as its columns, and softmax's input q's (B, h, T, d_h)."""
    trace = traced(f"{FIXTURES / 'public' / 'timm_attention.py'}:Attention", embed_dim=8,
                   causal=False)
    attend = stage(trace, "attend")
    assert attend.tensors[-1].name == "attn_weight @ v"
    assert attend.tensors[-1].dims == BHTD
    assert attend.dims_transition == "(B, h, T, T) -> (B, h, T, d_h)"
    for kind in ("scale", "softmax"):  # each step's input is the step before's output
        assert stage(trace, kind).dims_transition == "(B, h, T, T) -> (B, h, T, T)", kind
    assert stage(trace, "scores").dims_transition == "(B, h, T, d_h) -> (B, h, T, T)"


def test_sizes_alone_never_pick_one_of_two_label_sets_that_fit() -> None:
    """(1, 2, 4, 4) with T == d_h: (B, h, T, d_h) and (B, h, T, T) both fit; without a
    caller's word, neither is chosen. The caller's word (or the layout torch's MHA or one
    head's module holds it in) wins."""
    b = Builder.__new__(Builder)
    b.sizes = Sizes(B=1, T=4, C=8, h=2, d_h=4)
    assert b.dims((1, 2, 4, 4)) == ("d0", "d1", "d2", "d3")
    assert b.dims((1, 2, 4, 4), [BHTT]) == BHTT
    assert b.dims((1, 2, 4, 4), [BHTD]) == BHTD
    assert b.dims((2, 4, 4), [BHTT]) == ("B*h", "T", "T")
    assert b.dims((1, 4, 8)) == ("B", "T", "C")  # only one fits: named
    one_head = Builder.__new__(Builder)
    one_head.sizes = Sizes(B=1, T=4, C=4, h=1, d_h=4)
    assert one_head.dims((1, 4, 4)) == ("d0", "d1", "d2")  # (B, T, C) or (B, T, T)
    one_head.sizes = Sizes(B=1, T=3, C=4, h=1, d_h=4)
    assert one_head.dims((1, 3, 4)) == ("B", "T", "C")  # (B, T, d_h) is the same axes


def test_the_head_averaged_weights_are_no_stage_and_the_mask_keeps_its_dims() -> None:
    """nn.MultiheadAttention's head-averaged weights (a mean over h of softmax's output) do
    not reach the attention output: since #30 they are no stage (they were an `op` stage whose
    dims these tests pinned). The mask's (B, T, T) input keeps its labels at C = 4 = T."""
    for embed_dim in (4, 8):
        trace = traced("torch.nn:MultiheadAttention", embed_dim=embed_dim)
        assert trace.stages[-1].kind == "w_o", embed_dim
        assert not any("mean(dim=1)" in s.title for s in trace.stages), embed_dim
    mask = stage(traced("torch.nn:MultiheadAttention"), "mask")
    assert mask.tensors[0].dims == ("B", "T", "T"), mask.tensors[0]


def test_shared_kv_heads_are_named_from_where_they_go_when_t_equals_d_h() -> None:
    """TRIAL2 #2 at T = d_h = 4: Llama-style GQA (2 K/V heads for 4). K and V are named by
    their role (the scores' and attend's operands), the K/V head count by the recognised
    repeat, never by size: (B, T, h_kv*d_h) out of the projection, (B, h_kv, T, d_h) in the
    rotary stage and before the repeat."""
    trace = traced(f"{FIXTURES / 'mechanisms' / 'llama_rotary.py'}:LlamaAttention",
                   embed_dim=16, num_heads=4)
    project = stage(trace, "project")
    assert [(r.name, r.dims) for r in project.tensors[-2:]] == [
        ("k", ("B", "T", "h_kv*d_h")), ("v", ("B", "T", "h_kv*d_h"))]
    rotary = stage(trace, "rotary")
    assert rotary.tensor("K before").dims == rotary.tensor("K after").dims == \
        ("B", "h_kv", "T", "d_h")
    assert rotary.tensor("Q before").dims == BHTD
    assert stage(trace, "kv_repeat").dims_transition == "(B, h_kv, T, d_h) -> (B, h, T, d_h)"


def test_the_kv_layouts_are_never_picked_by_size_alone() -> None:
    b = Builder.__new__(Builder)
    b.sizes = Sizes(B=1, T=4, C=16, h=4, d_h=4)
    b.h_kv = 2
    assert b.dims((1, 2, 4, 4)) == ("d0", "d1", "d2", "d3")  # K/V heads, or anything else
    assert b.dims((1, 4, 8)) == ("d0", "d1", "d2")
    assert b.dims((1, 2, 4, 4), b.kv(BHTD)) == ("B", "h_kv", "T", "d_h")
    assert b.dims((1, 4, 8), b.kv(("B", "T", "C"))) == ("B", "T", "h_kv*d_h")
    assert b.fused(48) == ("B", "T", "3C") and b.fused(32) == ("B", "T", "(h+2*h_kv)*d_h")


def test_the_mha_concat_is_tokens_by_batch_whatever_the_sizes() -> None:
    """nn.MultiheadAttention's heads side by side are (T * B, C) before out_proj: at C = 4
    = T that was labelled (T, T) with token names over the channels, at C = 8 (d0, d1); and
    its input, attend's (B * h, T, d_h), four labels for three axes."""
    for embed_dim in (4, 8):
        concat = stage(traced("torch.nn:MultiheadAttention", embed_dim=embed_dim), "concat")
        assert concat.dims_transition == "(B*h, T, d_h) -> (T*B, C)", embed_dim
        joined = concat.tensors[-1]
        assert joined.dims == ("B", "T", "C") and joined.values.shape == (1, 4, embed_dim)
        assert "torch holds it as (T * B, C); shown as (B, T, C)" in joined.caption
