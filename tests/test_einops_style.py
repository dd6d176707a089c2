"""Modules written with einops (issue 27), as lucidrains' projects and vit-pytorch write
them: `rearrange(t, 'b n (h d) -> b h n d', h=h)` is the head split (a view, then a
transpose) and `rearrange(out, 'b h n d -> b n (h d)')` the merge; the stages show the
module's own rearrange line, never einops' internals, and say which torch ops it ran as."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("einops")

from mha_tui.cli import app
from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace

FIXTURE = Path(__file__).parent / "fixtures" / "einops_attn.py"
INIT = (("heads", 2), ("dim_head", 4))


def _line(text: str, name: str) -> int:
    """The line holding text in class `name` (the first after its `class` line)."""
    lines = FIXTURE.read_text().splitlines()
    start = lines.index(f"class {name}(nn.Module):")
    return next(i + 1 for i, line in enumerate(lines) if i > start and text in line)


@pytest.mark.parametrize("name,causal", [("Attention", False), ("CausalAttention", True)])
def test_rearrange_is_the_head_split_and_merge_at_the_modules_line(name: str, causal: bool) -> None:
    trace = run_trace(Config("the cat sat on the mat", embed_dim=8, num_heads=2, causal=causal),
                      Source(module=f"{FIXTURE}:{name}", init=INIT))
    split = _line("rearrange(t, 'b n (h d) -> b h n d'", name)
    merge = _line("rearrange(out, 'b h n d -> b n (h d)')", name)
    kinds = [stage.kind for stage in trace.stages]
    assert "op" not in kinds, kinds
    for stage in trace.stages:  # every op placed at a line of the module's file
        assert all(op.source.file == str(FIXTURE) for op in stage.ops), (stage.id, [
            op.source.file for op in stage.ops])
    for kind, line, pattern in (("view", split, "b n (h d) -> b h n d"),
                                ("transpose", split, "b n (h d) -> b h n d"),
                                ("concat", merge, "b h n d -> b n (h d)")):
        stage = trace.stage(kind)
        assert stage.source is not None and stage.source.line == line, (kind, stage.source)
        assert f"einops.rearrange('{pattern}')" in stage.note, stage.note
    assert "the view a module without einops would write" in trace.stage("view").note
    assert "the transpose a module without einops would write" in trace.stage("transpose").note


def test_a_causal_einops_module_is_equivalent() -> None:
    result = CliRunner().invoke(app, ["check", f"{FIXTURE}:CausalAttention", "--format", "json",
                                      "-H", "2", "-C", "8", "--init", "heads=2",
                                      "--init", "dim_head=4"])
    verdict = json.loads(result.stdout)
    assert result.exit_code == 0 and verdict["equivalent"] is True, verdict["diagnosis"]
