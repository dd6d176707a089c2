"""The rotary kind (issue 17): its rule on small hand-built recordings (which op it claims,
what it leaves alone), its stage built from them, and the angles it shows against an
independent computation, on hand-written modules and on tiny Llama-family checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from mha_tui.kinds import rotary
from mha_tui.ops.graph import Graph
from mha_tui.ops.sizes import Sizes
from mha_tui.recognise.classify import classify
from mha_tui.records import Recording, Ref
from mha_tui.stages import title_of

from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)
from .test_rules import Tape, _param, _snap

T, C = 5, 4  # one head of d_h = 4 channels: two pairs
SIZES = Sizes(1, T, C, 1, C)
BASE = 10000.0


def _angles(r: int, base: float = BASE) -> np.ndarray:
    """(T, r/2): position t turns pair i by t * base^(-2i/r), written out here."""
    omega = np.array([base ** (-2 * i / r) for i in range(r // 2)])
    return np.arange(T)[:, None] * omega[None, :]


class RotaryTape(Tape):
    """A Tape whose x is (1, T, C) and whose head tensors are (1, 1, T, C): one head."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.x_values = self.rng.standard_normal((1, T, C)).astype(np.float32)
        self.x = Ref("input", name="x", snapshot=_snap(self.x_values))

    def head(self, role: str) -> object:
        w = _param(f"W_{role}.weight", self.rng.standard_normal((C, C)).astype(np.float32))
        projected = self.op("linear", [self.x, w], self.x_values @ self.values(w).T)
        return self.op("view", [projected], self.values(projected).reshape(1, 1, T, C), 1, 1, T, C)

    def record(self) -> tuple[Graph, list[str | None]]:
        rec = Recording("Attn", "attn.py", (("x", _snap(self.x_values)),), tuple(self.ops))
        g = Graph(rec)
        classify(g, SIZES)
        return g, [g.kind.get(i) for i in range(len(self.ops))]

    def getitem(self, t, start, stop, step=None):  # type: ignore[no-untyped-def]
        values = self.values(t)[..., slice(start, stop, step)]
        return self.op("getitem", [t], values, ("...", ("slice", start, stop, step)))

    def table(self, name: str, values: np.ndarray) -> object:
        return _param(name, values.astype(np.float32)[None, None], "buffer")  # (1, 1, T, r)

    def rotate_half(self, t, cos, sin):  # type: ignore[no-untyped-def]
        """(t * cos) + (rotate_half(t) * sin), as Llama writes it, op by op."""
        r = self.values(t).shape[-1]
        first = self.getitem(t, None, r // 2)
        second = self.getitem(t, r // 2, None)
        negated = self.op("neg", [second], -self.values(second))
        turned = self.op("cat", [negated, first],
                         np.concatenate([self.values(negated), self.values(first)], -1), dim=-1)
        a = self.op("mul", [t, cos], self.values(t) * self.values(cos))
        b = self.op("mul", [turned, sin], self.values(turned) * self.values(sin))
        return self.op("add", [a, b], self.values(a) + self.values(b))

    def rotate_every_two(self, t, cos, sin):  # type: ignore[no-untyped-def]
        """GPT-J: pairs (0, 1), (2, 3): stack((-x2, x1), -1).flatten(-2)."""
        even = self.getitem(t, None, None, 2)
        odd = self.getitem(t, 1, None, 2)
        negated = self.op("neg", [odd], -self.values(odd))
        stacked = self.op("stack", [negated, even],
                          np.stack([self.values(negated), self.values(even)], -1), dim=-1)
        turned = self.op("flatten", [stacked], self.values(stacked).reshape(self.values(t).shape), -2)
        a = self.op("mul", [t, cos], self.values(t) * self.values(cos))
        b = self.op("mul", [turned, sin], self.values(turned) * self.values(sin))
        return self.op("add", [a, b], self.values(a) + self.values(b))

    def scores(self, q, k):  # type: ignore[no-untyped-def]
        kt = self.op("transpose", [k], np.swapaxes(self.values(k), -2, -1), -2, -1)
        return self.op("matmul", [q, kt], self.values(q) @ self.values(kt))


def _half_tables(tape: RotaryTape, r: int = C) -> tuple[object, object]:
    angles = np.concatenate([_angles(r)] * 2, axis=-1)  # (T, r): Llama's cat((freqs, freqs))
    return tape.table("cos", np.cos(angles)), tape.table("sin", np.sin(angles))


def _between(tape: RotaryTape, first: object, last: object) -> range:
    return range(first.op + 1, last.op + 1)  # type: ignore[attr-defined]


def test_a_half_split_rotation_is_claimed_op_by_op() -> None:
    """Llama's q*cos + rotate_half(q)*sin: every slice, neg, cat, mul and add is rotary; the
    projections, the head split and the scores keep their kinds."""
    tape = RotaryTape()
    q, k = tape.head("Q"), tape.head("K")
    cos, sin = _half_tables(tape)
    q_rot = tape.rotate_half(q, cos, sin)
    k_rot = tape.rotate_half(k, cos, sin)
    scores = tape.scores(q_rot, k_rot)
    g, kinds = tape.record()
    assert kinds[0] == "project" and kinds[scores.op] == "scores"
    assert {kinds[i] for i in _between(tape, k, q_rot)} == {"rotary"}
    assert {kinds[i] for i in _between(tape, q_rot, k_rot)} == {"rotary"}
    (found_q, found_k) = rotary.rotations(g, SIZES)
    assert found_q.pairing == found_k.pairing == "half" and found_q.r == C
    assert found_q.passed is None
    np.testing.assert_allclose(np.unwrap(np.arctan2(found_q.sin, found_q.cos), axis=0), _angles(C),
                               atol=1e-6)


def test_an_interleaved_rotation_is_told_from_a_half_split_one() -> None:
    """GPT-J's rotate_every_two pairs channel 2i with 2i + 1: recognised by the values."""
    tape = RotaryTape()
    q, k = tape.head("Q"), tape.head("K")
    angles = np.repeat(_angles(C), 2, axis=-1)  # (T, r): repeat_interleave(sin, 2)
    cos, sin = tape.table("cos", np.cos(angles)), tape.table("sin", np.sin(angles))
    q_rot, k_rot = tape.rotate_every_two(q, cos, sin), tape.rotate_every_two(k, cos, sin)
    tape.scores(q_rot, k_rot)
    g, kinds = tape.record()
    assert {kinds[i] for i in _between(tape, k, k_rot)} == {"rotary"}
    assert [rot.pairing for rot in rotary.rotations(g, SIZES)] == ["interleaved"] * 2


def test_tables_the_caller_passes_and_the_forward_repeats_are_part_of_the_rotation() -> None:
    """transformers 5.24's GPT-J: sin and cos come in as an argument (`position_embeddings`,
    (1, T, r/2) each: 3-D float inputs, followed like x) and are repeated for their pair inside
    the forward, `torch.repeat_interleave(sin[:, :, None, :], 2, 3)`. Those ops made the tables
    of a rotation checked on the values: they are rotary, never unplaced `op` stages."""
    tape = RotaryTape()
    angles = _angles(C)[None].astype(np.float32)  # (1, T, r/2)
    sin_in = Ref("input", name="position_embeddings", snapshot=_snap(np.sin(angles)))
    cos_in = Ref("input", name="position_embeddings[1]", snapshot=_snap(np.cos(angles)))
    heads, turned = [], []
    for role in ("Q", "K"):
        w = _param(f"W_{role}.weight", tape.rng.standard_normal((C, C)).astype(np.float32))
        projected = tape.op("linear", [tape.x, w], tape.x_values @ tape.values(w).T)
        heads.append(tape.op("view", [projected], tape.values(projected).reshape(1, T, 1, C),
                             1, T, 1, C))  # (B, T, h, d_h)
    for head in heads:
        tables = []
        for table in (sin_in, cos_in):
            values = table.snapshot.values  # type: ignore[union-attr]
            unsqueezed = tape.op("getitem", [table], values[:, :, None, :],
                                 (("slice", None, None, None), ("slice", None, None, None), None,
                                  ("slice", None, None, None)))
            tables.append(tape.op("repeat_interleave", [unsqueezed],
                                  np.repeat(values[:, :, None, :], 2, axis=3), 2, 3))
        sin, cos = tables
        turned.append(tape.rotate_every_two(head, cos, sin))
    tape.scores(*turned)
    rec = Recording("Attn", "attn.py", (("x", _snap(tape.x_values)), ("position_embeddings",
                    sin_in.snapshot), ("position_embeddings[1]", cos_in.snapshot)), tuple(tape.ops))
    g = Graph(rec)
    assert g.x_names == {"x", "position_embeddings", "position_embeddings[1]"}
    sizes = Sizes(1, T, C, 1, C)
    classify(g, sizes)
    kinds = [g.kind.get(i) for i in range(len(tape.ops))]
    assert "op" not in kinds
    assert {kinds[i] for i in range(heads[1].op + 1, turned[1].op + 1)} == {"rotary"}  # type: ignore[attr-defined]
    found = rotary.rotations(g, sizes)
    assert [rot.pairing for rot in found] == ["interleaved"] * 2
    repeats = {op.index for op in tape.ops if op.name == "repeat_interleave"}
    assert len(repeats) == 4 and repeats <= found[0].tables | found[1].tables
    np.testing.assert_allclose(np.unwrap(np.arctan2(found[0].sin, found[0].cos), axis=0),
                               _angles(C), atol=1e-6)


def test_a_partial_rotation_names_its_pass_through_channels() -> None:
    """NeoX: the first r = 2 channels turned, the other 2 passed through and joined by cat;
    the slices and the cat are part of the rotation."""
    tape = RotaryTape()
    q, k = tape.head("Q"), tape.head("K")
    cos, sin = _half_tables(tape, r=2)
    joined = []
    for t in (q, k):
        turned_part, passed = tape.getitem(t, None, 2), tape.getitem(t, 2, None)
        turned = tape.rotate_half(turned_part, cos, sin)
        joined.append(tape.op("cat", [turned, passed],
                              np.concatenate([tape.values(turned), tape.values(passed)], -1), dim=-1))
    tape.scores(*joined)
    g, kinds = tape.record()
    assert {kinds[i] for i in _between(tape, k, joined[1])} == {"rotary"}
    found = rotary.rotations(g, SIZES)
    assert [rot.r for rot in found] == [2, 2]
    assert found[0].passed is not None and found[0].before.op == q.op
    assert found[0].after.op == joined[0].op


def test_products_with_tables_that_do_not_rotate_are_left_alone() -> None:
    """q * a + rotate_half(q) * b with tables that are not a cos/sin pair: not rotary."""
    tape = RotaryTape()
    q, k = tape.head("Q"), tape.head("K")
    a = tape.table("a", np.full((T, C), 0.9))
    b = tape.table("b", np.full((T, C), 0.9))
    mixed = tape.rotate_half(q, a, b)
    tape.scores(mixed, k)
    g, kinds = tape.record()
    assert rotary.rotations(g, SIZES) == []
    assert "rotary" not in kinds and kinds[mixed.op] == "op"


def test_a_product_with_one_table_is_left_alone() -> None:
    """q * cos alone (no rotated partner added) turns nothing."""
    tape = RotaryTape()
    q, k = tape.head("Q"), tape.head("K")
    cos, _ = _half_tables(tape)
    scaled = tape.op("mul", [q, cos], tape.values(q) * tape.values(cos))
    tape.scores(scaled, k)
    _, kinds = tape.record()
    assert kinds[scaled.op] != "rotary"


# ---------------------------------------------------------------- the stage, on real modules


@pytest.fixture(scope="module")
def llama_trace():  # type: ignore[no-untyped-def]
    from .test_families import module_trace

    return module_trace("llama_rotary.py:LlamaAttention")


def test_the_rotary_stage_shows_the_modules_angles(llama_trace) -> None:  # type: ignore[no-untyped-def]
    """Angles t * 10000^(-2i/d_h), computed here, equal the stage's angle table; the checks
    on screen hold; Q and K before and after are the module's own tensors."""
    stage = llama_trace.stage("rotary")
    assert stage.title == title_of(rotary.KIND)
    T_ = len(llama_trace.config.tokens)
    d_h = 8
    omega = BASE ** (-np.arange(d_h // 2) * 2 / d_h)
    expected = np.arange(T_)[:, None] * omega[None, :]
    np.testing.assert_allclose(stage.tensor("angle(t, i)").values, expected, rtol=1e-5, atol=1e-5)
    assert [r.name for r in stage.tensors] == ["angle(t, i)", "Q before", "Q after", "K before",
                                               "K after"]
    assert all(check.ok is not False for check in stage.checks)
    labels = " ".join(check.label for check in stage.checks)
    assert "keeps every pair's length" in labels and "depending on t − s only" in labels
    assert "base = 10000" in labels
    assert "half-split" in stage.explanation


def _stage(tape: RotaryTape):  # type: ignore[no-untyped-def]
    from mha_tui.config import Config
    from mha_tui.recognise.run import recognise

    rec = Recording("Attn", "attn.py", (("x", _snap(tape.x_values)),), tuple(tape.ops))
    stages = recognise(rec, Config("a b c d e", embed_dim=C, num_heads=1))
    return next(stage for stage in stages if stage.kind == "rotary")


def test_the_stage_built_from_a_recording_passes_its_checks() -> None:
    tape = RotaryTape()
    q, k = tape.head("Q"), tape.head("K")
    cos, sin = _half_tables(tape)
    tape.scores(tape.rotate_half(q, cos, sin), tape.rotate_half(k, cos, sin))
    stage = _stage(tape)
    np.testing.assert_allclose(stage.tensor("angle(t, i)").values, _angles(C), atol=1e-6)
    assert [check.ok for check in stage.checks if check.ok is not None] == [True] * 4
    assert "base = 10000 " in " ".join(check.label for check in stage.checks)


def test_a_rotation_by_shuffled_positions_fails_the_relative_position_checks() -> None:
    """The checks can fail: turned by angles that are not t * angle(1) (positions 1 and 2
    swapped), q and k are still rotated (lengths kept) but scores no longer depend on t - s."""
    tape = RotaryTape()
    q, k = tape.head("Q"), tape.head("K")
    angles = np.concatenate([_angles(C)] * 2, axis=-1)[[0, 2, 1, 3, 4]]
    cos, sin = tape.table("cos", np.cos(angles)), tape.table("sin", np.sin(angles))
    tape.scores(tape.rotate_half(q, cos, sin), tape.rotate_half(k, cos, sin))
    checks = {check.label.split(":")[0].split(" (")[0]: check.ok for check in _stage(tape).checks}
    assert checks["turning keeps every pair's length"] is True
    assert checks["angle(t) = t × angle(1) for every position and pair"] is False


ROTARY_FAMILIES = {  # name -> channels turned per head (of d_h = 8), from the configs written
    "gpt-j": 4, "gpt-neox": 4, "phi": 4, "llama": 8, "mistral": 8, "qwen2": 8, "gemma": 8}


@pytest.mark.parametrize("name", list(ROTARY_FAMILIES))
def test_every_rotary_family_shows_its_own_angles(name: str) -> None:
    """The angle table of each checkpoint's rotary stage equals t * theta^(-2i/r), with theta
    read from the saved config and r the rotary width the family was built with."""
    from .test_families import FAMILIES, family_dir, hf_trace

    config = FAMILIES[name].config(300)
    theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", BASE))
    assert family_dir(name).is_dir()
    stage = hf_trace(name, 0).stage("rotary")
    r = ROTARY_FAMILIES[name]
    T_ = len(hf_trace(name, 0).config.tokens)
    omega = theta ** (-np.arange(r // 2) * 2 / r)
    np.testing.assert_allclose(stage.tensor("angle(t, i)").values,
                               np.arange(T_)[:, None] * omega[None, :], rtol=1e-5, atol=1e-4)
    assert all(check.ok is not False for check in stage.checks), [
        c.label for c in stage.checks if c.ok is False]
    assert ("pass-through" in stage.explanation) is (r < 8)
    assert ("interleaved" in stage.explanation) is (name == "gpt-j")
