"""The recorded ops as data to reason about: the dataflow graph of one forward (`graph`), the
op vocabulary the rules speak (`vocab`), the numeric comparisons every check uses
(`numeric`: tolerances, allclose, ratios, masks found in values) and the sizes of the
attention (`sizes`: B, T, C, h, d_h, found from the recording).

The layer under the stage kinds: it knows records and NumPy only. Never import torch, rich,
textual or typer here, nor anything of kinds, recognise, judge or above (an import-linter
`layers` contract checks it).
"""
