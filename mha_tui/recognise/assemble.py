"""The units built into stages, in the module's own order, by the registry's builders; then
what concerns the whole forward: the mask that did not run (--no-causal), the parameter
count, the error stage, the comparison with the module's own output, NumPy's dims.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..kinds import embed, mask, project
from ..kinds import error as error_kind
from ..kinds import op as op_kind
from ..kinds._parts.builder import Builder
from ..kinds._parts.maker import StageMaker, api_name
from ..kinds._parts.unit import Unit
from ..kinds.registry import builder
from ..ops.graph import reaching_output
from ..records import Check, Embedded, Recording, Stage
from ..stages import stage_info


def build_stages(b: Builder, units: list[Unit], rec: Recording, *, embedded: Embedded | None,
                 forward_equal: bool | None, n_params: int | None) -> tuple[Stage, ...]:
    maker = StageMaker(b, rec)
    stages: list[Stage] = []
    if embedded is not None:
        stages.append(embed.build(maker, embedded))
    counts: dict[str, int] = {}
    reaches = reaching_output(rec) if rec.error is None else None
    unused: list[str] = []
    for unit in units:
        kind = unit.kind
        if kind == "op" and reaches is not None and not any(reaches[i] for i in unit.ops):
            # not part of what the module computes (ESM's head-averaged weights returned
            # beside the output, an unused torch.arange): listed, not a stage
            op = rec.ops[unit.ops[-1]]
            unused.append(f"{api_name(op)} (line {op.source.line})" if op.source else api_name(op))
            continue
        counts[kind] = counts.get(kind, 0) + 1
        stage_id = kind if counts[kind] == 1 else f"{kind}-{counts[kind]}"
        try:
            made = builder(kind).build(maker, unit, stage_id)
            stages.extend(made if isinstance(made, list) else [made])
        except Exception as error:  # a rule that misread: show the ops plainly, never crash
            fallback = op_kind.build(maker, unit, stage_id if kind == "op" else f"op-{kind}")
            stages.append(replace(fallback, note=f"mha-tui could not lay this out as {kind} "
                                                 f"({type(error).__name__}: {error}); shown as it ran."))
    if unused and stages:
        stages[-1] = replace(stages[-1], checks=(*stages[-1].checks, Check(
            f"not shown as stages: {', '.join(unused)}: their results never reach the output",
            None)))
    # --no-causal's "no mask ran" is about one sequence attending to itself: across two
    # sequences (cross-attention) no causal mask is expected.
    if not b.config.causal and not b.sizes.cross and not any(st.kind == "mask" for st in stages):
        mask.add_skipped_mask(stages, b)
    if n_params is not None:
        project.add_param_check(stages, n_params, b)
    if rec.error is not None:
        stages.append(error_kind.build(maker))
    elif forward_equal is not None and stages:
        last = stages[-1]
        if rec.output is not None and rec.output.kind == "op":
            last = next((st for st in stages if any(o.index == rec.output.op for o in st.ops)), last)
        name = last.tensors[-1].name if last.tensors else "the output"
        stages[stages.index(last)] = replace(last, checks=(*last.checks, Check(
            f"{name} equals the module's own forward, {_own_forward(rec)} = {forward_equal}",
            forward_equal)))
    if not b.sizes.batched:
        stages = [_unbatched(stage, b) for stage in stages]
    return tuple(stages)


def _own_forward(rec: Recording) -> str:
    out = rec.snapshot(rec.output) if rec.output is not None else None
    if out is not None and out.dtype.startswith(("float", "bfloat")) and np.isnan(out.values).any():
        equal = "np.array_equal" if rec.library == "numpy" else "torch.equal"
        return f"module(x): {equal}, NaN in the same places counted equal"
    if rec.library == "numpy":
        return f"module.forward({', '.join(name for name, _ in rec.inputs)}): np.array_equal"
    return "module(x): torch.equal"


def _unbatched(stage: Stage, b: Builder) -> Stage:
    """No batch axis (NumPy's (T, C)): a stage's dims say (T, C), never (B, T, C), and its
    words say what NumPy does (x @ W, reshape, no batch)."""
    changes: dict[str, object] = {}
    for field_name, shape in (("dims_in", stage.shape_in), ("dims_out", stage.shape_out)):
        dims = getattr(stage, field_name)
        if len(dims) == len(shape) + 1:
            changes[field_name] = b.unbatched(dims, dims)
    try:
        info = stage_info(stage.kind)
    except KeyError:
        return replace(stage, **changes)  # type: ignore[arg-type]
    changes["explanation"] = info.reword(stage.explanation)
    if stage.kind == "transpose":  # there is no batch axis to move the heads next to
        changes["title"] = "Move the head axis in front"
    return replace(stage, **changes)  # type: ignore[arg-type]

