"""What a mask blocks, read from the blocked entries alone: causal, a sliding window of w,
padding (whole key columns), both, or another pattern, with the words for each. Shared by the
mask kind and by the scores kind's mask inside torch.baddbmm (nn.MultiheadAttention).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MaskShape:
    """What a mask blocks, read from the blocked entries: its kind and the words for it."""

    kind: str  # "causal", "window", "padding", "causal+padding", "none", "other"
    window: int = 0  # w: a token sees itself and the w - 1 tokens before it
    title: str = ""
    explanation: str = ""
    what: str = ""


_PADDING_WHY = (
    "Padding fills a shorter sequence up to the batch's length so that sequences of different "
    "lengths fit one tensor; a padding token is not part of the text, so no query may take "
    "anything from it: its key column is blocked for every query, in every head, and softmax "
    "gives it weight 0.")


def token_names(tokens: Sequence[str]) -> tuple[str, ...]:
    """Each position's token as the tables label it: a word that occurs twice gets its
    position (`[PAD]·4`)."""
    return tuple(f"{word}·{t}" if tokens.count(word) > 1 else word
                 for t, word in enumerate(tokens))


def _keys(columns: np.ndarray, names: Sequence[str] | None) -> str:
    """Key positions, by their tokens when known (`[PAD]·4, [PAD]·5`), else by number."""
    at = [int(j) for j in np.flatnonzero(columns)]
    if names is not None and len(names) == columns.shape[-1]:
        return ", ".join(names[j] for j in at)
    return ", ".join(map(str, at))


def _row_padding(blocked: np.ndarray, names: Sequence[str] | None) -> MaskShape | None:
    """Padding that differs per batch row (each row its own padded keys, the same in every
    head and for every query of that row), with or without a causal mask: (B, ..., T, T)."""
    if blocked.ndim < 3 or blocked.shape[0] < 2:
        return None
    T = blocked.shape[-1]
    ahead = np.triu(np.ones((T, T), dtype=bool), 1)
    rows = blocked.reshape(blocked.shape[0], -1, T, T)
    causal: set[bool] = set()
    keys = []
    for b, row in enumerate(rows):
        pattern = row[0]
        if not bool((row == pattern).all()):
            return None
        columns = pattern.all(axis=0)
        if np.array_equal(pattern, np.broadcast_to(columns, pattern.shape)):
            causal.add(False)
        elif np.array_equal(pattern, ahead | columns[None, :]):
            causal.add(True)
        else:
            return None
        keys.append(f"row {b}: " + (_keys(columns, names if b == 0 else None) or "none"))
    if len(causal) != 1:
        return None
    listed = "; ".join(keys)
    if causal == {True}:
        return MaskShape("causal+padding", title=f"Causal and padding mask: {listed} blocked",
                         explanation=("A token may attend to itself and earlier tokens, and "
                                      f"never to a padded key ({listed}). " + _PADDING_WHY),
                         what=f"keys after the query, and each row's padded keys ({listed})")
    return MaskShape("padding", title=f"Padding: keys blocked for every query ({listed})",
                     explanation=(f"Padded keys, per batch row: {listed}. Every query's score "
                                  "for them is blocked; nothing else is (no causal mask: every "
                                  "real token sees every real token, later ones included). "
                                  + _PADDING_WHY),
                     what=f"every query's score for each row's padded keys ({listed})")


def mask_shape(blocked: np.ndarray, names: Sequence[str] | None = None) -> MaskShape:
    """Causal, a sliding window of w, padding (whole key columns), both, or another shape;
    the same for every batch row and head (or padding of each row's own keys), else "other".
    blocked: (..., T, T) booleans; names: the key positions' tokens, for the words."""
    if blocked.ndim < 2 or blocked.shape[-1] != blocked.shape[-2]:
        return MaskShape("other", title="Mask", what="a mask of another shape")
    flat = blocked.reshape(-1, *blocked.shape[-2:])
    pattern = flat[0]
    if not bool((flat[1:] == pattern).all()):  # every head and batch row alike
        per_row = _row_padding(blocked, names)
        if per_row is not None:
            return per_row
        return MaskShape("other", title="Mask: a different pattern per head or batch row",
                         what="entries that differ between heads or batch rows")
    T = pattern.shape[-1]
    ahead = np.triu(np.ones((T, T), dtype=bool), 1)  # key after the query
    if not pattern.any():
        return MaskShape("none", title="Mask that blocks nothing",
                         what="none: every token sees every token")
    if np.array_equal(pattern, ahead):
        return MaskShape("causal")
    rows, cols = np.indices((T, T))
    for w in range(1, T):
        if np.array_equal(pattern, ahead | (rows - cols >= w)):
            return MaskShape(
                "window", window=w,
                title=f"Sliding-window mask: each token sees itself and {w - 1} before it (w = {w})",
                explanation=(
                    f"A sliding window of w = {w}: a token may attend to itself and the {w - 1} "
                    f"token{'s' if w != 2 else ''} just before it, never to a later token and never "
                    f"further back (Mistral's sliding_window, GPT-Neo's local layers, Longformer). "
                    f"The blocked scores become -inf (or a large negative number) and softmax turns "
                    f"them into 0. Information from further back still arrives, through earlier "
                    f"layers: each layer reaches {w - 1} more token{'s' if w != 2 else ''} back."),
                what=f"keys after the query and keys {w} or more tokens back (a window of {w})")
    columns = pattern.all(axis=0)
    if columns.any() and np.array_equal(pattern, np.broadcast_to(columns, pattern.shape)):
        keys = _keys(columns, names)
        return MaskShape("padding", title=f"Padding: keys {keys} blocked for every query",
                         explanation=(f"Keys {keys} are padding: every query's score for them is "
                                      "blocked, so softmax gives them 0 weight. Nothing else is "
                                      "blocked: every real token sees every real token, later "
                                      "ones included (no causal mask). " + _PADDING_WHY),
                         what=f"every query's score for keys {keys} (padding)")
    if columns.any() and np.array_equal(pattern, ahead | columns[None, :]):
        keys = _keys(columns, names)
        return MaskShape("causal+padding", title=f"Causal and padding mask: keys {keys} blocked",
                         explanation=(f"A token may attend to itself and earlier tokens, and never "
                                      f"to the padded keys {keys}. " + _PADDING_WHY),
                         what=f"keys after the query, and keys {keys} (padding)")
    return MaskShape("other", title="Mask: neither causal nor a window",
                     explanation=("The mask blocks a pattern that is neither causal nor a sliding "
                                  "window nor padding; the blocked entries are shown as -inf."),
                     what=f"{int(pattern.sum())} entries per head in another pattern")


def blocks_word(shape: MaskShape) -> str:
    """What a stage's `blocks` says of a mask of this shape (the header's words read it)."""
    return f"window {shape.window}" if shape.kind == "window" else shape.kind
