"""One module per stage kind. Each holds what mha-tui knows about that kind:

- `KIND`: the kind string its stages carry;
- `RULES`: small functions `rule(graph, op, sizes) -> kind | None` that claim an op from its
  name, shapes, values and where its inputs came from (never from a variable name);
- `build(maker, unit, stage_id) -> Stage | list[Stage]`: the stage's tensors, dims and checks;
- its words beyond the catalogue in `mha_tui.stages` (explanations that depend on the case).

The order in which rules are asked is `recognise.registry.KINDS`. Never import torch, rich,
textual or typer here.
"""
