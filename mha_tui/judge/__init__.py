"""The judge room: judge a traced forward stage by stage and write the verdict (`mha-tui
check`; `mha_tui.check(module)` in a notebook, which is why this package is not called check).

`judge(trace, facts)` reads only records: it never imports torch, so a NumPy module's
recording can be judged the same way. Each stage kind judges itself (`judge(j)` in its
module under `mha_tui/kinds/`, in the order `kinds.registry` gives); `kinds/_parts/judging.py`
is what they share, `ops/numeric.py` the numbers, `verdict.py` the whole verdict and the
end-to-end comparison, `records/verdict.py` the data in and out. What needs running again (a
second run, the reference module with the learner's weights) is done by
`mha_tui.tracing.rerun` and handed in as `Facts`. `report.py` draws the verdict (Rich) and
writes it as JSON for graders. Never import textual or typer here.
"""

from __future__ import annotations

from ..records.verdict import Diagnosis, Facts, RoleWeights, StageVerdict, Verdict, failed_to_load
from .verdict import judge

__all__ = ["Diagnosis", "Facts", "RoleWeights", "StageVerdict", "Verdict", "failed_to_load",
           "judge"]
