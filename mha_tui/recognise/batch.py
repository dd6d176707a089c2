"""A padded batch's words (`--batch`): which keys the mask blocked in each row, read from the
numbers the module's mask op wrote, said beside the padding the rows were given.

The stages are recognised as for one sentence; here the mask stage says, row by row, which
padded keys are blocked for every query (or that they are not), and softmax names the
padded queries, whose rows are computed like the others and mean nothing. Never import
torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..config import Config
from ..ops.vocab import LARGE_NEGATIVE
from ..records import Check, Stage


def _positions(columns: list[int]) -> str:
    return ", ".join(map(str, columns))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def padding_words(stages: tuple[Stage, ...], config: Config) -> tuple[Stage, ...]:
    """The stages with the padding said where it changes their meaning."""
    padding = np.array(config.padding, dtype=bool)  # (B, T), True = padding
    if padding.shape[0] < 2:
        return stages
    out = []
    for stage in stages:
        if stage.kind == "mask" and stage.ops and stage.tensors:
            stage = _mask_words(stage, padding)
        elif stage.kind == "softmax":
            padded = [(b, np.nonzero(row)[0].tolist()) for b, row in enumerate(padding) if row.any()]
            said = "; ".join(f"row {b}'s queries {_positions(cols)}" for b, cols in padded)
            if said:
                stage = replace(stage, explanation=(
                    f"{stage.explanation} Padded queries ({said}) are computed like the others "
                    "and mean nothing: what they produce is never read."))
        out.append(stage)
    return tuple(out)


def _mask_words(stage: Stage, padding: np.ndarray) -> Stage:
    after = stage.tensors[-1].values
    if after.ndim != 4 or after.shape[0] != padding.shape[0] or after.shape[-1] != padding.shape[1]:
        return stage
    blocked = np.isneginf(after) | (after <= LARGE_NEGATIVE)  # (B, h, T_q, T_k)
    every_query = blocked.all(axis=(1, 2))  # (B, T_k): a key no query of the row may see
    whole_row = blocked.all(axis=(1, 3))  # (B, T_q): a query that may see no key
    sentences, checks = [], []
    for b, pads in enumerate(padding):
        cols = np.nonzero(pads)[0].tolist()
        shut = np.nonzero(every_query[b])[0].tolist()
        if not cols:
            if shut:  # a row with no padding has keys no query may see
                sentences.append(f"row {b} has no padding, yet its keys {_positions(shut)} are "
                                 "blocked for every query")
                checks.append(Check(f"row {b}: no key blocked for every query", False))
            continue
        rows = np.nonzero(whole_row[b])[0].tolist()
        if rows and rows == cols and not every_query[b][pads].all():
            sentences.append(f"padding: row {b}'s padded positions ({_positions(cols)}) are "
                             "blocked as queries (whole rows), not as keys: the padding mask "
                             "is on the query axis")
            checks.append(Check(f"row {b}: padded keys {_positions(cols)} blocked for every "
                                "query", False))
            continue
        blocked_for_all = bool(every_query[b][pads].all())
        if blocked_for_all:
            sentences.append(f"padding: the {_plural(len(cols), 'padded key')} of row {b} "
                             f"({_positions(cols)}) {'is' if len(cols) == 1 else 'are'} blocked "
                             "for every query")
        else:
            open_cols = [c for c in cols if not every_query[b][c]]
            sentences.append(f"padding: row {b}'s padded keys {_positions(open_cols)} are NOT "
                             "blocked for every query"
                             + (f" (the keys blocked for every query: {_positions(shut)})"
                                if shut else ""))
        checks.append(Check(f"row {b}: padded keys {_positions(cols)} blocked for every query",
                            blocked_for_all))
    if not sentences:
        return stage
    written = int(blocked.sum())
    checks.append(Check(f"{written} entries blocked in all (every batch row and head)", None))
    text = "; ".join(sentences) + "."
    return replace(stage, explanation=f"{stage.explanation} {text[0].upper()}{text[1:]}".strip(),
                   checks=(*stage.checks, *checks))
