"""What the check takes in (Facts, RoleWeights: found by the torch-knowing side) and what it
gives back (a Verdict of StageVerdict rows and a Diagnosis). Plain frozen data.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import Recording


@dataclass(frozen=True)
class StageVerdict:
    """One row of the verdict: a stage, whether it computed what it should, and how far off.

    ok None: not judged (an op no rule recognises). max_diff: the largest absolute
    difference between what the stage made and what it should have made from its input.
    stage_id "" marks a row for a step the module never performed (a missing scale).
    """

    stage_id: str
    kind: str
    ok: bool | None
    max_diff: float | None
    file: str
    line: int
    checked: str
    note: str = ""


@dataclass(frozen=True)
class Diagnosis:
    """The first wrong stage: where, and the likely mistake, said from the numbers."""

    kind: str
    file: str
    line: int
    message: str
    stage: str = ""


@dataclass(frozen=True)
class Mechanism:
    """One mechanism the reference was grown by, for a grader's script: its name (`rotary`,
    `alibi`, `window`, `shared_kv`, or an `--expect` name: `softcap`, `sinks`, `cosine`,
    `qk_norm`, `pos_bias`, `differential`), the words the verdict says it in, and its
    parameters as JSON values (numbers, strings, booleans, lists of numbers)."""

    name: str
    words: str
    parameters: tuple[tuple[str, object], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"mechanism": self.name, "words": self.words, **dict(self.parameters)}


@dataclass(frozen=True)
class Reference:
    """What the module's output was compared with: multi-head attention (`causal` or not),
    grown by `mechanisms` (none: plain multi-head attention), said as `words`."""

    words: str
    causal: bool
    mechanisms: tuple[Mechanism, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"words": self.words, "causal": self.causal, "plain": not self.mechanisms,
                "mechanisms": [m.as_dict() for m in self.mechanisms]}


@dataclass(frozen=True)
class Verdict:
    """A module judged: equivalent to multi-head attention, or not, and where and why."""

    module: str
    equivalent: bool
    stages: tuple[StageVerdict, ...]
    diagnosis: Diagnosis | None
    differences: tuple[str, ...] = ()
    end_to_end: StageVerdict | None = None
    # What the reference was, when more than plain multi-head attention ("causal multi-head
    # attention with rotary positions (...) and shared K/V heads (h_kv 2)"); "" for plain.
    reference: str = ""
    # The half-precision dtype the module was judged in (`check --dtype bfloat16`: every
    # check allowed its rounding); "" for float32 and wider.
    dtype: str = ""
    # The same, for a script: what the output was compared with, the mechanisms and their
    # parameters; None where no reference was computed (could not judge, not attention).
    compared_with: Reference | None = None

    def as_dict(self) -> dict[str, object]:
        """The grader's JSON object (docs/grading.md): module, equivalent, stages, diagnosis,
        differences, reference (and dtype, judged in a half-precision one)."""
        rows = [*self.stages, *([self.end_to_end] if self.end_to_end else [])]
        return {
            "module": self.module,
            "equivalent": self.equivalent,
            "stages": [{"kind": r.kind, "ok": r.ok,
                        "max_diff": None if r.max_diff is None else _json_float(r.max_diff),
                        "file": r.file, "line": r.line, "checked": r.checked} for r in rows],
            "diagnosis": None if self.diagnosis is None else {
                "kind": self.diagnosis.kind, "file": self.diagnosis.file,
                "line": self.diagnosis.line, "message": self.diagnosis.message},
            "differences": list(self.differences),
            "reference": None if self.compared_with is None else self.compared_with.as_dict(),
        } | ({"dtype": self.dtype} if self.dtype else {})


def _json_float(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(f"{value:.3e}")


# ---------------------------------------------------------------------------- facts in


@dataclass(frozen=True)
class RoleWeights:
    """The module's projections by role, in nn.Linear's layout: weight (out, in), bias or None.

    o is None when the module has no output projection. How each was found (fused, per
    head, x @ W) is said in `how`.
    """

    q: tuple[np.ndarray, np.ndarray | None]
    k: tuple[np.ndarray, np.ndarray | None]
    v: tuple[np.ndarray, np.ndarray | None]
    o: tuple[np.ndarray, np.ndarray | None] | None
    how: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class Facts:
    """What the torch-knowing side found by running things (plain values and callables).

    second: records a second call of the same forward on the same input, and returns it
    (None if that call raised); called only when a verdict's words need it (an active
    dropout's "two runs differ"), at most once: a second forward costs as much as the first.
    parameters: every parameter of the module, (name, shape). reference:
    called with (x, role weights, heads, causal), returns the reference module's output
    with those weights copied in.
    """

    causal: bool = True
    heads: int = 1
    parameters: tuple[tuple[str, tuple[int, ...]], ...] = ()
    second: Callable[[], Recording | None] | None = None
    reference: Callable[[np.ndarray, RoleWeights, int, bool], np.ndarray] | None = None
    training: bool = False
    # What the reference is, as the verdict names it.
    reference_name: str = "the mygpt reference"
    # What the learner meant to build (`check --window N`, `--expect rotary`): the
    # reference grows the mechanism, computed in NumPy (numpy_reference.steps).
    window: int | None = None
    rotary: bool = False
    alibi: bool = False  # `--expect alibi`: ALiBi's fixed slopes on the scores
    rotary_base: float = 10000.0  # `--rotary-base`: the base --expect rotary means
    # `--expect softcap`, `--expect sinks`, ... (records.request.MECHANISMS): the reference
    # grows each with the parameters the module's own stage of that kind shows; `--softcap`:
    # the cap --expect softcap means (None: the module's own).
    mechanisms: tuple[str, ...] = ()
    softcap: float | None = None
    # A padded batch (`--batch`): (B, T), True where a row is padding; those keys must be
    # blocked for every query of the row.
    padding: tuple[tuple[bool, ...], ...] | None = None


def failed_to_load(label: str, message: str) -> Verdict:
    """A module that could not be built: not equivalent, with the loader's one line."""
    return Verdict(label, False, (), Diagnosis("load_error", "", 0, message, "load"))
