"""What a mask blocks, read from the blocked entries alone: causal, a sliding window of w,
padding (whole key columns), both, or another pattern, with the words for each. Shared by the
mask kind and by the scores kind's mask inside torch.baddbmm (nn.MultiheadAttention).

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

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


def mask_shape(blocked: np.ndarray) -> MaskShape:
    """Causal, a sliding window of w, padding (whole key columns), both, or another shape;
    the same for every batch row and head, else "other". blocked: (..., T, T) booleans."""
    if blocked.ndim < 2 or blocked.shape[-1] != blocked.shape[-2]:
        return MaskShape("other", title="Mask", what="a mask of another shape")
    flat = blocked.reshape(-1, *blocked.shape[-2:])
    pattern = flat[0]
    if not bool((flat[1:] == pattern).all()):  # every head and batch row alike
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
        keys = ", ".join(str(j) for j in np.flatnonzero(columns))
        return MaskShape("padding", title="Padding mask: padded keys are never looked at",
                         explanation=(f"Keys {keys} are padding: every query's score for them is "
                                      "blocked, so softmax gives them 0 weight. Nothing else is "
                                      "blocked: every real token sees every real token, later "
                                      "ones included (no causal mask)."),
                         what=f"every query's score for keys {keys} (padding)")
    if columns.any() and np.array_equal(pattern, ahead | columns[None, :]):
        keys = ", ".join(str(j) for j in np.flatnonzero(columns))
        return MaskShape("causal+padding", title="Causal and padding mask",
                         explanation=(f"A token may attend to itself and earlier tokens, and never "
                                      f"to the padded keys {keys}."),
                         what=f"keys after the query, and keys {keys} (padding)")
    return MaskShape("other", title="Mask: neither causal nor a window",
                     explanation=("The mask blocks a pattern that is neither causal nor a sliding "
                                  "window nor padding; the blocked entries are shown as -inf."),
                     what=f"{int(pattern.sum())} entries per head in another pattern")
