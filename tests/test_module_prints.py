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
    """The rule itself: an op whose value only Python read, and what feeds only it, are left
    out of the torch recording (never built: a print loop costs nothing after it ran); an op
    the output needs is kept, even when Python read it too, and every reference to a kept
    op is numbered again."""
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
    x = torch.ones(2, 3)
    rec = record(lambda: module(x), {"": module}).recordings[""]
    assert [op.name for op in rec.ops] == ["sum", "add", "mul"]
    assert [op.index for op in rec.ops] == [0, 1, 2]
    assert rec.read == frozenset({0})  # total, read by float() and kept
    product = rec.ops[2]
    assert [ref.kind for ref in product.inputs] == ["input", "op"]
    assert product.inputs[1].op == 0 and rec.output is not None and rec.output.op == 2
    assert np.array_equal(rec.snapshot(rec.output).values, np.full((2, 3), 6.0, np.float32))


def test_a_write_or_a_raise_keeps_every_op() -> None:
    """An op that writes in place is a change of state, whoever reads it; a forward that
    raised returned nothing to reach: both keep the ops Python read."""
    from mha_tui.tracing import record

    class Writes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            print(self.seen.add_(1).item())  # counts the calls: state
            print((x * 3).sum().item())
            if x.shape[0] > 1:
                raise ValueError("two rows")
            return x + 1

    module = Writes()
    kept = record(lambda: module(torch.ones(1, 3)), {"": module}).recordings[""]
    assert [op.name for op in kept.ops] == ["add_", "add"]
    failed = record(lambda: module(torch.ones(2, 3)), {"": module}).recordings[""]
    assert failed.error is not None
    assert [op.name for op in failed.ops] == ["add_", "mul", "sum"]


def test_python_only_on_hand_built_references() -> None:
    """ops.graph.python_only, the rule both the tracer and the graph ask: op 1 is read, op 2
    reads it and is read, op 3 is the output and reads op 0; op 4 writes (kept)."""
    from mha_tui.ops.graph import python_only
    from mha_tui.records import Ref

    x = Ref("input", name="x")
    inputs = [(x,), (x,), (Ref("op", op=1),), (x, Ref("op", op=0)), (Ref("op", op=1),)]
    names = ["sum", "mul", "mean", "mul", "add_"]
    assert python_only(names, inputs, {1, 2}, Ref("op", op=3)) == frozenset({2})
    assert python_only(names, inputs, {2}, Ref("op", op=3), kept={4}) == frozenset({2})
    assert python_only(names[:4], inputs[:4], {2}, Ref("op", op=3)) == frozenset({1, 2})
    assert python_only(names, inputs, set(), Ref("op", op=3)) == frozenset()
    assert python_only(names[:4], inputs[:4], {0, 2}, Ref("op", op=3)) == frozenset({1, 2})


def test_the_loop_runs_outside_the_recording(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What the printing loop costs beside a plain forward is measured by the benchmark, not
    here; here: its 300 reads leave no op in the recording, so nothing after the forward
    (recognising, judging, drawing) pays for them: the same ops as without the loop."""
    from mha_tui.notebook import trace_of
    from tests.fixtures.noisy_attn import NoisyAttention

    torch.manual_seed(0)
    x = torch.randn(1, 3, 4)
    module = NoisyAttention(4, 2, loops=300)
    traced = trace_of(module, x)
    module.loops = 0
    quiet = trace_of(module, x)
    assert [op.name for op in traced.recording.ops] == [op.name for op in quiet.recording.ops]
    assert len(traced.recording.ops) < 300
    assert np.isfinite(traced.stages[-1].tensors[-1].values).all()

