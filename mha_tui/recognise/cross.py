"""Cross-attention's words: the queries from one sequence, the keys and values from another.

The stages are recognised as for self-attention (the builder names the keys' axis T_k,
`builder.KEYS`); here each stage whose meaning changes says so in one sentence, with the
sizes the forward showed: which tokens the queries and the keys come from, that the scores
are T_q x T_k, that no causal mask is expected across two sequences (or that the module
applies its own). Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace

from ..kinds._parts.builder import KEYS, plural
from ..kinds.softmax import UNMASKED_SELF
from ..ops.numeric import zero_columns
from ..ops.sizes import Sizes
from ..ops.vocab import CONCATS
from ..records import Check, OpRecord, Recording, Stage


def cross_words(stages: tuple[Stage, ...], sizes: Sizes, query: str, context: str
                ) -> tuple[Stage, ...]:
    """The stages with cross-attention's sentence added where it changes their meaning.
    query, context: the forward's parameters the two sequences came in by."""
    T_q, T_k = sizes.T, sizes.keys
    masked = any(stage.kind == "mask" and stage.ops for stage in stages)
    looks = (f"cross-attention: each of the {plural(T_q, 'query token')} looks at the "
             f"{plural(T_k, 'context token')}")
    said = {
        "project": (f"Cross-attention: the queries come from {query} ({plural(T_q, 'token')}), "
                    f"the keys and values from {context} ({plural(T_k, 'token')})."),
        "scores": (f"{looks[0].upper()}{looks[1:]}: the scores are T_q x T_k = {T_q} x {T_k}, "
                   "one row per query token, one column per context token."),
        "softmax": (f"Each row sums to 1 over the {plural(T_k, 'context token')}. "
                    + ("The module masks some of them itself (its mask stage)."
                       if masked else "No causal mask across two sequences: every query token "
                       "may look at every context token.")),
        "attend": (f"Each query token's output is a weighted sum of the {plural(T_k, 'value')} "
                   "made from the context."),
    }
    out = []
    for stage in stages:
        sentence = said.get(stage.kind)
        if sentence is not None and (stage.kind != "scores" or KEYS in stage.dims_out):
            stage = replace(stage, explanation=f"{stage.explanation} {sentence}".strip().replace(
                "(T, T)", "(T_q, T_k)"))
        if stage.kind == "softmax":  # self-attention's "every token sees every token" is not it
            stage = replace(stage, note=stage.note.replace(UNMASKED_SELF, "").strip())
        if stage.kind == "scores" and KEYS in stage.dims_out:
            stage = replace(stage, checks=(*stage.checks, Check(looks, None)))
        if stage.kind == "project":
            stage = replace(stage, tensors=tuple(
                replace(t, caption=t.caption.replace("= x @", f"= {context} @"))
                if KEYS in t.dims else t for t in stage.tensors))
        out.append(stage)
    return tuple(out)


def cache_words(stages: tuple[Stage, ...], sizes: Sizes) -> tuple[Stage, ...]:
    """A decode step: the new queries against every key kept so far (the cache's and the
    new ones), said where the scores are made."""
    T_q, T_k = sizes.T, sizes.keys
    looks = (f"decoding with a KV cache: {plural(T_q, 'new query', 'new queries')} "
             f"{'looks' if T_q == 1 else 'look'} at {plural(T_k, 'key')}, "
             f"{T_k - T_q} from the cache and {T_q} just made")
    # The cache as the module keeps it: the tensors its concatenations made, T_k long.
    cached = [t for stage in stages if any(op.name in CONCATS for op in stage.ops)
              for t in (stage.tensors if stage.kind == "kv_cache" else stage.tensors[-1:])
              if KEYS in t.dims]
    cost = None
    if cached:
        total = sum(int(t.values.nbytes) for t in cached)
        shapes = ", ".join(str(tuple(t.values.shape)) for t in cached)
        cost = Check(f"the KV cache: {plural(len(cached), 'tensor')} {shapes} "
                     f"{cached[0].values.dtype} = {total} bytes, {total // T_k} bytes per token",
                     None)
    masked = any(stage.kind == "mask" and stage.ops for stage in stages)
    one = ("one new query" if T_q == 1 else f"{T_q} new queries") + " at the end of the sequence"
    softmax = next((s for s in stages if s.kind == "softmax" and s.tensors), None)
    blocked = (zero_columns(softmax.tensors[-1].values, T_k - T_q + 1)
               if T_q == 1 and softmax is not None else [])
    said = {
        "mask": (f"Decoding with a KV cache: {one}, and every key ({T_k - T_q} from the cache, "
                 f"{T_q} just made) comes from {'it' if T_q == 1 else 'them'} or before, so a "
                 "causal mask has "
                 + ("to block only the later new tokens: its rows start at the cache's offset."
                    if T_q != 1 else
                    "nothing to block for it, and this one blocks no entry here." if not blocked
                    else f"nothing to block for it; yet this one blocks keys "
                         f"{', '.join(map(str, blocked))}: it ignores the cache's offset.")),
        "softmax": (f"Decoding with a KV cache: each row is a new query's weights over the "
                    f"{plural(T_k, 'key')} kept so far. "
                    + ("The module masks them itself (its mask stage)." if masked else
                       "No mask is needed: one new query, and every key in the cache comes "
                       "before it." if T_q == 1 else "")),
    }
    out = []
    for stage in stages:
        if stage.kind == "scores" and KEYS in stage.dims_out:
            stage = replace(stage, explanation=(
                f"{stage.explanation} {looks[0].upper()}{looks[1:]}: the scores are T_q x T_k "
                f"= {T_q} x {T_k}.").replace("(T, T)", "(T_q, T_k)"),
                checks=(*stage.checks, Check(looks, None), *([cost] if cost else [])))
        sentence = said.get(stage.kind)
        if sentence is not None:
            stage = replace(stage, explanation=f"{stage.explanation} {sentence}".strip().replace(
                "The same (T, T) mask", "The same mask"))
        if stage.kind == "softmax":  # self-attention's "every token sees every token" is not it
            stage = replace(stage, note=stage.note.replace(UNMASKED_SELF, "").strip())
        out.append(stage)
    return tuple(out)


# The op that ends one attention's weighting: a softmax, or the fused op.
_CORES = {"softmax", "_softmax", "scaled_dot_product_attention"}


def stacked_attentions(rec: Recording) -> tuple[str, str] | None:
    """A forward that runs two attentions one after the other (nn.TransformerDecoderLayer:
    self_attn, then multihead_attn on its output): the two, each named by the innermost
    submodule that ran it (else its op), the second made from the first's output; None when
    every attention's weighting is independent of the others' (one attention, or heads side
    by side)."""
    cores = [op for op in rec.ops if op.name in _CORES]
    if len(cores) < 2:
        return None
    producer = {op.index: op for op in rec.ops}
    for later in cores[1:]:
        todo, seen = [later.index], set()
        while todo:
            i = todo.pop()
            for ref in producer[i].inputs:
                if ref.kind != "op" or ref.op is None or ref.op in seen:
                    continue
                seen.add(ref.op)
                if ref.op in producer and producer[ref.op].name in _CORES:
                    return _ran_by(rec, producer[ref.op]), _ran_by(rec, later)
                todo.append(ref.op)
    return None


def _ran_by(rec: Recording, op: OpRecord) -> str:
    calls = [c for c in rec.calls if c.first <= op.index < c.end]
    inner = min(calls, key=lambda c: c.end - c.first, default=None)
    return inner.path if inner is not None else f"{op.name} at line {op.source.line}"
