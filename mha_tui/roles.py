"""What a head is for: its scores as a previous-token, induction, duplicate-token, first-token
and current-token head, computed from one run's own attention weights, and the label it earns.

Each score is a mean of entries of the head's weights w (query row i, key column k), and which
entries is stated with the score (`Score.formula`, `Score.entries`), so that a learner can
check it against the heatmap: nothing is estimated, nothing comes from another run.

* previous-token: mean over queries i >= 1 of w[i, i-1]
* current-token:  mean over queries i >= 1 of w[i, i]
* first-token:    mean over queries i >= 1 of w[i, 0] (an attention sink)
* duplicate-token: mean, over the queries whose token appeared before, of the weight on all
  its earlier occurrences: Σ_{k < i, token k = token i} w[i, k]
* induction: mean, over the queries whose token appeared before, of the weight on the tokens
  that FOLLOWED its earlier occurrences: Σ_{k-1 < i, token k-1 = token i, k < i} w[i, k]
  (a b c ... a: the second a attends to the first b)

Query 0 is left out of the first three: under a causal mask its only key is itself. Duplicate
and induction scores need a token that repeats; on a sentence without one they are None and
the caller says so (and offers `--repeat`). A head earns the label of its highest score when
that score is at least `LABEL_THRESHOLD`; otherwise it is "mixed".

NumPy only: never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .records import Check

# The order is the tie-break order, and the order every table shows.
KINDS = ("previous-token", "induction", "duplicate-token", "first-token", "current-token")
LABEL_THRESHOLD = 0.5
NEEDS_REPEAT = ("induction", "duplicate-token")
FORMULAS = {
    "previous-token": "mean over queries i >= 1 of w[i, i-1]",
    "induction": ("mean over repeated queries i of the sum of w[i, k], k-1 an earlier occurrence "
                  "of token i"),
    "duplicate-token": ("mean over repeated queries i of the sum of w[i, k], k an earlier "
                        "occurrence of token i"),
    "first-token": "mean over queries i >= 1 of w[i, 0]",
    "current-token": "mean over queries i >= 1 of w[i, i]",
}


@dataclass(frozen=True)
class Score:
    """One score of one head: the mean of the weights at `entries`, one group per query."""

    kind: str
    value: float | None  # None: no query qualifies (no repeated token)
    # One group per query averaged: (query i, the keys k whose weights w[i, k] are summed).
    entries: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def formula(self) -> str:
        return FORMULAS[self.kind]

    def entries_text(self, limit: int = 4) -> str:
        """The entries averaged, as w[i, k] (+ w[i, k'] ...), the first few of them."""
        parts = [" + ".join(f"w[{i}, {k}]" for k in keys) for i, keys in self.entries]
        parts = [f"({part})" if "+" in part else part for part in parts]
        shown = ", ".join(parts[:limit]) + (", …" if len(parts) > limit else "")
        return f"mean of {len(parts)}: {shown}" if parts else "no entry: no token repeats"


@dataclass(frozen=True)
class HeadRole:
    """A head's five scores and the label the highest earns (or "mixed")."""

    layer: int
    head: int
    scores: tuple[Score, ...]
    label: str

    def score(self, kind: str) -> Score:
        return next(score for score in self.scores if score.kind == kind)

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.head}"

    @property
    def best(self) -> Score | None:
        known = [s for s in self.scores if s.value is not None]
        return max(known, key=lambda s: s.value) if known else None  # type: ignore[arg-type, return-value]


def score_entries(ids: Sequence[int]) -> dict[str, tuple[tuple[int, tuple[int, ...]], ...]]:
    """For a sentence's ids, the entries each score averages (they depend on the ids only)."""
    T = len(ids)
    earlier = [tuple(k for k in range(i) if ids[k] == ids[i]) for i in range(T)]
    return {
        "previous-token": tuple((i, (i - 1,)) for i in range(1, T)),
        "induction": tuple((i, keys) for i in range(T)
                           if (keys := tuple(k + 1 for k in earlier[i] if k + 1 < i))),
        "duplicate-token": tuple((i, earlier[i]) for i in range(T) if earlier[i]),
        "first-token": tuple((i, (0,)) for i in range(1, T)),
        "current-token": tuple((i, (i,)) for i in range(1, T)),
    }


def has_repeat(ids: Sequence[int]) -> bool:
    """Whether an induction score means anything here: some token follows an earlier copy of itself."""
    return bool(score_entries(ids)["induction"])


def head_roles(weights: np.ndarray, ids: Sequence[int], layer: int) -> tuple[HeadRole, ...]:
    """Every head's scores from one layer's weights (h, T, T) (or (B, h, T, T): batch row 0)."""
    if weights.ndim == 4:
        weights = weights[0]
    if weights.ndim != 3 or weights.shape[1] != weights.shape[2] or weights.shape[2] != len(ids):
        raise ValueError(f"head scores need self-attention weights (h, T, T) for T = {len(ids)} "
                         f"tokens, not {weights.shape}")
    entries = score_entries(ids)
    roles = []
    for head in range(weights.shape[0]):
        w = weights[head].astype(np.float64)  # (T, T)
        scores = tuple(Score(kind, _mean(w, entries[kind]), entries[kind]) for kind in KINDS)
        roles.append(HeadRole(layer, head, scores, _label(scores)))
    return tuple(roles)


def _mean(w: np.ndarray, entries: tuple[tuple[int, tuple[int, ...]], ...]) -> float | None:
    if not entries:
        return None
    return float(np.mean([w[i, list(keys)].sum() for i, keys in entries]))


def _label(scores: Sequence[Score]) -> str:
    best = None
    for score in scores:  # KINDS order: the first of equal scores wins
        if score.value is not None and (best is None or score.value > best.value):
            best = score
    return best.kind if best is not None and best.value >= LABEL_THRESHOLD else "mixed"  # type: ignore[operator]


def find(roles: Sequence[HeadRole], kind: str) -> HeadRole | None:
    """The head with the highest `kind` score among those labelled `kind`, if any."""
    labelled = [role for role in roles if role.label == kind]
    return max(labelled, key=lambda r: r.score(kind).value or 0.0) if labelled else None


def parse_head(text: str) -> tuple[int, int]:
    """`--ablate 1.2` -> (layer 1, head 2); a ValueError names what is wrong."""
    parts = text.split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise ValueError(f"--ablate takes LAYER.HEAD, e.g. 1.2 (layer 1, head 2), not {text!r}")
    return int(parts[0]), int(parts[1])


# ---------------------------------------------------------------- said at the softmax stage


def score_line(role: HeadRole) -> str:
    """`previous-token 0.99 · induction 0.01 · ...` (a score without entries: "-")."""
    return " · ".join(f"{score.kind} {'-' if score.value is None else f'{score.value:.2f}'}"
                      for score in role.scores)


def label_words(role: HeadRole) -> str:
    if role.label == "mixed":
        return f"no label (no score reaches {LABEL_THRESHOLD})"
    article = "an" if role.label[0] in "aeiou" else "a"
    return f"{article} {role.label} head (its highest score, >= {LABEL_THRESHOLD})"


def no_repeat_words() -> str:
    return ("induction and duplicate-token scores need a token that occurs twice; this "
            "sentence repeats none, so they are not computed (--repeat runs the sentence twice)")


def roles_of(weights: np.ndarray, ids: Sequence[int], layer: int) -> tuple[HeadRole, ...]:
    """head_roles, or () when the weights are not one row and one column per token (a
    cross-attention, a padded batch): a score needs query i and key k to be the same tokens."""
    if weights.ndim == 3 and weights.shape[0] == len(ids):  # (B, T, T): one head
        weights = weights[:1]
    if weights.ndim not in (3, 4) or weights.shape[-1] != len(ids) or weights.shape[-2] != len(ids):
        return ()
    return head_roles(weights, ids, layer)


def role_checks(weights: np.ndarray, ids: Sequence[int], layer: int) -> list[Check]:
    """The softmax stage's lines about its heads: each head's scores and label, the entries
    each score averages, and what is missing without a repeat ([] when roles_of has none)."""
    roles = roles_of(weights, ids, layer)
    if not roles:
        return []
    checks = [Check(f"head {role.name} (layer {role.layer}, head {role.head}): {score_line(role)}"
                    f" → {label_words(role)}", None) for role in roles]
    said = [f"{score.kind} = {score.formula}: {score.entries_text()}"
            for score in roles[0].scores if score.value is not None]
    checks.append(Check("each score averages entries of the head's weights w[i, k] (query row i, "
                        "key column k): " + "; ".join(said), None))
    if not has_repeat(ids):
        checks.append(Check(no_repeat_words(), None))
    return checks


# ---------------------------------------------------------------- the whole model at a glance


@dataclass(frozen=True)
class Predictions:
    """The model's next-token predictions on the sentence (the logits at position t are for
    the token at t + 1), and how well they copy a repeat.

    copyable: the positions t whose next token can be read off an earlier occurrence (some
    s < t holds the same token as t, and s + 1 the same token as t + 1): the repeated part,
    where an induction head is what predicts. accuracy: the share of those where the top
    prediction is the next token (None when there is none)."""

    loss: float  # mean next-token cross entropy over positions 0 .. T-2, in nats
    top: tuple[int, ...]  # the top prediction's id at each position 0 .. T-1
    top_words: tuple[str, ...]
    top_probability: tuple[float, ...]
    copyable: tuple[int, ...]
    accuracy: float | None


@dataclass(frozen=True)
class Ablation:
    """One head removed and the model run again: its slice of the input to the output
    projection W_O set to zero ("zero") or to its mean over the sentence's positions ("mean")."""

    layer: int
    head: int
    method: str
    projection: str  # the submodule whose input was changed, e.g. model.blocks.1.attn.W_O
    after: Predictions


@dataclass(frozen=True, eq=False)
class ModelView:
    """Every head of every layer of one run on one sentence: its weights, scores and label."""

    name: str  # --model induction, --hf DIR
    class_name: str
    tokens: tuple[str, ...]
    ids: tuple[int, ...]
    weights: tuple[np.ndarray, ...]  # by layer: (h, T, T), the softmax the layer computed
    roles: tuple[tuple[HeadRole, ...], ...]  # by layer, by head
    sources: tuple[str, ...]  # by layer: the attention module's path
    predictions: Predictions | None = None  # None: the model predicts no next token (an encoder)
    ablation: Ablation | None = None
    encoder: bool = False

    @property
    def n_layers(self) -> int:
        return len(self.weights)

    @property
    def num_heads(self) -> int:
        return self.weights[0].shape[0] if self.weights else 0

    @property
    def repeated(self) -> bool:
        return has_repeat(self.ids)

    def role(self, layer: int, head: int) -> HeadRole:
        return self.roles[layer][head]

    def labelled(self, kind: str) -> HeadRole | None:
        """The head, in any layer, with the highest `kind` score among those labelled `kind`."""
        return find([role for layer in self.roles for role in layer], kind)


def copyable_positions(ids: Sequence[int]) -> tuple[int, ...]:
    """Positions t < T-1 whose next token follows an earlier occurrence of token t."""
    T = len(ids)
    return tuple(t for t in range(T - 1)
                 if any(ids[s] == ids[t] and ids[s + 1] == ids[t + 1] for s in range(t)))


def role_notes(role: HeadRole, i: int, k: int) -> list[str]:
    """--why of weight w[i, k] of a head: the scores it is an entry of."""
    notes = []
    for score in role.scores:
        for query, keys in score.entries:
            if query == i and k in keys:
                notes.append(f"this weight is one of the {len(score.entries)} entries averaged "
                             f"in head {role.name}'s {score.kind} score ({score.formula}) = "
                             f"{score.value:.4f}; the head's label: {role.label}")
    return notes
