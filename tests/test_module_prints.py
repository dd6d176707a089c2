"""A module's prints never reach stdout, whatever the command and format (#27): stdout is a
transcript's or a script's JSON. And the ops that only read values for Python (`print(w.sum()
.item())`, `.tolist()`, `if (w < 0).any():`) are no stages; a loop's passes are one stage per
line, not one per pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from .conftest import run_cli

NOISY = "tests/fixtures/noisy_attn.py"
SAID = "noisy:"  # every print of the fixture starts so


def _quiet_stdout(args: list[str]) -> bytes:
    """Run the command; its stdout holds none of the module's prints, its stderr holds them."""
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr.decode()
    assert SAID.encode() not in result.stdout
    assert SAID.encode() in result.stderr
    return result.stdout


@pytest.mark.parametrize("module", ["NoisyAttention", "NoisyNumpy"])
def test_check_json_parses_whatever_the_module_prints(module: str) -> None:
    """`check --format json`: the second recording and the reference run print too."""
    data = json.loads(_quiet_stdout(["check", f"{NOISY}:{module}", "--format", "json"]))
    assert data["equivalent"] is True


def test_check_table_holds_no_print() -> None:
    out = _quiet_stdout(["check", f"{NOISY}:NoisyAttention"]).decode()
    assert "equivalent to multi-head attention" in out


@pytest.mark.parametrize("extra", [
    ["--format", "json"], ["--format", "text"], ["--format", "md"], ["--format", "html"],
    ["--quiz", "--format", "json"], ["--why", "softmax[0, 1, 2, 1]"],
    ["--against", "course", "--format", "json"], ["--against", "course"],
])
def test_explain_writes_only_the_transcript_to_stdout(extra: list[str]) -> None:
    out = _quiet_stdout(["explain", "I love AI !", "--module", f"{NOISY}:NoisyAttention",
                         "--dump", "-", *extra])
    if "json" in extra:
        json.loads(out)


def test_against_a_reference_that_prints(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The reference given as FILE.py:Class prints too: stderr."""
    out = _quiet_stdout(["explain", "I love AI !", "--against", f"{NOISY}:NoisyAttention",
                         "--dump", "-", "--format", "json"])
    json.loads(out)


def test_the_notebook_api_sends_prints_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    """mha_tui.check and mha_tui.trace run the module (and check runs it again): the cell's
    stdout stays the notebook's."""
    import mha_tui
    from tests.fixtures.noisy_attn import NoisyAttention

    torch.manual_seed(0)
    module = NoisyAttention(4, 2, loops=2)
    capfd.readouterr()
    assert mha_tui.check(module).equivalent
    mha_tui.trace(module, torch.randn(1, 3, 4))
    out, err = capfd.readouterr()
    assert SAID not in out and "noisy: step 1" in err


def _stages(args: list[str]) -> list[dict]:
    result = run_cli("explain", "I love AI !", "--dump", "-", "--format", "json", *args)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)["stages"]


def test_values_read_for_python_are_no_stages() -> None:
    """`print(self.W_q.weight.sum().item())` 300 times, `.tolist()`, `if (w < 0).any()`:
    the transcript holds the stages of plain attention and nothing else."""
    plain = _stages(["--module", f"{NOISY}:NoisyAttention"])
    talking = _stages(["--module", f"{NOISY}:NoisyAttention", "--init", "loops=300"])
    assert [s["kind"] for s in talking] == [s["kind"] for s in plain]
    assert "op" not in {s["kind"] for s in plain}


def test_a_loop_of_unrecognised_lines_is_one_stage_per_line() -> None:
    """Two lines run 12 times: two `op` stages that say so, not 24 (nor 48: line two is three
    ops); the check's table has as few rows, and the module is still equivalent."""
    stages = _stages(["--module", f"{NOISY}:LoopAttention", "--init", "loops=12"])
    ops = [s for s in stages if s["kind"] == "op"]
    assert len(ops) == 2
    assert all("ran this line 12 times" in s["explanation"] for s in ops)
    assert "(36 ops in all)" in ops[1]["explanation"]
    result = run_cli("check", f"{NOISY}:LoopAttention", "--init", "loops=12", "--format", "json")
    data = json.loads(result.stdout)
    assert data["equivalent"] is True
    assert len(data["stages"]) < 20


def test_read_only_by_python_on_a_small_recording() -> None:
    """The rule itself: an op whose value only Python read, and what feeds only it, are
    `for_python`; an op the output needs is not, even when Python read it too."""
    from mha_tui.ops.graph import Graph
    from mha_tui.tracing import record

    class Talk(torch.nn.Module):
        def forward(self, x):
            total = x.sum()  # read below, and the output needs it
            print(float(total))
            doubled = (x * 2).mean()  # only read
            print(f"{doubled:.3f}")
            unused = x + 1  # nobody reads it: kept (an unused tensor is the learner's to see)
            del unused
            return x * total

    module = Talk()
    rec = record(lambda: module(torch.ones(2, 3)), {"": module}).recordings[""]
    names = [op.name for op in rec.ops]
    only = Graph(rec).for_python
    assert {names[i] for i in only} == {"mul", "mean"}
    assert names.index("sum") not in only and names.index("add") not in only
    assert len([i for i in only if names[i] == "mul"]) == 1  # x * 2, not x * total


def test_the_loop_runs_outside_the_stages(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the printing loop costs beside a plain forward is measured by the benchmark, not
    here; here: its 300 reads leave no op in the recognised trace's stages."""
    from mha_tui.notebook import trace_of
    from tests.fixtures.noisy_attn import NoisyAttention

    module = NoisyAttention(4, 2, loops=300)
    traced = trace_of(module, torch.randn(1, 3, 4))
    used = {op.index for stage in traced.stages for op in stage.ops}
    assert len(traced.recording.ops) > 300 > len(used)
    assert np.isfinite(traced.stages[-1].tensors[-1].values).all()

