"""Run the running example through MultiHeadAttention once and record every stage.

The numbers come from the module's own forward (through its `tap`), never from a second
implementation; the checks shown beside each stage are computed here from those tensors.
This module knows torch and the record types: never import rich, textual or typer here.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from .config import Config
from .model import MultiHeadAttention
from .records import Check, Kind, Stage, TensorRecord, Trace
from .stages import stage_info


def build(config: Config) -> tuple[nn.Embedding, MultiHeadAttention]:
    """Seed, then build the embedding and the module in the reference chapter's order."""
    torch.manual_seed(config.seed)
    embedding = nn.Embedding(len(config.vocab), config.embed_dim)
    module = MultiHeadAttention(
        config.embed_dim, config.num_heads, max_seq_len=config.max_seq_len, causal=config.causal
    )
    embedding.eval()
    module.eval()
    return embedding, module


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _record(
    name: str,
    t: torch.Tensor,
    dims: tuple[str, ...],
    *,
    source: tuple[str, torch.Tensor] | None = None,
    kind: Kind = "signed",
    head_split: int | None = None,
    caption: str = "",
    row_tags: tuple[tuple[str, ...], ...] | None = None,
    row_tag_heads: tuple[tuple[int, ...], ...] | None = None,
) -> TensorRecord:
    t = t.detach()
    return TensorRecord(
        name=name,
        dims=dims,
        values=t.numpy(),
        strides=tuple(t.stride()),
        contiguous=t.is_contiguous(),
        shares_storage=None if source is None else _shares(t, source[1]),
        shares_with=source[0] if source else "",
        kind=kind,
        head_split=head_split,
        caption=caption,
        row_tags=row_tags,
        row_tag_heads=row_tag_heads,
    )


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _all(n: int, noun: str) -> str:
    """"all 4 tokens", but "the one token": counts in labels read as plain English."""
    return f"the one {noun}" if n == 1 else f"all {n} {noun}s"


def _single_axes(T: int, h: int) -> str:
    """Why a transpose of T and h moved nothing in memory (the reason, for an explanation)."""
    if h == 1 and T == 1:
        return "there is only one head and one token"
    return "there is only one head" if h == 1 else "there is only one token"


def run_trace(config: Config) -> Trace:
    """The whole forward pass of the running example, one Stage per step."""
    with warnings.catch_warnings(), torch.no_grad():
        # torch warns about NumPy interop on some platforms; a transcript must stay clean.
        warnings.simplefilter("ignore")
        return _run(config)


def _run(config: Config) -> Trace:
    embedding, module = build(config)
    h, d_h = config.num_heads, config.head_dim
    ids = torch.tensor([config.ids])  # (B, T)
    x = embedding(ids)  # (B, T, C)

    taps: dict[str, dict[str, torch.Tensor]] = {}

    def tap(stage: str, /, **tensors: torch.Tensor) -> None:
        taps[stage] = tensors

    out = module(x, tap=tap)  # (B, T, C)
    untapped = module(x)  # (B, T, C), the plain module for the final check

    stages = [
        _embed(config, ids, embedding, x),
        _project(module, x, taps["project"], d_h),
        _view(taps["project"], taps["view"]),
        _transpose(config, taps["project"], taps["view"], taps["transpose"]),
        _scores(taps["transpose"], taps["scores"], d_h),
        _scale(taps["scores"], taps["scale"], d_h),
        _mask(module, config, taps["scale"], taps["mask"]),
        _softmax(taps["mask"], taps["softmax"]),
        _attend(taps["transpose"], taps["softmax"], taps["attend"]),
        _concat(taps["attend"], taps["concat"], h, d_h),
        _w_o(module, taps["concat"], out, untapped, h, d_h),
    ]
    return Trace(config=config, stages=tuple(stages))


def _stage(
    stage_id: str,
    shape_in: torch.Size,
    shape_out: torch.Size,
    dims_in: tuple[str, ...],
    dims_out: tuple[str, ...],
    tensors: list[TensorRecord],
    checks: list[Check],
    *,
    causal: bool = True,
    facts: dict[str, bool] | None = None,
    why: str = "",
    **extra: object,
) -> Stage:
    info = stage_info(stage_id, causal=causal)
    return Stage(
        id=info.id,
        title=info.title,
        code=info.code,
        explanation=info.explain(facts or {}, why=why),
        shape_in=tuple(shape_in),
        shape_out=tuple(shape_out),
        dims_in=dims_in,
        dims_out=dims_out,
        tensors=tuple(tensors),
        checks=tuple(checks),
        **extra,  # type: ignore[arg-type]
    )


BTC = ("B", "T", "C")
BTHD = ("B", "T", "h", "d_h")
BHTD = ("B", "h", "T", "d_h")
BHTT = ("B", "h", "T", "T")


def _embed(config: Config, ids: torch.Tensor, embedding: nn.Embedding, x: torch.Tensor) -> Stage:
    table = embedding.weight
    looked_up = torch.equal(x[0], table[ids[0]])
    return _stage(
        "embed", ids.shape, x.shape, ("B", "T"), BTC,
        [
            _record("ids", ids, ("B", "T"), kind="int"),
            _record("embedding.weight", table, ("vocab", "C"),
                    caption="one learned row per vocabulary entry"),
            _record("x", x, BTC, source=("embedding.weight", table)),
        ],
        [Check(f"x[0, t] is row ids[t] of the embedding table for {_all(config.seq_len, 'token')}",
               looked_up)],
    )


def _project(module: MultiHeadAttention, x: torch.Tensor, p: dict[str, torch.Tensor],
             d_h: int) -> Stage:
    weights = {"Q": module.W_Q.weight, "K": module.W_K.weight, "V": module.W_V.weight}
    linear_ok = all(torch.allclose(p[n], x @ w.T) for n, w in weights.items())
    n_params = sum(param.numel() for param in module.parameters())
    C = module.embed_dim
    records = [
        _record(f"W_{n}.weight", w, ("C_out", "C_in"), head_split=0,
                caption=f"stored as (out, in); {n} = x @ W_{n}.weight.T; "
                        f"rows {d_h} at a time feed one head")
        for n, w in weights.items()
    ] + [
        _record(n, p[n], BTC, source=("x", x), head_split=2,
                caption=f"channels in blocks of d_h={d_h}, one block per head")
        for n in ("Q", "K", "V")
    ]
    return _stage(
        "project", x.shape, p["Q"].shape, BTC, BTC, records,
        [
            Check("Q, K, V each equal x @ W.weight.T (nn.Linear, no bias)", linear_ok),
            Check(f"the module has {n_params} parameters = 4 * C^2 = 4 * {C}^2, whatever h is",
                  n_params == 4 * C * C),
        ],
    )


def _view(p: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> Stage:
    shared = all(_shares(v[n], p[n]) for n in "QKV")
    return _stage(
        "view", p["Q"].shape, v["Q"].shape, BTC, BTHD,
        [_record(n, v[n], BTHD, source=(f"project's {n}", p[n])) for n in "QKV"],
        [
            Check(f"Q, K, V share storage with the projections: {_yes(shared)}, nothing copied",
                  shared),
            Check("the numbers are untouched: Q.view(...) flattened back equals Q",
                  all(torch.equal(v[n].flatten(), p[n].flatten()) for n in "QKV")),
        ],
    )


def _wrong_view(config: Config, q: torch.Tensor, equal: bool) -> TensorRecord:
    """Q.view(B, h, T, d_h): the tempting one-step reshape that scrambles tokens and heads."""
    B, T, C = q.shape
    h, d_h = config.num_heads, config.head_dim
    # Ask torch where each element of the wrong view comes from by viewing index tensors
    # the same way: which token and which head block every row really holds.
    token_of = torch.arange(T).repeat_interleave(C).view(B, h, T, d_h)[..., 0]  # (B, h, T)
    head_of = (torch.arange(C) // d_h).repeat(T).view(B, h, T, d_h)[..., 0]  # (B, h, T)
    tags = tuple(
        tuple(f"{config.tokens[int(token_of[0, i, r])]}·h{int(head_of[0, i, r])}" for r in range(T))
        for i in range(h)
    )
    tag_heads = tuple(tuple(int(head_of[0, i, r]) for r in range(T)) for i in range(h))
    caption = ("WRONG: one view(B, h, T, d_h) reads memory in the old order; "
               "each row is labelled with the token and head block it really holds")
    if equal:  # h = 1 or T = 1: the old order is the new one, nothing to scramble
        caption = (f"the same numbers as the right Q here, because "
                   f"{_single_axes(T, h)}; each row is labelled with the token and head "
                   f"block it holds")
    return _record("Q.view(B, h, T, d_h)", q.view(B, h, T, d_h), BHTD,
                   source=("project's Q", q), caption=caption,
                   row_tags=tags, row_tag_heads=tag_heads)


def _transpose(config: Config, p: dict[str, torch.Tensor], v: dict[str, torch.Tensor],
               t: dict[str, torch.Tensor]) -> Stage:
    d_h = config.head_dim
    blocks = all(
        torch.equal(t[n][:, i], p[n][:, :, i * d_h:(i + 1) * d_h])
        for n in "QKV" for i in range(config.num_heads)
    )
    wrong = p["Q"].view(t["Q"].shape)
    wrong_equal = torch.equal(wrong, t["Q"])
    return _stage(
        "transpose", v["Q"].shape, t["Q"].shape, BTHD, BHTD,
        [_record(n, t[n], BHTD, source=(f"view's {n}", v[n])) for n in "QKV"],
        [
            Check(f"head i holds channels i*{d_h}..(i+1)*{d_h}-1 of every token", blocks),
            Check(f"same storage as the view, strides now {tuple(t['Q'].stride())}, "
                  f"contiguous: {_yes(t['Q'].is_contiguous())}",
                  all(_shares(t[n], v[n]) for n in "QKV")),
            Check("a single Q.view(B, h, T, d_h) gives different heads: "
                  f"{_yes(not torch.equal(wrong, t['Q']))}", None),
        ],
        facts={"result_contiguous": t["Q"].is_contiguous(), "wrong_view_equal": wrong_equal},
        why=_single_axes(config.seq_len, config.num_heads),
        aside=(_wrong_view(config, p["Q"], wrong_equal),),
    )


def _scores(t: dict[str, torch.Tensor], s: dict[str, torch.Tensor], d_h: int) -> Stage:
    Q, K, scores = t["Q"], t["K"], s["scores"]
    per_head = all(
        torch.allclose(scores[:, i], Q[:, i] @ K[:, i].transpose(-2, -1))
        for i in range(Q.shape[1])
    )
    return _stage(
        "scores", Q.shape, scores.shape, BHTD, BHTT,
        [_record("scores", scores, BHTT, caption="row: query token · column: key token")],
        [Check(_batched(Q.shape[1], "Q_i @ K_i^T"), per_head)],
    )


def _batched(h: int, product: str) -> str:
    if h == 1:
        return f"one batched matmul = the one head's {product.replace('_i', '_0')}"
    return f"one batched matmul = {h} separate per-head {product}"


def _scale(s: dict[str, torch.Tensor], sc: dict[str, torch.Tensor], d_h: int) -> Stage:
    raw, scaled = s["scores"], sc["scores"]
    return _stage(
        "scale", raw.shape, scaled.shape, BHTT, BHTT,
        [_record("scores", scaled, BHTT, caption=f"raw scores / sqrt({d_h}) "
                                                  f"= raw scores / {math.sqrt(d_h):.4f}")],
        [Check(f"spread (std) of the scores: {raw.std().item():.4f} raw -> "
               f"{scaled.std().item():.4f} scaled", None) if raw.numel() > 1 else
         Check("a single score: nothing to spread", None)],
    )


def _mask(module: MultiHeadAttention, config: Config, sc: dict[str, torch.Tensor],
          m: dict[str, torch.Tensor]) -> Stage:
    scaled, masked = sc["scores"], m["scores"]
    T = config.seq_len
    if not config.causal:
        return _stage(
            "mask", scaled.shape, masked.shape, BHTT, BHTT,
            [_record("scores", masked, BHTT, source=("scale's scores", scaled),
                     caption="no mask: the scaled scores, unchanged")],
            [Check("no mask was applied: the scores are the scaled scores, the same tensor",
                   torch.equal(masked, scaled) and _shares(masked, scaled))],
            causal=False,
        )
    mask = module.causal_mask[:T, :T]
    above = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    n_above = int(above.sum()) * config.num_heads
    n_inf = int(torch.isneginf(masked).sum())
    kept = torch.equal(masked[..., ~above], scaled[..., ~above])
    return _stage(
        "mask", scaled.shape, masked.shape, BHTT, BHTT,
        [
            _record("causal_mask[:T, :T]", mask, ("T", "T"),
                    caption="0 on and below the diagonal, -inf above"),
            _record("scores", masked, BHTT, source=("scale's scores", scaled)),
        ],
        [
            Check(f"{n_inf} of {n_above} entries above the diagonal are exactly -inf",
                  n_inf == n_above and bool(torch.isneginf(masked[..., above]).all()))
            if n_above else
            Check("nothing lies above the diagonal with one token: the mask adds only 0",
                  n_inf == 0),
            Check("entries on and below the diagonal are unchanged", kept),
        ],
    )


def _softmax(m: dict[str, torch.Tensor], s: dict[str, torch.Tensor]) -> Stage:
    masked, weights = m["scores"], s["weights"]
    deviation = (weights.sum(dim=-1) - 1).abs().max().item()
    blocked = torch.isneginf(masked)
    n_blocked = int(blocked.sum())
    n_zero = int((weights[blocked] == 0).sum())
    checks = [Check(f"every row sums to 1 (largest deviation {deviation:.2e})",
                    deviation < 1e-5)]
    if n_blocked:
        checks.append(Check(f"{n_zero} of {n_blocked} masked entries are exactly 0",
                            n_zero == n_blocked))
    return _stage(
        "softmax", masked.shape, weights.shape, BHTT, BHTT,
        [_record("weights", weights, BHTT, kind="prob",
                 caption="row: query token · column: key token it takes from")],
        checks,
    )


def _attend(t: dict[str, torch.Tensor], s: dict[str, torch.Tensor],
            a: dict[str, torch.Tensor]) -> Stage:
    weights, V, context = s["weights"], t["V"], a["context"]
    per_head = all(
        torch.allclose(context[:, i], weights[:, i] @ V[:, i]) for i in range(V.shape[1])
    )
    return _stage(
        "attend", weights.shape, context.shape, BHTT, BHTD,
        [_record("context", context, BHTD, caption="row t: token t's weighted mix of values")],
        [Check(_batched(V.shape[1], "weights_i @ V_i"), per_head)],
    )


def _concat(a: dict[str, torch.Tensor], c: dict[str, torch.Tensor], h: int, d_h: int) -> Stage:
    before, strided, context = a["context"], c["strided"], c["context"]
    blocks = all(
        torch.equal(context[:, :, i * d_h:(i + 1) * d_h], before[:, i]) for i in range(h)
    )
    copied = not _shares(context, strided)
    return _stage(
        "concat", before.shape, context.shape, BHTD, BTC,
        [
            _record("context.transpose(1, 2)", strided, BTHD, source=("attend's context", before)),
            _record("context", context, BTC, source=("the transposed view", strided),
                    head_split=2, caption="heads side by side: block i is head i's output"),
        ],
        [
            Check(f"the transposed view shares storage: {_yes(_shares(strided, before))}, "
                  f"contiguous: {_yes(strided.is_contiguous())}", _shares(strided, before)),
            Check(f"contiguous() copied the numbers into new storage: {_yes(copied)}",
                  copied or strided.is_contiguous()),
            Check(f"channels i*{d_h}..(i+1)*{d_h}-1 hold head i's context", blocks),
        ],
        facts={"strided_contiguous": strided.is_contiguous()},
        why=_single_axes(before.shape[2], h),
    )


def _w_o(module: MultiHeadAttention, c: dict[str, torch.Tensor], out: torch.Tensor,
         untapped: torch.Tensor, h: int, d_h: int) -> Stage:
    context, weight = c["context"], module.W_O.weight
    mixes = all(bool((weight[:, i * d_h:(i + 1) * d_h] != 0).any(dim=1).all()) for i in range(h))
    return _stage(
        "w_o", context.shape, out.shape, BTC, BTC,
        [
            _record("W_O.weight", weight, ("C_out", "C_in"), head_split=1,
                    caption="stored as (out, in); columns in blocks of d_h come from one head "
                            "each, and every row reads all of them"),
            _record("out", out, BTC, source=("concat's context", context)),
        ],
        [
            Check(f"every output channel reads from {_all(h, 'head')} (no all-zero block)",
                  mixes),
            Check(f"out equals the module's own forward, module(x): "
                  f"torch.equal = {torch.equal(out, untapped)}", torch.equal(out, untapped)),
        ],
    )
