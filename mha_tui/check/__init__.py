"""The check room: judge a traced forward stage by stage and write the verdict.

`judge(trace, facts)` (judge.py) reads only records: it never imports torch, so a NumPy
module's recording can be judged the same way. What needs running again (a second run, the
reference module with the learner's weights) is done by `mha_tui.tracing.rerun` and handed
in as `Facts`. `report.py` draws the verdict (Rich) and writes it as JSON for graders.
Never import textual or typer here.
"""

from __future__ import annotations

from .judge import Diagnosis, Facts, RoleWeights, StageVerdict, Verdict, failed_to_load, judge

__all__ = ["Diagnosis", "Facts", "RoleWeights", "StageVerdict", "Verdict", "failed_to_load",
           "judge"]
