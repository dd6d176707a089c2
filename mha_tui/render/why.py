"""How one number was made (`mha_tui.why`), drawn: the formula, each step with the recorded
numbers, and the module's own number beside mha-tui's. Shared by the app's side panel and
`explain --why`. Never import torch, textual or typer here.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from rich.console import Group
from rich.padding import Padding
from rich.text import Text

from .options import RenderOptions
from .text import printable
from .values import format_value

if TYPE_CHECKING:
    from ..why import Why


# ---------------------------------------------------------------- why this number


_MATH_ASCII = str.maketrans({"×": "*", "Σ": "sum ", "√": "sqrt ", "÷": "/", "·": ".",
                             "≤": "<=", "≥": ">="})
"""--ascii: the drill-down's mathematics in ASCII."""


def _why_number(value: float, decimals: int) -> str:
    return format_value(value, "signed", decimals)


def why_view(why: Why, opts: RenderOptions) -> Group:
    """How one cell was made (mha_tui.why): the formula, each step with the recorded numbers,
    and the module's own number beside mha-tui's, ✓ or ✗ with the difference. Shared by the
    app's side panel and `explain --why`. Labels hold tokens: printable() and Text only."""
    from rich.table import Table

    d = max(opts.decimals, 4)

    def say(text: str) -> str:
        return printable(text.translate(_MATH_ASCII) if opts.ascii else text)

    ok, bad = ("[ok]", "[FAIL]") if opts.ascii else ("✓", "✗")
    head = Text.assemble(("why ", "bold"), (say(f"{why.tensor}[{', '.join(map(str, why.index))}]"),
                                            "bold cyan"), ("  " + say(why.where), "dim"))
    steps = Table.grid(padding=(0, 1))
    steps.add_column(no_wrap=False)
    steps.add_column(justify="right", no_wrap=True)
    steps.add_column(no_wrap=True)
    steps.add_column(justify="right", no_wrap=True)
    for term in why.terms:
        parts = " ".join(say(p) if isinstance(p, str) else _why_number(p, d) for p in term.parts)
        parts = re.sub(r"\( | (?=[),])", lambda m: m.group(0).strip(), parts)  # max(+1.0, 0)
        steps.add_row(Text(say(term.label)), Text(parts, style="dim"),
                      "=" if term.value is not None else "",
                      Text(_why_number(term.value, d) if term.value is not None else "",
                           style="bold" if term.label == "sum" else ""))
    def verdict(owner: str, what: str, recorded: float) -> Text:
        line = Text.assemble((owner + " ", "dim"), say(what), ": ",
                             (_why_number(recorded, d), "bold"), "  ")
        difference, agrees = why.compared(recorded)
        if not why.recomputed:
            line.append_text(Text(f"not recomputed: {say(why.reason or 'mha-tui does not know this op')}",
                                  style="yellow"))
        elif agrees:
            rounding = f" (difference {difference:.1e}: {why.rounding})" if difference else ""
            line.append_text(Text.assemble((ok, "green"), " equal" + rounding))
        else:
            by = "" if math.isnan(difference) else f" by {difference:.3g}"
            line.append_text(Text.assemble((bad, "bold red"), f" differs from mha-tui's "
                                           f"{_why_number(why.computed, d)}{by}"))
        return line

    # a half-precision module: say what mha-tui computes in, and from what
    in_float64 = (f" in float64 (the module computed in {why.dtype}; its {why.dtype} numbers "
                  f"are exact in float64)" if why.dtype != "float32" else "")
    checks = [verdict(why.recorded_by or "the module's own",
                      f"{why.tensor}[{', '.join(map(str, why.index))}]", why.recorded)]
    if why.witness is not None:  # the module's own number, when `recorded` is mha-tui's
        checks.append(verdict("the module's own", why.witness.label, why.witness.value))
        if why.witness.caveat:
            checks.append(Text(say(why.witness.caveat), style="dim"))
    return Group(
        head,
        Text(say(why.formula)),
        Text(f"computed by mha-tui{in_float64} from "
             f"{say(why.basis) if why.basis else 'the recorded tensors'}:"
             if why.recomputed else f"{say(why.basis or 'what the op was given')} (recorded):",
             style="italic dim"),
        Padding(steps, (0, 0, 0, 2)),
        *checks,
        *(Text(say(note), style="dim") for note in why.notes),
    )
