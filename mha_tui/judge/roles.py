"""Weights by role: find a module's Q, K, V and O projections, and copy another module's
into them.

`mha-tui check` finds the learner's weights by role (`verdict.role_weights`: the tensors
the scores and attend products used, followed back to their projection) and hands them to
its reference. `explain --against` needs the same in the other direction too: the
reference is any module (a tutorial's, another `--module`), so its own parameters are
matched to roles the same way, from its own trace, and then given the learner's numbers
row by row: a parameter is a block of a role's rows (W_Q, one head's `query`, a fused
`in_proj_weight` holding Q, K and V), or the same transposed (x @ W); a bias follows the
weight it was added with.

Plain NumPy over records; the torch side (`tracing/rerun.py`) reads and writes the
parameters. Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..kinds._parts.judging import Judge
from ..ops.numeric import f64
from ..records import Recording, Trace
from ..records.verdict import Facts, RoleWeights
from .verdict import role_weights

ROLES = ("Q", "K", "V", "O")


class RoleCopyError(Exception):
    """The weights cannot be copied by role; one line, naming what does not fit."""


def roles_of(trace: Trace, heads: int) -> RoleWeights | None:
    """A traced module's projections by role (as `check` finds them), or None."""
    if trace.recording is None or trace.failed:
        return None
    try:
        return role_weights(Judge(trace, Facts(heads=heads), ""))
    except (ValueError, IndexError, TypeError, KeyError):  # a layout no walk foresaw
        return None


def _by_role(roles: RoleWeights) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    found = {"Q": roles.q, "K": roles.k, "V": roles.v}
    if roles.o is not None:
        found["O"] = roles.o
    return {role: (f64(w), None if b is None else f64(b)) for role, (w, b) in found.items()}


@dataclass(frozen=True)
class Placement:
    """Where a parameter's rows sit among the roles: row k of the parameter, laid out as
    (out, in), is row rows[k][1] of role rows[k][0]. The layout: the parameter's axes in
    `order`, the first `split` of them making the rows and the rest the columns. A 2-D
    weight is (out, in) as stored ((0, 1), 1) or transposed, stored as (in, out) ((1, 0),
    1); a head-axis one (TransformerLens, ARENA) is W_Q (h, C, d_h) as ((0, 2, 1), 2): rows
    h*d_h, columns C; W_O (h, d_h, C) as ((2, 0, 1), 1): rows C, columns h*d_h."""

    name: str
    rows: tuple[tuple[str, int], ...]
    order: tuple[int, ...] = (0, 1)
    split: int = 1
    shape: tuple[int, ...] = ()

    @property
    def transposed(self) -> bool:
        return self.order == (1, 0)

    def layout(self, values: np.ndarray) -> np.ndarray:
        """The parameter as (out, in) rows."""
        moved = np.transpose(values, self.order)
        return moved.reshape(int(np.prod(moved.shape[:self.split])), -1)

    def stored(self, rows: np.ndarray) -> np.ndarray:
        """(out, in) rows back in the parameter's own shape."""
        moved_shape = tuple(self.shape[i] for i in self.order)
        return np.transpose(rows.reshape(moved_shape), np.argsort(self.order))

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of the axes the rows come from: a bias of the same rows has it
        ((h, d_h) for TransformerLens' b_Q), or is flat."""
        return tuple(self.shape[i] for i in self.order[:self.split])


def _row_keys(roles: RoleWeights) -> dict[bytes, tuple[str, int] | None]:
    """Each row of each role's weight, by its exact bytes (None: two rows alike)."""
    keys: dict[bytes, tuple[str, int] | None] = {}
    for role, (weight, _) in _by_role(roles).items():
        for i, row in enumerate(weight):
            key = np.ascontiguousarray(row).tobytes()
            keys[key] = None if key in keys else (role, i)
    return keys


def _layouts(ndim: int) -> list[tuple[tuple[int, ...], int]]:
    """Every way to read an array as (out, in) rows: its axes in some order, the first
    `split` of them the rows (stored as is first, then transposed, then the rest)."""
    if ndim == 2:
        return [((0, 1), 1), ((1, 0), 1)]
    if ndim != 3:
        return []
    return [(order, split) for order in itertools.permutations(range(3)) for split in (1, 2)]


def _place(name: str, values: np.ndarray, keys: dict[bytes, tuple[str, int] | None]
           ) -> Placement | None:
    for order, split in _layouts(values.ndim):
        where = Placement(name, (), order, split, tuple(values.shape))
        rows = [keys.get(np.ascontiguousarray(row).tobytes()) for row in f64(where.layout(values))]
        if rows and all(r is not None for r in rows):
            return Placement(name, tuple(rows), order, split,  # type: ignore[arg-type]
                             tuple(values.shape))
    return None


def _biases(recording: Recording) -> dict[str, str]:
    """bias parameter -> the weight parameter it was added with, from the recorded ops:
    both given to one op (`F.linear(x, W, b)`), or the bias added to what an op made from
    the weight (`einsum(x, W_Q) + b_Q`, TransformerLens' head-axis biases)."""
    paired: dict[str, str] = {}
    for op in recording.ops:
        params = [r for r in op.inputs if r.kind == "param" and r.snapshot is not None]
        mats = [r.name for r in params if r.snapshot.ndim >= 2]  # type: ignore[union-attr]
        vecs = [r.name for r in params if r.snapshot.ndim == 1]  # type: ignore[union-attr]
        if len(mats) == 1 and len(vecs) == 1:
            paired[vecs[0]] = mats[0]
        elif len(params) == 1 and op.name in ("add", "add_") and len(op.inputs) == 2:
            made = next((recording.ops[r.op] for r in op.inputs
                         if r.kind == "op" and r.op is not None), None)
            weights = [] if made is None else [
                r.name for r in made.inputs if r.kind == "param" and r.snapshot is not None
                and r.snapshot.ndim >= 2]
            if len(weights) == 1 and params[0].name not in paired:
                paired[params[0].name] = weights[0]
    return paired


def copy_by_role(params: Mapping[str, np.ndarray], theirs: Trace, their_roles: RoleWeights,
                 mine: RoleWeights, *, shown: str = "the reference"
                 ) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """New values for the reference's parameters: each row of a Q, K, V or O projection
    replaced by the same row of the learner's (mine); a bias by the learner's bias, or zero
    when the learner's projection has none; a W_O with no learner W_O becomes the identity
    (as `check`'s reference does). Returns (values by name, how it was done, in words).

    Raises RoleCopyError when a parameter is no projection that can be placed by role, when
    the roles' sizes differ, or when the learner has a bias or a W_O the reference lacks.
    """
    assert theirs.recording is not None
    ours, ref = _by_role(mine), _by_role(their_roles)
    for role in ("Q", "K", "V", "O"):
        if role in ours and role in ref and ours[role][0].shape != ref[role][0].shape:
            raise RoleCopyError(f"your W_{role} is {_shape(ours[role][0].shape)}, {shown}'s "
                                f"{_shape(ref[role][0].shape)}: the weights cannot be copied "
                                "by role")
    if "O" in ours and "O" not in ref:
        raise RoleCopyError(f"{shown} has no output projection W_O and your module has one: "
                            "the weights cannot be copied by role")
    keys = _row_keys(their_roles)
    biases = _biases(theirs.recording)
    placed: dict[str, Placement] = {}
    for name, values in params.items():
        if values.ndim >= 2 and name not in biases:
            where = _place(name, values, keys)
            if where is None:
                raise RoleCopyError(f"{shown}'s parameter {name} {_shape(values.shape)} is not "
                                    "a Q, K, V or O projection mha-tui can place: the weights "
                                    "cannot be copied by role")
            placed[name] = where
    new: dict[str, np.ndarray] = {}
    biased: set[str] = set()
    how: list[str] = []
    for name, where in placed.items():
        rows = np.stack([_row(ours, role, i) for role, i in where.rows])
        new[name] = where.stored(rows)
        identity = any(role not in ours for role, _ in where.rows)
        how.append(f"{name} <- " + ("the identity (your module has no W_O)" if identity
                                    else _roles_words(where)))
    for name, values in params.items():
        if name in placed:
            continue
        weight = biases.get(name)
        where = placed.get(weight) if weight is not None else None
        if where is None or values.size != len(where.rows) or (
                values.ndim != 1 and tuple(values.shape) != where.row_shape):
            raise RoleCopyError(f"{shown}'s parameter {name} {_shape(values.shape)} is no "
                                "projection's bias: the weights cannot be copied by role")
        entries = []
        for role, i in where.rows:
            bias = ours[role][1] if role in ours else None
            entries.append(0.0 if bias is None else bias[i])
            if bias is not None:
                biased.add(role)
        new[name] = np.asarray(entries, dtype=np.float64).reshape(values.shape)
        has = any(role in ours and ours[role][1] is not None for role, _ in where.rows)
        how.append(f"{name} <- " + ("your biases" if any(e != 0.0 for e in entries) else
                                     "your biases (all zero)" if has else
                                     "zero (your projection has no bias)"))
    for role, (_, bias) in ours.items():
        if bias is not None and role not in biased:
            raise RoleCopyError(f"your {role} projection has a bias and {shown}'s has none: "
                                "the weights cannot be copied by role (compare with a "
                                "reference whose projections have biases: --against course)")
    return new, tuple(how)


def _row(ours: dict[str, tuple[np.ndarray, np.ndarray | None]], role: str, i: int) -> np.ndarray:
    if role in ours:
        return ours[role][0][i]
    width = next(iter(ours.values()))[0].shape[1]
    return np.eye(width)[i]  # no W_O of the learner's: the identity, as check's reference


def _roles_words(where: Placement) -> str:
    """`your Q rows 0-3`, `your Q, K and V rows`, `your Q rows 2-3 (transposed)`."""
    spans: list[str] = []
    start = 0
    rows = where.rows
    for k in range(1, len(rows) + 1):
        if k == len(rows) or rows[k][0] != rows[start][0] or rows[k][1] != rows[k - 1][1] + 1:
            role, first = rows[start]
            last = rows[k - 1][1]
            spans.append(f"{role} rows {first}-{last}" if last > first else f"{role} row {first}")
            start = k
    words = "your " + ", ".join(spans)
    if where.transposed:
        return words + " (transposed: stored as (in, out))"
    if len(where.order) == 3:
        return words + f" (stored with a head axis as {_shape(where.shape)})"
    return words


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
