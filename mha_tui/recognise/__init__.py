"""Turn a recorded forward (ops) into the stages a learner reads.

The one place that knows what "scores" or "mask" look like: one module per stage kind in
`mha_tui/kinds/`, asked in the order `kinds/registry.py` gives and says why. Each rule is a small function
named after what it recognises, and its evidence is the op, the shapes, the values and
where each tensor came from -- never a variable name. The rules label every op that
depends on the forward's input x with a kind; ops that do not depend on x (a mask buffer
sliced, `torch.ones(T, T).triu()`) join the stage of the op that consumes them; an op no
rule claims becomes an `op` stage with its line and tensors: nothing is dropped.

Stages keep the module's own order (the order of each kind's first op). Ops of one kind
(the three projections; the per-head modules' scores) make one stage, their tensors side by
side; a per-head module's results are stacked along a head axis exactly as a fused module
holds them. `F.scaled_dot_product_attention` is expanded into scores, scale, mask, softmax
and attend, computed here from its recorded inputs as PyTorch documents its reference, and
labelled as mha-tui's own computation with an allclose check against the fused output.

Reads only records (NumPy arrays and plain values): never import torch, rich, textual or
typer here (an import-linter contract checks it).
"""

from __future__ import annotations

from .run import recognise

__all__ = ["recognise"]
