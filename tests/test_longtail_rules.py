"""The rules issue 30 adds, each on a small hand-built recording (tests/test_rules.py's Tape:
ops, shapes and values, no torch): rotary found from the values however it is spelled, a
norm written out op by op, soft-capping, attention sinks; and what each leaves alone."""

from __future__ import annotations

import numpy as np

from .test_rules import B, D, H, T, Tape, _attention_upto_scores, _param, _softmax


def _angles() -> tuple[np.ndarray, np.ndarray]:
    theta = np.arange(T, dtype=np.float64)[:, None] * np.array([1.0])[None, :]  # (T, 1): one pair
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


def _stacked_rotary(tape: Tape, q):  # torchtune / gpt-fast: pairs as a last axis of 2
    cos, sin = _angles()
    table = _param("cache", np.stack([cos, sin], axis=-1)[None, None], "buffer")  # (1, 1, T, 1, 2)
    pairs = tape.op("reshape", [q], tape.values(q).reshape(B, H, T, D // 2, 2))
    x0 = tape.op("getitem", [pairs], tape.values(pairs)[..., 0])
    x1 = tape.op("getitem", [pairs], tape.values(pairs)[..., 1])
    c = tape.op("getitem", [table], tape.values(table)[..., 0])
    s = tape.op("getitem", [table], tape.values(table)[..., 1])
    a = tape.op("mul", [x0, c], tape.values(x0) * tape.values(c))
    b = tape.op("mul", [x1, s], tape.values(x1) * tape.values(s))
    first = tape.op("sub", [a, b], tape.values(a) - tape.values(b))
    e = tape.op("mul", [x1, c], tape.values(x1) * tape.values(c))
    f = tape.op("mul", [x0, s], tape.values(x0) * tape.values(s))
    second = tape.op("add", [e, f], tape.values(e) + tape.values(f))
    stacked = tape.op("stack", [first, second],
                      np.stack([tape.values(first), tape.values(second)], axis=-1), -1)
    return tape.op("flatten", [stacked], tape.values(stacked).reshape(B, H, T, D), 3)


def test_rotary_spelled_with_stack_and_flatten_is_found_from_the_values() -> None:
    """torchtune's and gpt-fast's form: no `x * cos + rotate(x) * sin` add to match; the
    turn is measured from q before and after."""
    tape = Tape()
    q, *_ = _attention_upto_scores(tape)
    first = len(tape.ops)
    turned = _stacked_rotary(tape, q)
    kinds = tape.kinds()
    x_derived = [i for i in range(first, turned.op + 1)  # type: ignore[operator]
                 if tape.ops[i].inputs and tape.ops[i].inputs[0].kind != "buffer"]
    assert {kinds[i] for i in x_derived} == {"rotary"}


def test_a_swap_of_halves_alone_is_not_rotary() -> None:
    """cat((-x2, x1)) turns every position by 90 degrees, position 0 too: not rotary."""
    tape = Tape()
    q, *_ = _attention_upto_scores(tape)
    values = tape.values(q)
    x1 = tape.op("getitem", [q], values[..., :1])
    x2 = tape.op("getitem", [q], values[..., 1:])
    minus = tape.op("neg", [x2], -tape.values(x2))
    swapped = tape.op("cat", [minus, x1], np.concatenate([-values[..., 1:], values[..., :1]], -1), -1)
    assert tape.kind(swapped) != "rotary"


def _rms_by_hand(tape: Tape, q, weight: np.ndarray, eps: float = 1e-6):
    """Hugging Face's LlamaRMSNorm: pow, mean, add eps, rsqrt, mul, weight * ."""
    values = tape.values(q).astype(np.float64)
    squared = tape.op("pow", [q], values ** 2, 2)
    mean = tape.op("mean", [squared], tape.values(squared).mean(-1, keepdims=True), -1)
    shifted = tape.op("add", [mean], tape.values(mean) + eps, eps)
    root = tape.op("rsqrt", [shifted], 1 / np.sqrt(tape.values(shifted)))
    normed = tape.op("mul", [q, root], values * tape.values(root))
    w = _param("q_norm.weight", weight.astype(np.float32))
    return tape.op("mul", [w, normed], weight * tape.values(normed))


def test_an_rmsnorm_written_out_on_q_is_a_norm() -> None:
    tape = Tape()
    q, *_ = _attention_upto_scores(tape)
    first = len(tape.ops)
    out = _rms_by_hand(tape, q, np.array([0.5, 2.0]))
    kinds = tape.kinds()
    assert [kinds[i] for i in range(first, out.op + 1)] == ["norm"] * 6  # type: ignore[operator]


def test_a_scale_of_q_is_not_a_norm() -> None:
    """q * 0.5: no reduction over the channels, no norm."""
    tape = Tape()
    q, *_ = _attention_upto_scores(tape)
    scaled = tape.op("mul", [q], tape.values(q) * 0.5, 0.5)
    assert tape.kind(scaled) != "norm"


def test_softcapping_claims_its_divide_tanh_and_multiply() -> None:
    tape = Tape()
    *_, scores = _attention_upto_scores(tape)
    cap = 0.5
    into = tape.op("div", [scores], tape.values(scores) / cap, cap)
    squashed = tape.op("tanh", [into], np.tanh(tape.values(into)))
    out = tape.op("mul", [squashed], tape.values(squashed) * cap, cap)
    tape.op("softmax", [out], _softmax(tape.values(out)), dim=-1)
    kinds = tape.kinds()
    assert [kinds[r.op] for r in (into, squashed, out)] == ["softcap"] * 3  # type: ignore[index]


def test_a_tanh_between_unrelated_factors_is_not_softcapping() -> None:
    """tanh(s / 0.5) * 2: the factors do not undo each other."""
    tape = Tape()
    *_, scores = _attention_upto_scores(tape)
    into = tape.op("div", [scores], tape.values(scores) / 0.5, 0.5)
    squashed = tape.op("tanh", [into], np.tanh(tape.values(into)))
    out = tape.op("mul", [squashed], tape.values(squashed) * 2.0, 2.0)
    tape.op("softmax", [out], _softmax(tape.values(out)), dim=-1)
    assert "softcap" not in {tape.kinds()[r.op] for r in (into, squashed, out)}  # type: ignore[index]


def test_a_sink_column_cat_onto_the_scores_and_dropped_after_softmax() -> None:
    tape = Tape()
    *_, scores = _attention_upto_scores(tape)
    sink = _param("sinks", np.full((B, H, T, 1), 0.7, np.float32))
    combined = tape.op("cat", [scores, sink],
                       np.concatenate([tape.values(scores), tape.values(sink)], -1), dim=-1)
    weights = tape.op("softmax", [combined], _softmax(tape.values(combined)), dim=-1)
    tape.op("getitem", [weights], tape.values(weights)[..., :T])
    assert tape.kind(combined) == "sinks"


def test_a_cat_of_the_scores_not_cut_after_softmax_is_not_a_sink() -> None:
    tape = Tape()
    *_, scores = _attention_upto_scores(tape)
    extra = _param("extra", np.zeros((B, H, T, 1), np.float32))
    combined = tape.op("cat", [scores, extra],
                       np.concatenate([tape.values(scores), tape.values(extra)], -1), dim=-1)
    tape.op("softmax", [combined], _softmax(tape.values(combined)), dim=-1)
    assert tape.kind(combined) != "sinks"


def _rotation_with(omega: np.ndarray, positions: int = 6, scale: float = 1.0):
    from mha_tui.kinds.rotary.finding import Rotation
    from mha_tui.records import Ref

    theta = np.arange(positions)[:, None] * omega[None, :]
    ref = Ref("op", op=0)
    return Rotation(before=ref, rotated_in=ref, after=ref, passed=None, r=2 * len(omega),
                    pairing="half", cos=np.cos(theta), sin=np.sin(theta), ops=frozenset(),
                    scale=scale)


def test_llama3_rope_scaling_is_named_with_its_factor() -> None:
    """Llama 3's rope_scaling: the fast pairs as base^(-2i/r), a ramp, the slow ones 8 times
    slower; YaRN's attention factor is said too."""
    from mha_tui.kinds.rotary.finding import scaling

    base, n = 500000.0, 8
    plain = base ** (-np.arange(n) / n)
    ratio = np.array([1.0, 0.6, *[1 / 8] * (n - 2)])
    found = scaling(_rotation_with(plain * ratio, scale=1.1), base)
    assert found is not None and abs(found.factor - 8) < 1e-6
    assert "factor 8" in found.words() and "YaRN's attention factor" in found.words()
    assert "as YaRN's rope_scaling (rope_type yarn)" in found.words()
    plain_tables = scaling(_rotation_with(plain * ratio), base)  # no attention factor
    assert plain_tables is not None and "as Llama 3's rope_scaling (rope_type llama3)" in \
        plain_tables.words() and "YaRN" not in plain_tables.words()


def test_another_base_is_not_a_rope_scaling() -> None:
    """Frequencies of base 10000 read against base 500: every pair ever slower, no plateau:
    a wrong base (check says rotary_base), not a scaling."""
    from mha_tui.kinds.rotary.finding import scaling

    n = 8
    assert scaling(_rotation_with(10000.0 ** (-np.arange(n) / n)), 500.0) is None
    assert scaling(_rotation_with(500.0 ** (-np.arange(n) / n)), 500.0) is None  # unscaled


def test_a_product_no_softmax_follows_is_not_the_scores() -> None:
    """Linear attention's φ(K)^T V: a product of two x-derived tensors that nothing turns into
    weights is not a score matrix (issue 30: no scores stage where there is none)."""
    from mha_tui.ops.graph import Graph
    from mha_tui.recognise.classify import classify
    from mha_tui.records import Recording

    from .test_rules import SIZES, _snap

    def kind_of_scores(with_softmax: bool) -> str | None:
        tape = Tape()
        *_, scores = _attention_upto_scores(tape)
        last = scores
        if with_softmax:
            last = tape.op("softmax", [scores], _softmax(tape.values(scores)), dim=-1)
        rec = Recording("Attn", "attn.py", (("x", _snap(tape.x_values)),), tuple(tape.ops),
                        output=last)  # a forward that ran to its end
        g = Graph(rec)
        classify(g, SIZES)
        return g.kind.get(scores.op)  # type: ignore[arg-type]

    assert kind_of_scores(with_softmax=False) != "scores"
    assert kind_of_scores(with_softmax=True) == "scores"


def _unit(values: np.ndarray) -> np.ndarray:
    return values / np.linalg.norm(values, axis=-1, keepdims=True)


def test_cosine_attention_claims_the_normalize_of_q_and_k_and_the_learned_scale() -> None:
    """open_clip's scaled_cosine: F.normalize(q), F.normalize(k), their product, times
    exp(logit_scale) per head: the normalizes and the multiply are one cosine stage; the
    product between them stays the scores."""
    tape = Tape()
    q, k, _ = (tape.heads(tape.linear(tape.x, f"W_{r}.weight")) for r in "QKV")
    qn = tape.op("normalize", [q], _unit(tape.values(q)), p=2.0, dim=-1)
    kn = tape.op("normalize", [k], _unit(tape.values(k)), p=2.0, dim=-1)
    kt = tape.op("transpose", [kn], np.swapaxes(tape.values(kn), -2, -1), -2, -1)
    cosines = tape.op("matmul", [qn, kt], tape.values(qn) @ tape.values(kt))
    scale = _param("logit_scale", np.full((H, 1, 1), 10.0, np.float32))
    scaled = tape.op("mul", [cosines, scale], tape.values(cosines) * 10.0)
    tape.op("softmax", [scaled], _softmax(tape.values(scaled)), dim=-1)
    kinds = tape.kinds()
    assert [kinds[r.op] for r in (qn, kn, cosines, scaled)] == [  # type: ignore[index]
        "cosine", "cosine", "scores", "cosine"]


def test_a_normalize_of_x_or_of_the_weights_is_not_cosine_attention() -> None:
    """F.normalize of the input (before any projection), or over another axis, is not q or k
    put at unit length; a scale of plain scores stays scale's."""
    tape = Tape()
    on_x = tape.op("normalize", [tape.x], _unit(tape.x_values), p=2.0, dim=-1)
    q, _, _, scores = _attention_upto_scores(tape)
    other_axis = tape.op("normalize", [q], tape.values(q) / np.linalg.norm(
        tape.values(q), axis=-2, keepdims=True), p=2.0, dim=-2)
    scaled = tape.op("div", [scores], tape.values(scores) / 2.0, 2.0)
    tape.op("softmax", [scaled], _softmax(tape.values(scaled)), dim=-1)
    kinds = tape.kinds()
    assert kinds[on_x.op] != "cosine" and kinds[other_axis.op] != "cosine"  # type: ignore[index]
    assert kinds[scaled.op] == "scale"  # type: ignore[index]


def test_two_softmax_maps_subtracted_with_lambda_are_differential_attention() -> None:
    """Diff Transformer: w1 − λ · w2 of two softmax maps is one differential stage (the
    multiply by λ and the subtraction); a subtraction of two maps with no λ, or of a map and
    a tensor not from softmax, is not."""
    tape = Tape()
    *_, scores = _attention_upto_scores(tape)
    weights = tape.op("softmax", [scores], _softmax(tape.values(scores)), dim=-1)
    maps = tape.op("view", [weights], tape.values(weights).reshape(B, H // 2, 2, T, T))
    first = tape.op("getitem", [maps], tape.values(maps)[:, :, 0])
    second = tape.op("getitem", [maps], tape.values(maps)[:, :, 1])
    lam = _param("lambda_full", np.array(0.3, np.float32))
    times = tape.op("mul", [lam, second], 0.3 * tape.values(second))
    diff = tape.op("sub", [first, times], tape.values(first) - tape.values(times))
    plain = tape.op("sub", [first, second], tape.values(first) - tape.values(second))
    kinds = tape.kinds()
    assert (kinds[times.op], kinds[diff.op]) == ("differential", "differential")  # type: ignore[index]
    assert kinds[plain.op] != "differential"  # type: ignore[index]


def test_a_forward_with_no_softmax_is_linear_attention_and_one_with_softmax_is_not() -> None:
    """fast-transformers' φ(K)^T V with no softmax anywhere: its ops are linear_attn; the same
    products in a forward that has a softmax are never linear_attn."""
    from mha_tui.ops.graph import Graph
    from mha_tui.recognise.classify import classify
    from mha_tui.records import Recording

    from .test_rules import SIZES, _snap

    def kinds(with_softmax: bool) -> set[str | None]:
        tape = Tape()
        q, kt, v, _ = _attention_upto_scores(tape)
        kv = tape.op("matmul", [kt, v], tape.values(kt) @ tape.values(v))  # (B, h, d_h, d_h)
        out = tape.op("matmul", [q, kv], tape.values(q) @ tape.values(kv))
        last = tape.op("softmax", [out], _softmax(tape.values(out)), dim=-1) if with_softmax \
            else out
        rec = Recording("Attn", "attn.py", (("x", _snap(tape.x_values)),), tuple(tape.ops),
                        output=last)
        g = Graph(rec)
        classify(g, SIZES)
        return {g.kind.get(kv.op), g.kind.get(out.op)}  # type: ignore[arg-type]

    assert kinds(with_softmax=False) == {"linear_attn"}
    assert "linear_attn" not in kinds(with_softmax=True)


def test_the_bias_added_after_x_at_w_is_part_of_the_projection() -> None:
    """picoGPT's linear, `x @ w + b`: the add of one bias per output channel joins the
    product's projection; an add of a per-channel vector to the scores does not."""
    tape = Tape()
    w = _param("c_attn.w", tape.rng.standard_normal((D * H, D * H)).astype(np.float32))
    product = tape.op("matmul", [tape.x, w], tape.x_values @ tape.values(w))
    b = _param("c_attn.b", np.arange(D * H, dtype=np.float32))
    biased = tape.op("add", [product, b], tape.values(product) + tape.values(b))
    *_, scores = _attention_upto_scores(tape)
    row = _param("row", np.arange(T, dtype=np.float32))
    shifted = tape.op("add", [scores, row], tape.values(scores) + tape.values(row))
    kinds = tape.kinds()
    assert (kinds[product.op], kinds[biased.op]) == ("project", "project")  # type: ignore[index]
    assert kinds[shifted.op] != "project"  # type: ignore[index]
