"""`--against` where a matrix does not fit twice in the width (80 columns, 4 columns of
numbers each side): yours above the reference's, each whole, instead of each side showing 2
or 3 of its 4 columns (issue 27, section 6). Where both fit, they stay side by side."""

from __future__ import annotations

import re

import pytest

from mha_tui.render.options import RenderOptions
from mha_tui.write.dump import comparison_text

from .test_compare import against, spec


def _scores_part(text: str) -> str:
    return text[text.index("\n5/11 scores"):text.index("\n6/11 ")]


@pytest.mark.parametrize("width", [60, 80])
def test_narrow_sides_are_stacked_each_whole(width: int) -> None:
    part = _scores_part(comparison_text(against(spec("no_scale")), RenderOptions(), width=width))
    lines = part.splitlines()
    assert not re.search(r"yours +reference", part), part  # not side by side
    yours, reference = lines.index("yours"), lines.index("reference")
    assert yours < reference
    assert "of 4 columns" not in part and "+1" not in part.split("difference")[0], part
    for side in (lines[yours:reference], lines[reference:]):
        header = next(line for line in side if line.split() and line.split()[0] == "I" and
                      "love" in line)
        assert header.split() == ["I", "love", "AI", "!"], header


def test_wide_sides_stay_side_by_side() -> None:
    part = _scores_part(comparison_text(against(spec("no_scale")), RenderOptions(), width=120))
    assert re.search(r"yours +reference", part), part
