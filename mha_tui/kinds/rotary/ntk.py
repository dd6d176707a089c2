"""NTK rope scaling, named where a checkpoint's config.json says so (`--hf`): the rotary
stage's base measured from the module's own tables (as the stage shows it), set beside what
the config's `rope_parameters` (or the older `rope_scaling`) make of the base, and the stage
titled with it.

- Static NTK ("NTK-aware"; Hunyuan's `rope_type` "dynamic" with a fixed `alpha`): the base b
  raised once to B = b × α^(d/(d−2)), so that the fastest pair turns as before and the slowest
  α times slower: "rotary, base B (NTK-scaled: base b × factor α^(d/(d−2)))".
- Dynamic NTK (transformers' `rope_type` "dynamic" with a `factor` f): the plain rotary of
  base b up to the model's original length L (`max_position_embeddings`), and beyond it, for
  T tokens, base b × (f·T/L − (f − 1))^(d/(d−2)) (transformers' _compute_dynamic_ntk_parameters).

Llama 3's and YaRN's rope scaling are measured from the tables alone (finding.scaling); an
NTK base is a base like any other, so only the config can say it was scaled. Plain data in
and out; never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from ...records import Check, Stage
from .finding import KIND, frequencies

RTOL = 1e-3  # the base read from ω_1 of a float32 table


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def expected_base(rope: Mapping[str, object], d: int, T: int) -> tuple[float, str, str] | None:
    """The base the config's NTK scaling gives a d-channel rotary over T tokens, what the
    stage says of it (the words after "rotary, "), and which scaling it is ("static",
    "dynamic"); None when the config asks for no NTK scaling (or does not say enough)."""
    kind = rope.get("rope_type", rope.get("type"))
    b = _number(rope.get("rope_theta"))
    if kind not in ("dynamic", "ntk") or b is None or d <= 2:
        return None
    power = d / (d - 2)
    alpha = _number(rope.get("alpha"))
    factor = _number(rope.get("factor"))
    if alpha is not None or kind == "ntk":  # static: one raised base, at every length
        a = alpha if alpha is not None else factor
        if a is None:
            return None
        B = b * a ** power
        return (B, f"base {B:.6g} (NTK-scaled: base {b:g} × factor {a ** power:.6g} = "
                   f"α^(d/(d−2)) with α {a:g} and d {d}, from config.json's rope_parameters)",
                "static")
    L = _number(rope.get("max_position_embeddings"))
    if factor is None or L is None:
        return None
    if T <= L:
        return (b, f"base {b:g} (dynamic NTK scaling, factor {factor:g}, from config.json: plain "
                   f"up to its original length of {L:g} tokens, and these {T} are within it; "
                   f"beyond, the base grows to {b:g} × (f·T/L − (f − 1))^(d/(d−2)))", "dynamic")
    B = b * (factor * T / L - (factor - 1)) ** power
    return (B, f"base {B:.6g} (dynamic NTK scaling, factor {factor:g}, from config.json: these "
               f"{T} tokens are beyond its original length of {L:g}, so the base {b:g} grows to "
               f"{b:g} × (f·T/L − (f − 1))^(d/(d−2)) = {B:.6g})", "dynamic")


def named_ntk(stages: tuple[Stage, ...], rope: Mapping[str, object], T: int
              ) -> tuple[Stage, ...]:
    """The stages, each rotary stage titled with the config's NTK scaling and checked
    against it (the base read from its own angle table); unchanged without one."""
    return tuple(_named(stage, rope, T) if stage.kind == KIND and stage.tensors else stage
                 for stage in stages)


def _named(stage: Stage, rope: Mapping[str, object], T: int) -> Stage:
    angles = np.asarray(stage.tensors[0].values, dtype=np.float64)  # (T, pairs)
    if angles.ndim != 2:
        return stage
    d = 2 * angles.shape[1]
    found = expected_base(rope, d, T)
    _, measured, _ = frequencies(angles)
    if found is None or measured is None:
        return stage
    base, words, which = found
    ok = math.isclose(measured, base, rel_tol=RTOL)
    check = Check(f"rotary, {words}: base {measured:.6g} measured from ω_1 of the module's own "
                  f"tables (computed by mha-tui)" + ("" if ok else f", not {base:.6g}"), ok)
    if which == "static":
        title = f"Rotary positions, NTK-scaled base {base:.6g}: turn Q and K by each token's position"
        said = (f" This checkpoint's config.json asks for NTK scaling: the base is raised once "
                f"to {base:.6g}, so that the fastest pair turns as before and the slowest "
                f"turns more slowly, to reach further than the length it was trained on.")
    else:
        title = (f"Rotary positions (dynamic NTK scaling: base {base:.6g} for {T} tokens): turn "
                 f"Q and K by each token's position")
        said = (" This checkpoint's config.json asks for dynamic NTK scaling: up to the "
                "model's original length the rotary is the plain one; for a longer input the "
                "base grows with the length, so that the slow pairs turn more slowly.")
    return replace(stage, title=title, explanation=stage.explanation + said,
                   checks=(*stage.checks, check))
