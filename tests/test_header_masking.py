"""The header says what the module did about masking, read from the trace (a mask stage and
what its op wrote: causal, padding, both, a window, none), never from the --causal flag; where
the module did otherwise than the flag asked, it says so (issue 27, section 5)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mha_tui.cli import app

FIXTURES = Path(__file__).parent / "fixtures"


def _sizes_line(*args: str) -> str:
    result = CliRunner().invoke(app, ["explain", "I love AI !", *args, "--dump", "-"])
    assert result.exit_code == 0, result.output
    return next(line for line in result.stdout.splitlines() if "seed=" in line)


@pytest.mark.parametrize(("args", "said"), [
    (("--model", "mygpt"), "seed=0 causal"),
    (("--model", "mygpt", "--no-causal"), "seed=0 no mask"),
    # a module whose mask is its own (an IGNORE buffer), whatever the flag asks
    (("--module", f"{FIXTURES / 'transformerlens_attn.py'}:TLAttention", "-H", "2", "-C", "8",
      "--no-causal"), "causal (the module's own; --no-causal ignored)"),
    # a module that forgets its mask, under the default --causal
    (("--module", f"{FIXTURES / 'unmasked_sdpa.py'}:Unmasked", "-H", "2", "-C", "8"),
     "no mask (the module applies none)"),
    # --batch pads the shorter row: what the mask op wrote holds the padded keys
    (("--model", "course", "--batch", "the cat"), "causal + padding mask"),
    (("--model", "course", "--batch", "the cat", "--no-causal"), "padding mask"),
])
def test_the_header_says_what_the_module_did(args: tuple[str, ...], said: str) -> None:
    line = _sizes_line(*args)
    assert line.endswith(said), line


def test_the_header_before_a_trace_still_says_the_flag() -> None:
    # The app's first frame has no trace yet: the flag is all there is to say.
    from mha_tui.config import Config
    from mha_tui.render.header import header
    from mha_tui.render.options import RenderOptions

    for causal, said in ((True, "causal"), (False, "no mask")):
        text = header(Config(sentence="I love AI", causal=causal), RenderOptions(), 200)
        assert str(text).rstrip().endswith(f"seed=0 {said}"), str(text)
