"""The eleven stages of a multi-head attention forward pass, as a learner reads them, and
the title of every other stage kind (`TITLES`, `title_of`): the one home of the titles.

This catalogue is pure data so that the app can draw its stage rail (and `--stage` check
its choices) before torch or NumPy is imported: each kind's title and explanation, and the
sentences a computed fact replaces. Its `code` strings are mygpt's lines, shown only while
the module has not run yet; a traced stage shows the statements its own ops ran (a test
checks that they are in the file that ran). A kind's rules and how its stage is built live
in `mha_tui/kinds/`. Never import torch, numpy, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """A sentence of an explanation that a computed fact can contradict, and its replacement.

    `fact` names a boolean the tracer computes from the recorded tensors; when it is True
    `instead` replaces `general`. `instead` may name values ({why}) the tracer supplies.
    """

    fact: str
    general: str
    instead: str


# The fact behind the NumPy wording: x is (T, C) with no batch axis, weights are used as
# x @ W, heads are split by reshape (the blueprint's conventions).
NO_BATCH = "no_batch"


@dataclass(frozen=True)
class StageInfo:
    id: str
    title: str
    code: str
    explanation: str
    variants: tuple[Variant, ...] = ()

    def explain(self, facts: dict[str, bool], **values: str) -> str:
        """The explanation with every sentence the facts contradict replaced."""
        text = self.explanation
        for variant in self.variants:
            if facts.get(variant.fact) and variant.fact != NO_BATCH:
                assert variant.general in text, (self.id, variant.general)
                text = text.replace(variant.general, variant.instead.format(**values))
        return self.reword(text) if facts.get(NO_BATCH) else text

    def reword(self, text: str) -> str:
        """An explanation (maybe already varied) in NumPy's words: no batch axis, x @ W,
        reshape. Sentences that are not there (a stage's own wording) are left alone."""
        for variant in self.variants:
            if variant.fact == NO_BATCH:
                text = text.replace(variant.general, variant.instead)
        return text


STAGES: tuple[StageInfo, ...] = (
    StageInfo(
        "embed",
        "Embed the tokens",
        "x = embedding(ids)",
        "The sentence is split on whitespace; each distinct token gets an id in order of "
        "first appearance. The embedding table holds one learned row of C numbers per "
        "vocabulary entry, and looking up the ids gives x, one row per token: (B, T, C).",
        (
            Variant(NO_BATCH, "one row per token: (B, T, C).",
                    "one row per token: (T, C), with no batch axis."),
        ),
    ),
    StageInfo(
        "project",
        "Project to queries, keys and values",
        "Q, K, V = self.W_Q(x), self.W_K(x), self.W_V(x)",
        "Three C x C linear layers turn every token into a query (what it looks for), a "
        "key (what it offers) and a value (what it passes on). nn.Linear stores its weight "
        "as (out, in) and computes x @ W.T, so output channel j is row j of the weight. "
        "Output channels 0..d_h-1 will become head 0, the next d_h head 1, and so on.",
        (
            Variant(NO_BATCH, "Three C x C linear layers", "Three C x C matrices"),
            Variant(NO_BATCH, "nn.Linear stores its weight as (out, in) and computes x @ W.T, so "
                    "output channel j is row j of the weight.",
                    "Each is stored as (in, out) and used as x @ W, so output channel j is "
                    "column j of W."),
        ),
    ),
    StageInfo(
        "view",
        "Split the channels into heads",
        "Q, K, V = Q.view(B, T, h, d_h), K.view(B, T, h, d_h), V.view(B, T, h, d_h)",
        "view re-reads the same memory with a new shape: the C axis of each token is cut "
        "into h groups of d_h channels. No number moves and nothing is copied; only the "
        "shape and the strides change.",
        (
            Variant(NO_BATCH, "view re-reads the same memory",
                    "reshape re-reads the same memory (here it can: the numbers are contiguous)"),
        ),
    ),
    StageInfo(
        "transpose",
        "Move the head axis next to the batch axis",
        "Q, K, V = Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2)",
        "transpose(1, 2) swaps the T and h axes, giving (B, h, T, d_h): now every head owns a "
        "(T, d_h) matrix and one batched matmul can treat (B, h) as batch axes. It is still "
        "the same memory read with swapped strides, so the result is not contiguous. "
        "A single view(B, h, T, d_h) would NOT do this: it would slice the memory in the "
        "wrong order and mix tokens into the wrong heads.",
        (
            Variant("result_contiguous",
                    "so the result is not contiguous.",
                    "and because {why}, the order in memory is unchanged: the result is "
                    "still contiguous."),
            Variant("wrong_view_equal",
                    "A single view(B, h, T, d_h) would NOT do this: it would slice the memory "
                    "in the wrong order and mix tokens into the wrong heads.",
                    "Here a single view(B, h, T, d_h) gives the same numbers, because {why}; "
                    "with more heads and tokens it would slice the memory in the wrong order "
                    "and mix tokens into the wrong heads."),
            Variant(NO_BATCH, "transpose(1, 2) swaps the T and h axes, giving (B, h, T, d_h): now "
                    "every head owns a (T, d_h) matrix and one batched matmul can treat (B, h) as "
                    "batch axes.",
                    "transpose(1, 0, 2) swaps the T and h axes, giving (h, T, d_h): now every head "
                    "owns a (T, d_h) matrix, ready for a loop over heads or one batched matmul "
                    "or einsum."),
            Variant(NO_BATCH, "single view(B, h, T, d_h)", "single reshape(h, T, d_h)"),
        ),
    ),
    StageInfo(
        "scores",
        "Raw attention scores: Q @ K^T",
        "scores = Q @ K.transpose(-2, -1)",
        "Each head compares every query with every key by a dot product over its d_h "
        "channels. One batched matmul yields h separate (T, T) score matrices: row = the "
        "query token, column = the key token it is compared with.",
        (
            Variant(NO_BATCH, "One batched matmul yields",
                    "Whether one head at a time in a loop or all at once in one einsum, this "
                    "yields"),
        ),
    ),
    StageInfo(
        "scale",
        "Scale by sqrt(d_h)",
        "scores = scores / math.sqrt(d_h)",
        "Dot products of d_h-dimensional vectors grow with d_h; dividing by sqrt(d_h) keeps "
        "the scores in a range where softmax does not saturate into one-hot rows.",
    ),
    StageInfo(
        "mask",
        "Causal mask: no peeking ahead",
        "scores = scores + self.causal_mask[:T, :T]",
        "A token may only attend to itself and earlier tokens. Adding -inf above the "
        "diagonal makes those entries exactly -inf, which softmax turns into exactly 0. "
        "The same (T, T) mask broadcasts over every batch and head.",
        (
            Variant(NO_BATCH, "over every batch and head.", "over every head."),
        ),
    ),
    StageInfo(
        "softmax",
        "Softmax: scores become weights",
        "weights = F.softmax(scores, dim=-1)",
        "Softmax along each row turns scores into attention weights: every entry is in "
        "[0, 1] and every row sums to 1. Row t says how much token t takes from each token.",
    ),
    StageInfo(
        "attend",
        "Weighted sum of the values",
        "context = weights @ V",
        "Each head mixes its value vectors with its weights: row t of the result is the "
        "weighted average of the value rows that token t attends to, (B, h, T, d_h).",
        (
            Variant(NO_BATCH, "attends to, (B, h, T, d_h).", "attends to, (h, T, d_h)."),
        ),
    ),
    StageInfo(
        "concat",
        "Put the heads back side by side",
        "strided = context.transpose(1, 2)\ncontext = strided.contiguous().view(B, T, C)",
        "transpose(1, 2) brings the token axis back in front: (B, T, h, d_h), a strided "
        "view. view needs contiguous memory, so contiguous() copies the numbers into the "
        "new order first; then view(B, T, C) lays the h heads' d_h channels side by side.",
        (
            Variant("strided_contiguous",
                    "a strided view. view needs contiguous memory, so contiguous() copies the "
                    "numbers into the new order first;",
                    "a view that is already contiguous because {why}. contiguous() therefore "
                    "returns it as it is, copying nothing;"),
            Variant(NO_BATCH, "transpose(1, 2) brings the token axis back in front: (B, T, h, d_h), "
                    "a strided view. view needs contiguous memory, so contiguous() copies the "
                    "numbers into the new order first; then view(B, T, C) lays the h heads' d_h "
                    "channels side by side.",
                    "transpose(1, 0, 2) brings the token axis back in front: (T, h, d_h), a "
                    "strided view. reshape(T, C) then lays the h heads' d_h channels side by "
                    "side; NumPy copies the numbers into the new order only when the view's "
                    "memory order does not allow a plain re-read (the checks say which "
                    "happened)."),
        ),
    ),
    StageInfo(
        "w_o",
        "Output projection W_O",
        "out = self.out_drop(self.W_O(context))",
        "A final C x C linear layer mixes the heads: every output channel is a weighted sum "
        "over all C input channels, so over every head. Without W_O, head 0's features "
        "could never combine with head 1's.",
        (
            Variant(NO_BATCH, "A final C x C linear layer", "A final C x C matrix, W_O,"),
        ),
    ),
)

STAGE_IDS: tuple[str, ...] = tuple(stage.id for stage in STAGES)

# The titles of the stage kinds beyond the eleven, for a mechanism the textbook forward
# lacks (each kind's module in mha_tui/kinds/ reads its own here, `title_of(KIND)`), so that
# every kind's title has one home, readable before NumPy or torch is imported. A kind whose
# title says what its stage found (a mask's shape, a norm's placement, the number of K/V
# heads) makes it where it builds the stage, from these words or its own.
TITLES: dict[str, str] = {
    "rotary": "Rotary positions: turn Q and K by each token's position",
    "differential": "Differential attention: the second softmax map, times λ, subtracted from the first",
    "linear_attn": "Linear attention, not softmax attention: φ(Q) (φ(K)^T V), no (T, T) scores",
    "softcap": "Soft-capping: the scores squashed into (−cap, cap) by cap · tanh(scores / cap)",
    "cosine": "Cosine attention: q and k at unit length, the scores times a learned scale",
    "sinks": "Attention sinks: a learned extra key per head, dropped after softmax",
    "kv_cache": "The KV cache: the new token's key and value joined to those of the tokens before",
}


def title_of(kind: str) -> str:
    """A stage kind's title: the catalogue's for the eleven, `TITLES`' for the others."""
    if kind in TITLES:
        return TITLES[kind]
    return stage_info(kind).title

# The mask stage of a NumPy forward given mask=None (--no-causal): its guarded line did not
# run and so was not recorded; the stage says so and shows no code.
NO_MASK_ARGUMENT = StageInfo(
    "mask",
    "No mask: --no-causal passed none",
    "",
    "No mask was applied. With --no-causal the forward got mask=None, so no mask was added "
    "to the scores: every token may attend to every token, later ones included, and the "
    "scaled scores go on to softmax unchanged.",
)

# The mask stage of a module built with causal=False: the line that adds the mask is
# guarded by `if self.causal:` and did not run. Shown as skipped, never as if it ran.
NO_MASK = StageInfo(
    "mask",
    "No mask: --no-causal skipped it",
    "if self.causal:  # False: the module was built with causal=False\n"
    "    scores = scores + self.causal_mask[:T, :T]  # skipped, did not run",
    "No mask was applied. The module was built with causal=False, so the line that adds "
    "the causal mask did not run: every token may attend to every token, later ones "
    "included, and the scaled scores go on to softmax unchanged.",
)


def code_lines(code: str) -> list[str]:
    """The source lines of a stage's code, without the annotations mha-tui adds as comments."""
    return [line.split("  # ", 1)[0] for line in code.splitlines()]


def stage_info(stage_id: str, *, causal: bool = True) -> StageInfo:
    if stage_id == "mask" and not causal:
        return NO_MASK
    for stage in STAGES:
        if stage.id == stage_id:
            return stage
    raise KeyError(stage_id)
