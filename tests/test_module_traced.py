"""`--model` and `--module` traced end to end: the command line's transcripts, a learner's
file with --init and --weights, --no-causal, an in-place mask, and a learner's prints.

(Each model's kinds, per-head numbers and final tensor: tests/test_models_traced.py.)
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_tui.config import Config, Source
from mha_tui.load.modules import load
from mha_tui.pipeline import run_trace

from .conftest import run_cli
from .test_models_traced import KINDS


def _traced(name: str, C: int, h: int, T: int, seed: int, causal: bool = True):
    config = Config(" ".join(f"w{i % 4}" for i in range(T)), embed_dim=C, num_heads=h, seed=seed,
                    causal=causal, max_seq_len=16)
    source = Source(model=name)
    return load(config, source), run_trace(config, source)


def _tensor(stage, dims: tuple[str, ...]) -> np.ndarray:
    (found,) = [r for r in stage.tensors if r.dims == dims][-1:]
    return found.values


@pytest.mark.parametrize("name", ["mygpt", "course"])
def test_no_causal_masks_nothing(name: str) -> None:
    loaded, trace = _traced(name, 4, 2, 4, 0, causal=False)
    weights = _tensor(trace.stage("softmax"), ("B", "h", "T", "T"))
    assert (weights > 0).all()  # every token sees every token
    assert torch.equal(torch.from_numpy(trace.stages[-1].tensors[-1].values), loaded.forward())


def test_the_raschka_in_place_mask_leaves_the_raw_scores_alone() -> None:
    """masked_fill_ rewrites attn_scores in place; the scores stage still shows them raw."""
    loaded, trace = _traced("raschka", 4, 2, 4, 0)
    raw = _tensor(trace.stage("scores"), ("B", "h", "T", "T"))
    m = loaded.module
    with torch.no_grad():
        q = (loaded.x @ m.W_query.weight.T).view(1, 4, 2, 2).transpose(1, 2)  # (B, h, T, d_h)
        k = (loaded.x @ m.W_key.weight.T).view(1, 4, 2, 2).transpose(1, 2)  # (B, h, T, d_h)
        unmasked = (q @ k.transpose(2, 3)).numpy()  # (B, h, T, T), raw, unscaled
    assert np.isfinite(raw).all()
    np.testing.assert_allclose(raw, unmasked, atol=1e-6, rtol=1e-5)
    masked = [r.values for r in trace.stage("mask").tensors if r.dims == ("B", "h", "T", "T")][-1]
    assert np.isneginf(masked[0, :, 0, 1:]).all()


def _headings(transcript: bytes) -> list[str]:
    """The stage kinds of a text transcript, from its "3/9 scores  ·  ..." headings."""
    return re.findall(r"^\d+/\d+ ([a-z_]+)  ", transcript.decode(), flags=re.M)


def test_model_dump_from_the_command_line() -> None:
    result = run_cli("explain", "I love AI !", "--model", "many-eyes", "--dump", "-")
    assert result.returncode == 0, result.stderr.decode()
    assert _headings(result.stdout) == KINDS["many-eyes"]
    assert "many_eyes.py" in result.stdout.decode().split("\n1/9 ")[0]  # the header names the file


LEARNER = """
    import math
    import torch
    from torch import nn

    class MyAttention(nn.Module):
        def __init__(self, d_model, n_heads, context_length, scale_by=None):
            super().__init__()
            self.h = n_heads
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.out = nn.Linear(d_model, d_model)

        def forward(self, x, mask=None):
            B, T, C = x.shape
            q, k, v = self.qkv(x).chunk(3, dim=-1)  # each (B, T, C)
            q = q.view(B, T, self.h, C // self.h).transpose(1, 2)  # (B, h, T, d_h)
            k = k.view(B, T, self.h, C // self.h).transpose(1, 2)  # (B, h, T, d_h)
            v = v.view(B, T, self.h, C // self.h).transpose(1, 2)  # (B, h, T, d_h)
            scores = q @ k.transpose(-2, -1) / math.sqrt(C // self.h)  # (B, h, T, T)
            if mask is not None:
                scores = scores.masked_fill(mask, float("-inf"))  # (B, h, T, T)
            weights = torch.softmax(scores, dim=-1)  # (B, h, T, T)
            context = (weights @ v).transpose(1, 2).reshape(B, T, C)  # (B, T, C)
            return self.out(context), weights
"""


def test_a_learners_module_with_a_mask_parameter_and_a_tuple_result(tmp_path: Path) -> None:
    path = tmp_path / "my_attn.py"
    path.write_text(textwrap.dedent(LEARNER))
    config = Config("I love AI !", embed_dim=8, num_heads=2)
    source = Source(module=f"{path}:MyAttention")
    loaded = load(config, source)
    assert list(loaded.kwargs) == ["mask"]
    trace = run_trace(config, loaded=loaded)
    kinds = [stage.kind for stage in trace.stages]
    assert kinds[:4] == ["embed", "project", "view", "transpose"] and kinds[-1] == "w_o"
    assert kinds.index("scale") < kinds.index("mask") < kinds.index("softmax")
    with torch.no_grad():
        expected = loaded.forward()
    assert torch.equal(torch.from_numpy(trace.stages[-1].tensors[-1].values), expected)


def test_a_learners_file_with_init_and_weights_end_to_end(tmp_path: Path) -> None:
    """--module, --init, --weights from safetensors, as a user runs it: the transcript's final
    tensor is the module's output with the file's weights, exactly."""
    from safetensors.torch import save_file

    path = tmp_path / "my_attn.py"
    path.write_text(textwrap.dedent(LEARNER))
    config = Config("I love AI !", embed_dim=8, num_heads=2, causal=False)
    source = Source(module=f"{path}:MyAttention", init=(("scale_by", 2.0),))
    trained = {k: v + 0.5 for k, v in load(config, source).module.state_dict().items()}
    save_file(trained, str(tmp_path / "trained.safetensors"))
    result = run_cli("explain", "I love AI !", "-C", "8", "-H", "2", "--no-causal",
                     "--module", f"{path}:MyAttention", "--init", "scale_by=2.0",
                     "--weights", str(tmp_path / "trained.safetensors"), "--dump", "-", "--format", "json")
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads(result.stdout)
    kinds = [stage["kind"] for stage in data["stages"]]
    assert kinds[:3] == ["embed", "project", "view"] and kinds[-1] == "w_o"
    softmax = data["stages"][kinds.index("softmax")]
    weights = np.array(list(softmax["tensors"].values())[-1]["values"])
    assert (weights > 0).all()  # --no-causal: no mask passed, every token sees every token
    loaded = load(config, Source(module=source.module, init=source.init,
                                 weights=str(tmp_path / "trained.safetensors")))
    with torch.no_grad():
        expected = loaded.forward()
    final = list(data["stages"][-1]["tensors"].values())[-1]  # tensors by name, in order
    assert final["dims"] == ["B", "T", "C"]
    assert torch.equal(torch.tensor(final["values"], dtype=torch.float32), expected)
    plain = load(config, Source(module=source.module, init=source.init))
    with torch.no_grad():
        assert not torch.equal(plain.forward(), expected)  # the weights file did change things


def test_a_learners_prints_do_not_spoil_the_transcript(tmp_path: Path) -> None:
    path = tmp_path / "chatty.py"
    path.write_text(textwrap.dedent(LEARNER).replace(
        "B, T, C = x.shape", 'B, T, C = x.shape\n        print("shapes:", x.shape)')
        .replace("super().__init__()", 'super().__init__()\n        print("building")'))
    result = run_cli("explain", "I love AI !", "--module", f"{path}:MyAttention", "--dump", "-")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.startswith(b"sentence ") and b"building" not in result.stdout
    assert b"shapes:" not in result.stdout
    assert b"building" in result.stderr and b"shapes: torch.Size([1, 4, 4])" in result.stderr
