"""The judge room: judge a traced forward stage by stage and write the verdict (`mha-tui
check`; `mha_tui.check(module)` in a notebook, which is why this package is not called check).

`judge(trace, facts)` reads only records: it never imports torch, so a NumPy module's
recording can be judged the same way. Each stage kind judges itself (`judge(j)` in its
module under `mha_tui/recognise/kinds/`, in the order `recognise.registry.JUDGES` gives);
`judging.py` is what they share, `numeric.py` the numbers, `verdict.py` the whole verdict and
the end-to-end comparison, `results.py` the data in and out. What needs running again (a
second run, the reference module with the learner's weights) is done by
`mha_tui.tracing.rerun` and handed in as `Facts`. `report.py` draws the verdict (Rich) and
writes it as JSON for graders. Never import textual or typer here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .results import Diagnosis, Facts, RoleWeights, StageVerdict, Verdict, failed_to_load

if TYPE_CHECKING:
    from ..records import Trace


def judge(trace: Trace, facts: Facts, label: str = "") -> Verdict:
    """Judge every stage of a traced forward (see verdict.py)."""
    # Imported here, not above: the kind modules that verdict.py reads import judge.numeric,
    # so importing them while this package initialises would go round in a circle.
    from .verdict import judge as judge_trace

    return judge_trace(trace, facts, label)


__all__ = ["Diagnosis", "Facts", "RoleWeights", "StageVerdict", "Verdict", "failed_to_load",
           "judge"]
