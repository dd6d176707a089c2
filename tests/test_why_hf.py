"""Why this number, for `--hf` layers: GPT-2's Conv1D projections (torch.addmm(bias, x, W),
W stored (in, out)) explained like F.linear, checked against the checkpoint's own weights
in float64; and a refused `--why` is one line on stderr with exit code 2."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.load import hf
from mha_tui.pipeline.hf import Session
from mha_tui.records import Trace
from mha_tui.why import main_tensor, why

from .conftest import run_cli
from .hf_models import tiny_gpt2, tiny_tokenizer
from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)

SENTENCE = "The cat sat on the mat."


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 whose Conv1D biases are not zero (GPT-2 starts them at 0), saved once."""
    import torch

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    directory = tmp_path_factory.mktemp("gpt2-biased")
    tokenizer = tiny_tokenizer()
    model = tiny_gpt2(len(tokenizer), n_layer=2)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("attn.c_attn.bias", "attn.c_proj.bias")):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _weights(directory: Path, layer: int) -> dict[str, np.ndarray]:
    """The layer's Conv1D weights and biases as the checkpoint holds them (safetensors, read
    here, not through mha-tui), in float64."""
    from safetensors.numpy import load_file

    tensors = load_file(str(directory / "model.safetensors"))
    prefix = f"transformer.h.{layer}.attn."
    return {name[len(prefix):]: values.astype(np.float64) for name, values in tensors.items()
            if name.startswith(prefix) and name.endswith((".weight", ".bias"))}


def _trace(directory: Path, layer: int) -> Trace:
    return Session(hf.load(str(directory)), SENTENCE).trace(layer)


@pytest.mark.parametrize("layer", [0, 1])
def test_gpt2_conv1d_cells_are_x_times_a_column_of_w_plus_bias(gpt2_dir: Path, layer: int) -> None:
    """Every cell of V (the last third of c_attn's output) and of W_O's output equals
    x @ W + b with W (in, out) and b from the checkpoint: V's channel c is fused channel
    2C + c; W_O reads the concatenated heads."""
    trace = _trace(gpt2_dir, layer)
    weights = _weights(gpt2_dir, layer)
    x = main_tensor(trace.stage("embed")).values.astype(np.float64)  # the layer's input
    C = x.shape[-1]
    fused = x @ weights["c_attn.weight"] + weights["c_attn.bias"]  # (B, T, 3C)
    concat = main_tensor(trace.stage("concat")).values.astype(np.float64)
    out = concat @ weights["c_proj.weight"] + weights["c_proj.bias"]
    for stage_id, expected in (("project", fused[..., 2 * C:]), ("w_o", out)):
        record = main_tensor(trace.stage(stage_id))
        assert record.values.shape == expected.shape
        for index in itertools.product(*map(range, record.values.shape)):
            cell = why(trace, stage_id, index)
            assert cell.computed == pytest.approx(expected[index], rel=1e-5, abs=1e-6), (
                stage_id, index)
            assert cell.agrees, (stage_id, index, cell.computed, cell.recorded)
    cell = why(trace, "project", (0, 1, 2))
    assert cell.formula.endswith(f"W[:, {2 * C + 2}] + bias"), cell.formula
    bias = weights["c_attn.bias"][2 * C + 2]
    assert cell.terms[-2].label == f"+ bias[{2 * C + 2}]" and cell.terms[-2].value == \
        pytest.approx(bias, rel=1e-6)
    assert any("GPT-2's Conv1D" in note and f"(in, out) = ({C}, {3 * C})" in note
               for note in cell.notes), cell.notes
    cell = why(trace, "w_o", (0, 2, 5))
    assert "c_proj.weight[:, 5]" in cell.formula
    products = [t.label for t in cell.terms if t.parts]
    assert products and all(re.fullmatch(r"in (\d+) \(head \d+, d\d+\): x\[2, \1\] × "
                                         r"c_proj\.weight\[\1, 5\]", label)
                            for label in products), products  # W[k, o]: (in, out)


def test_gpt2_project_why_from_the_command_line(gpt2_dir: Path) -> None:
    """`--hf GPT-2 --why "project[0, 1, 2]"`: was refused ("holds no linear op"); now the
    cell's computation, ✓ against the layer's own number."""
    result = run_cli("explain", SENTENCE, "--hf", str(gpt2_dir), "--dump", "-", "--why",
                     "project[0, 1, 2]")
    assert result.returncode == 0 and result.stderr == b"", result.stderr
    text = result.stdout.decode()
    value = main_tensor(_trace(gpt2_dir, 0).stage("project")).values[0, 1, 2]
    assert text.startswith("why value_states[0, 1, 2]"), text
    assert f"the module's own value_states[0, 1, 2]: {value:.4f}  ✓ equal" in text


@pytest.mark.parametrize("hf_run", [False, True], ids=["module", "hf"])
def test_a_why_refused_by_a_stage_is_one_line_and_exit_2(
        hf_run: bool, gpt2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell the stage's kind cannot explain (here: softmax's why taken out of the table,
    as a kind without one would be) is refused after the trace: one line on stderr, exit 2,
    nothing on stdout."""
    from mha_tui import why as why_module

    monkeypatch.delitem(why_module.KINDS, "softmax")
    source = ["--hf", str(gpt2_dir)] if hf_run else ["--model", "mygpt"]
    result = CliRunner().invoke(app, ["explain", SENTENCE, *source, "--dump", "-", "--why",
                                      "softmax[0, 1, 2, 1]"])
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mha-tui: error: --why: mha-tui does not "
                                                   "explain the cells of a 'softmax' stage"), lines


# ---------------------------------------------------------------- the tiny families


def test_falcon_multi_query_cells_read_the_one_shared_k_v_head() -> None:
    """Falcon's multi-query layer: K and V have one head, broadcast by the matmul to the four
    query heads (each cell was an IndexError). Every attend cell equals Falcon's own attention
    weights (output_attentions) times V taken from the checkpoint's fused weight (channels
    C + d_h to C + 2 d_h of x @ W^T); every scale cell is its scores cell / √d_h, and the
    scores, scaled and causally masked, softmax to Falcon's own weights."""
    from .test_families import hf_trace, own_run

    trace = hf_trace("falcon", 0)
    model, _, result, _ = own_run("falcon")
    weights = result.attentions[0][0].double().numpy()  # (h, T, T), Falcon's own
    x = main_tensor(trace.stage("embed")).values.astype(np.float64)[0]  # (T, C)
    fused = model.transformer.h[0].self_attention.query_key_value.weight.detach().double().numpy()
    C = x.shape[-1]
    h, T, _ = weights.shape
    d_h = C // h
    v = x @ fused[C + d_h:C + 2 * d_h].T  # (T, d_h): the one value head
    _check_every(trace, "attend", (weights @ v)[None])
    scores = np.zeros((1, h, T, T))
    for index in itertools.product(*map(range, scores.shape)):
        cell = why(trace, "scores", index)
        assert cell.agrees, index
        scores[index] = cell.computed
        if index[1] == 3 and index[2:] == (4, 2):
            assert "K[0, 0, 2, :]" in cell.formula and any(
                "K has one head, shared by every query head" in note for note in cell.notes)
    _check_every(trace, "scale", scores / np.sqrt(d_h))
    masked = np.where(np.tril(np.ones((T, T), dtype=bool)), scores / np.sqrt(d_h), -np.inf)
    softmaxed = np.exp(masked - masked.max(-1, keepdims=True))
    softmaxed /= softmaxed.sum(-1, keepdims=True)
    np.testing.assert_allclose(softmaxed[0], weights, rtol=1e-4, atol=1e-6)


def _check_every(trace: Trace, stage_id: str, expected: np.ndarray) -> None:
    record = main_tensor(trace.stage(stage_id))
    assert record.values.shape == expected.shape
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, stage_id, index)
        assert cell.computed == pytest.approx(expected[index], rel=1e-5, abs=1e-6), (
            stage_id, index)
        assert cell.agrees, (stage_id, index, cell.computed, cell.recorded)


@pytest.mark.parametrize(("name", "layer"), [("gpt-neo", 1), ("bert", 0)])
def test_an_hf_layers_input_is_explained_step_by_step(name: str, layer: int) -> None:
    """The layer's input stage (it had no token ids: KeyError 'ids'): the token's id and its
    numbers at each recorded step, the block's input equal to the model's own hidden state
    (output_hidden_states); x read unchanged (BERT: no norm before attention) is checked ✓,
    x = ln_1(...) (GPT-Neo) is the model's own number, said to be not recomputed."""
    import torch

    from .test_families import hf_trace, own_run

    trace = hf_trace(name, layer)
    model, ids, _, _ = own_run(name)
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[layer]
    hidden = hidden.double().numpy()  # the block's input, as the model hands it on
    norm = model.transformer.h[layer].ln_1 if name == "gpt-neo" else None
    with torch.no_grad():
        x = (norm(torch.from_numpy(hidden).float()).double().numpy() if norm is not None
             else hidden)
    record = main_tensor(trace.stage("embed"))
    assert record.values.shape == x.shape
    for index in itertools.product(*map(range, record.values.shape)):
        cell = why(trace, "embed", index)
        assert cell.recorded == pytest.approx(x[index], rel=1e-5, abs=1e-6), index
        block = next(t for t in cell.terms if t.label.endswith(
            f".{layer} input[{', '.join(map(str, index))}]"))
        assert block.value == pytest.approx(hidden[index], rel=1e-5, abs=1e-6), index
        assert cell.terms[0].label == (f"token {trace.config.tokens[index[1]]} (position "
                                       f"{index[1]}) has id {ids[index[1]]}")
        if norm is None:
            assert cell.recomputed and cell.agrees and cell.computed == block.value, index
        else:
            assert not cell.recomputed and not cell.agrees
            assert any("the model's own" in note for note in cell.notes)
    text = _drawn(trace, (0, 1, 2))
    assert ("not recomputed: the model's layer norm" in text) == (norm is not None), text


def _drawn(trace: Trace, index: tuple[int, ...]) -> str:
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import why_text

    return why_text(why(trace, "embed", index), RenderOptions(), width=100)
