"""The kv_repeat kind (issue 17): shared K/V heads. Its rule on hand-built recordings (the
repeat claimed, a tile or a plain reshape left alone), its stage, and the GQA/MQA families."""

from __future__ import annotations

import numpy as np
import pytest

from mha_tui.config import Config
from mha_tui.ops.graph import Graph
from mha_tui.ops.sizes import Sizes
from mha_tui.recognise.classify import classify
from mha_tui.recognise.run import recognise
from mha_tui.records import Recording, Ref

from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)
from .test_rules import Tape, _param, _snap

T, C, H, D = 3, 8, 4, 2
SIZES = Sizes(1, T, C, H, D)


class GqaTape(Tape):
    """x (1, T, 8); q has 4 heads of 2, k and v `h_kv` heads of 2."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.x_values = self.rng.standard_normal((1, T, C)).astype(np.float32)
        self.x = Ref("input", name="x", snapshot=_snap(self.x_values))

    def heads_of(self, role: str, h: int) -> Ref:
        w = _param(f"W_{role}.weight", self.rng.standard_normal((h * D, C)).astype(np.float32))
        projected = self.op("linear", [self.x, w], self.x_values @ self.values(w).T)
        viewed = self.op("view", [projected], self.values(projected).reshape(1, T, h, D), 1, T, h, D)
        return self.op("transpose", [viewed], self.values(viewed).transpose(0, 2, 1, 3), 1, 2)

    def repeat_kv(self, t: Ref, n: int) -> tuple[Ref, ...]:
        """Llama's repeat_kv: [:, :, None] -> expand -> reshape."""
        v = self.values(t)
        a = self.op("getitem", [t], v[:, :, None], ((("slice", None, None, None),) * 2 + (None,)))
        b = self.op("expand", [a], np.broadcast_to(self.values(a), (1, v.shape[1], n, T, D)),
                    1, v.shape[1], n, T, D)
        c = self.op("reshape", [b], self.values(b).reshape(1, v.shape[1] * n, T, D), 1, H, T, D)
        return a, b, c

    def attention(self, k: Ref, v: Ref) -> None:
        q = self.heads_of("Q", H)
        kt = self.op("transpose", [k], np.swapaxes(self.values(k), -2, -1), -2, -1)
        scores = self.op("matmul", [q, kt], self.values(q) @ self.values(kt))
        e = np.exp(self.values(scores) - self.values(scores).max(-1, keepdims=True))
        weights = self.op("softmax", [scores], e / e.sum(-1, keepdims=True), dim=-1)
        self.op("matmul", [weights, v], self.values(weights) @ self.values(v))

    def classified(self) -> list[str | None]:
        g = Graph(self.recording())
        classify(g, SIZES)
        return [g.kind.get(i) for i in range(len(self.ops))]

    def recording(self) -> Recording:
        return Recording("Attn", "attn.py", (("x", _snap(self.x_values)),), tuple(self.ops))


@pytest.mark.parametrize("h_kv", [2, 1])
def test_repeat_kv_is_claimed_whole(h_kv: int) -> None:
    """getitem, expand and reshape of K and of V: all kv_repeat (GQA with 2, MQA with 1)."""
    tape = GqaTape()
    k, v = tape.heads_of("K", h_kv), tape.heads_of("V", h_kv)
    k_ops, v_ops = tape.repeat_kv(k, H // h_kv), tape.repeat_kv(v, H // h_kv)
    tape.attention(k_ops[-1], v_ops[-1])
    kinds = tape.classified()
    assert [kinds[r.op] for r in (*k_ops, *v_ops)] == ["kv_repeat"] * 6  # type: ignore[index]
    assert kinds[0] == "project"


def test_a_tile_is_a_wrong_sharing_repeat() -> None:
    """k.repeat(1, 2, 1, 1) gives head j = K/V head j % 2, not j // 2: claimed as shared
    K/V heads (it is what the learner meant), its stage saying which head each query head
    really reads and its check failing, so the check can name the mistake."""
    tape = GqaTape()
    k, v = tape.heads_of("K", 2), tape.heads_of("V", 2)
    tiled = tape.op("repeat", [k], np.tile(tape.values(k), (1, 2, 1, 1)), 1, 2, 1, 1)
    v_ops = tape.repeat_kv(v, 2)
    tape.attention(tiled, v_ops[-1])
    kinds = tape.classified()
    assert kinds[tiled.op] == "kv_repeat" and kinds[v_ops[-1].op] == "kv_repeat"  # type: ignore[index]
    stages = recognise(tape.recording(), Config("a b c", embed_dim=C, num_heads=H))
    stage = next(s for s in stages if s.kind == "kv_repeat")
    k_after = next(t for t in stage.tensors if t.name == "K (4 heads)")
    assert "head j is K/V head j % 2" in k_after.caption
    assert [c.ok for c in stage.checks if c.label.startswith("K: query head j reads")] == [False]
    assert [c.ok for c in stage.checks if c.label.startswith("V: query head j reads")] == [True]


def test_heads_that_are_not_repeated_leave_the_rule_silent() -> None:
    tape = GqaTape()
    k, v = tape.heads_of("K", H), tape.heads_of("V", H)
    tape.attention(k, v)
    assert "kv_repeat" not in tape.classified()


def test_the_stage_says_which_query_heads_share_which_kv_head() -> None:
    tape = GqaTape()
    k, v = tape.heads_of("K", 2), tape.heads_of("V", 2)
    tape.attention(tape.repeat_kv(k, 2)[-1], tape.repeat_kv(v, 2)[-1])
    stages = recognise(tape.recording(), Config("a b c", embed_dim=C, num_heads=H))
    stage = next(s for s in stages if s.kind == "kv_repeat")
    assert stage.title == "Shared K/V heads: 2 K/V heads for 4 query heads"
    assert stage.tensor("K/V head of query head").values.tolist() == [0, 0, 1, 1]
    # K and V before the repeat hold h_kv heads, after it h (TRIAL2 #2)
    assert [r.dims for r in stage.tensors[1:]] == [("B", "h_kv", "T", "d_h"),
                                                   ("B", "h", "T", "d_h")] * 2
    assert stage.dims_transition == "(B, h_kv, T, d_h) -> (B, h, T, d_h)"
    assert [c.ok for c in stage.checks if c.ok is not None] == [True, True]
    assert "query heads 0..1 -> K/V head 0, query heads 2..3 -> K/V head 1" in stage.explanation
    assert "(4, 8)" in stage.explanation  # (h_kv * d_h, C): the K/V weights' true shape


@pytest.mark.parametrize("name,h_kv", [("llama", 2), ("mistral", 2), ("qwen2", 2), ("gemma", 1)])
def test_families_with_shared_heads_show_them(name: str, h_kv: int) -> None:
    """The checkpoint's repeated K and V equal np.repeat of its own K/V heads; the projection's
    words give the (h_kv * d_h, C) shapes, never three C x C layers."""
    from .test_families import hf_trace

    trace = hf_trace(name, 0)
    stage = trace.stage("kv_repeat")
    assert f"{h_kv} K/V head" in stage.title or (h_kv == 1 and "one K/V head" in stage.title)
    assert stage.tensor("K/V head of query head").values.tolist() == [j // (4 // h_kv) for j in range(4)]
    assert all(check.ok is not False for check in stage.checks)
    project = trace.stage("project")
    assert "Three C x C" not in project.explanation and f"({8 * h_kv}, 32)" in project.explanation


def test_one_kv_head_shows_the_heads_not_repeat_kvs_5d_steps() -> None:
    """TRIAL2 #3: with one K/V head, repeat_kv's own expand of (B, 1, 1, T, d_h) already
    repeats; the stage showed it (and the [:, :, None] before it) as the K/V heads, then the
    real ones as `K (1 heads) (2)`. Now: the heads the projection made and the repeated ones."""
    tape = GqaTape()
    k, v = tape.heads_of("K", 1), tape.heads_of("V", 1)
    tape.attention(tape.repeat_kv(k, H)[-1], tape.repeat_kv(v, H)[-1])
    stages = recognise(tape.recording(), Config("a b c", embed_dim=C, num_heads=H))
    stage = next(s for s in stages if s.kind == "kv_repeat")
    assert [(r.name, r.shape) for r in stage.tensors[1:]] == [
        ("K (1 head)", (1, 1, T, D)), ("K (4 heads)", (1, H, T, D)),
        ("V (1 head)", (1, 1, T, D)), ("V (4 heads)", (1, H, T, D))]
    assert stage.shape_in == (1, 1, T, D) and stage.shape_out == (1, H, T, D)
    assert "1 heads" not in " ".join(c.label for c in stage.checks)


def test_gemmas_multi_query_stage_shows_what_gqa_families_show() -> None:
    from .test_families import hf_trace

    stage = hf_trace("gemma", 0).stage("kv_repeat")
    assert [(r.name, r.shape) for r in stage.tensors[1:]] == [
        ("K (1 head)", (1, 1, 7, 8)), ("K (4 heads)", (1, 4, 7, 8)),
        ("V (1 head)", (1, 1, 7, 8)), ("V (4 heads)", (1, 4, 7, 8))]
