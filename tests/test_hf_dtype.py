"""`--hf` in the checkpoint's own dtype (issue 33): tiny checkpoints of several families saved
in bfloat16 and float16 (tests/hf_families.py, offline), explained in that dtype, and compared
with the model's own forward in that dtype (eager attention, `output_attentions`): the
weights mha-tui shows are the model's own numbers, bit for bit. `--dtype float32` upcasts on
request and says so; the header, the JSON and every tensor say the dtype; the JSON's numbers
read back exactly; the recogniser still names every stage and no check fails.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch

from mha_tui.load import hf
from mha_tui.ops import numeric
from mha_tui.pipeline.hf import Session
from mha_tui.records import Trace
from mha_tui.render.options import RenderOptions
from mha_tui.why import main_tensor, why
from mha_tui.write.dump import to_json, to_text

from .conftest import run_cli
from .hf_families import FAMILIES, SENTENCE, build

_ROOT: list[Path] = []
# Families whose attention differs the most: rotary with shared K/V heads, Gemma's scaled
# embeddings, partial rotary with a fused QKV, multi-query, ALiBi (two ways), OPT's scaled Q,
# an encoder with a post-norm, T5's relative bias.
BF16 = ("llama", "gemma", "gpt-neox", "falcon", "bloom", "mpt", "opt", "bert", "t5")
FP16 = ("llama", "gpt-neox", "bloom")


@pytest.fixture(scope="module", autouse=True)
def _root(tmp_path_factory: pytest.TempPathFactory) -> None:
    _ROOT.append(tmp_path_factory.mktemp("dtypes"))


@cache
def checkpoint(name: str, dtype: str) -> Path:
    return build(name, _ROOT[-1] / f"{name}-{dtype}", dtype=dtype)


@cache
def own_attentions(name: str, dtype: str) -> tuple[torch.Tensor, ...]:
    """The family's own class, loaded in dtype from the checkpoint, its eager forward's
    output_attentions (the encoder's, for T5)."""
    import transformers

    family = FAMILIES[name]
    path = checkpoint(name, dtype)
    model = getattr(transformers, family.model_class).from_pretrained(
        path, attn_implementation="eager", dtype=getattr(torch, dtype)).eval()
    ids = transformers.AutoTokenizer.from_pretrained(path)(SENTENCE)["input_ids"]
    extra = {"decoder_input_ids": torch.tensor([[0]])} if name == "t5" else {}
    with torch.no_grad():
        result = model(torch.tensor([ids]), output_attentions=True, **extra)
    return result.encoder_attentions if name == "t5" else result.attentions


@cache
def trace(name: str, dtype: str, asked: str = "auto", layer: int = 0) -> Trace:
    loaded = hf.load(str(checkpoint(name, dtype)), dtype=asked)
    return Session(loaded, SENTENCE).trace(layer)


def shown_weights(t: Trace) -> tuple[np.ndarray, str]:
    """The softmax stage's last tensor: the weights the module passes on to attend."""
    record = t.stage("softmax").tensors[-1]
    return record.values, record.own_dtype


@pytest.mark.parametrize(("name", "dtype"), [*((n, "bfloat16") for n in BF16),
                                             *((n, "float16") for n in FP16)])
def test_the_weights_shown_are_the_models_own_in_its_dtype(name: str, dtype: str) -> None:
    """Loaded as saved (no --dtype), the model runs in its own dtype, and the softmax stage's
    weights equal the model's own output_attentions in that dtype, bit for bit; every stage
    kind the float32 run names is named, and no check fails."""
    t = trace(name, dtype)
    assert t.config.model is not None and t.config.model.dtype == dtype
    values, shown_dtype = shown_weights(t)
    assert shown_dtype == dtype
    own = own_attentions(name, dtype)[0]
    assert own.dtype == getattr(torch, dtype)
    assert torch.equal(torch.from_numpy(values).to(own.dtype), own)  # exactly its numbers
    assert torch.equal(torch.from_numpy(values), own.float())  # held as float32, no rounding
    # the same stages as the float32 copy, no op left unplaced, no check failed
    upcast = trace(name, dtype, "float32")
    assert [s.kind for s in t.stages] == [s.kind for s in upcast.stages]
    assert [s.title for s in t.stages if s.kind == "op"] == []
    failed = [(s.id, c.label) for s in t.stages for c in s.checks if c.ok is False]
    assert failed == []


@pytest.mark.parametrize("name", ["llama", "bloom"])
def test_float32_on_request_is_the_upcast_model_and_says_so(name: str) -> None:
    """--dtype float32 runs the float32 copy: its weights are the float32 model's, not the
    bfloat16 ones (they differ), and the header says it was upcast."""
    t = trace(name, "bfloat16", "float32")
    assert t.config.model is not None
    assert t.config.model.dtype_words() == "float32 (upcast from bfloat16 on request)"
    values, shown_dtype = shown_weights(t)
    assert shown_dtype == "float32"
    import transformers  # the bfloat16 checkpoint run in float32 by transformers itself

    family = FAMILIES[name]
    path = checkpoint(name, "bfloat16")
    model = getattr(transformers, family.model_class).from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32).eval()
    ids = transformers.AutoTokenizer.from_pretrained(path)(SENTENCE)["input_ids"]
    with torch.no_grad():
        own = model(torch.tensor([ids]), output_attentions=True).attentions[0]
    assert torch.allclose(torch.from_numpy(values), own, atol=1e-6)
    bf16, _ = shown_weights(trace(name, "bfloat16"))
    assert not np.array_equal(values, bf16)  # the upcast is another computation


def test_the_header_json_and_tensors_say_the_dtype() -> None:
    """The model line says bfloat16; the JSON's config says it and the checkpoint's; each
    bfloat16 tensor says it; every number reads back as float32 and is a bfloat16 number."""
    t = trace("llama", "bfloat16")
    text = to_text(t, RenderOptions(), width=200)
    assert text.splitlines()[0].endswith("  bfloat16")
    assert "dtype bfloat16" in text
    document = json.loads(to_json(t))
    assert document["config"]["model"]["dtype"] == "bfloat16"
    assert document["config"]["model"]["checkpoint_dtype"] == "bfloat16"
    checked = 0
    for stage, shown in zip(document["stages"], t.stages, strict=True):
        for record in shown.tensors:
            data = stage["tensors"][record.name]
            assert data.get("dtype", "") == record.dtype
            if record.dtype != "bfloat16":
                continue
            back = np.array(data["values"], dtype=np.float32)
            assert np.array_equal(back, record.values, equal_nan=True)  # the same numbers
            as_bf16 = torch.from_numpy(back).to(torch.bfloat16).float().numpy()
            assert np.array_equal(as_bf16, back, equal_nan=True)  # each a bfloat16 number
            checked += 1
    assert checked >= 10
    upcast = trace("llama", "bfloat16", "float32")
    line = to_text(upcast, RenderOptions(), width=200).splitlines()[0]
    assert line.endswith("  float32 (upcast from bfloat16 on request)")
    assert json.loads(to_json(upcast))["config"]["model"]["dtype"] == "float32"


@pytest.mark.parametrize("stage_id", ["project", "rotary", "scores", "softmax", "attend", "w_o"])
def test_why_recomputes_in_float64_and_allows_bfloat16_rounding(stage_id: str) -> None:
    """Each cell's why says the module computed in bfloat16, agrees within bfloat16 rounding,
    and would not agree within float32's where the rounding shows."""
    t = trace("llama", "bfloat16")
    record = main_tensor(t.stage(stage_id))
    index = tuple(min(2, n - 1) for n in record.values.shape)
    made = why(t, stage_id, index)
    assert made.dtype == "bfloat16" and made.agrees
    assert "bfloat16 rounding" in made.rounding
    from mha_tui.kinds._parts.cell import agrees

    assert agrees(made.computed, made.recorded, "bfloat16")
    text = to_text(t, RenderOptions(), width=100)  # the trace still draws
    assert record.name in text


def test_the_checkpoints_dtype_is_read_from_config_then_safetensors(tmp_path: Path) -> None:
    """config.json's dtype decides; without it, the safetensors header's; without either,
    float32; a --dtype outside the choices is refused in one line."""
    path = checkpoint("llama", "bfloat16")
    loaded = hf.load(str(path))
    assert (loaded.info.dtype, loaded.info.stored_dtype) == ("bfloat16", "bfloat16")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    bare = tmp_path / "bare"
    bare.mkdir()
    for file in path.iterdir():
        (bare / file.name).write_bytes(file.read_bytes())
    config = json.loads((bare / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (bare / "config.json").write_text(json.dumps(config))
    assert hf.stored_dtype(hf.tokenizer_and_config("bare", bare)[1], bare) == "bfloat16"  # header
    assert hf.chosen_dtype("auto", "bfloat16") == "bfloat16"
    assert hf.chosen_dtype("float32", "bfloat16") == "float32"
    with pytest.raises(hf.HfError, match="--dtype 'float8'"):
        hf.chosen_dtype("float8", "bfloat16")


def test_tolerance_is_the_recordings_dtype() -> None:
    """A difference of bfloat16 rounding fails float32's tolerance and passes bfloat16's; the
    rounding helper rounds as torch does."""
    rng = np.random.default_rng(0)
    exact = rng.standard_normal(1000).astype(np.float32)
    as_bf16 = torch.from_numpy(exact).to(torch.bfloat16).float().numpy()
    assert np.array_equal(numeric.rounded(exact, "bfloat16"), as_bf16)
    as_fp16 = torch.from_numpy(exact).to(torch.float16).float().numpy()
    assert np.array_equal(numeric.rounded(exact, "float16"), as_fp16)
    assert not numeric.allclose(as_bf16, exact)
    assert not numeric.close(as_bf16, exact)[0]
    with numeric.computed_in("bfloat16") as precision:
        assert numeric.allclose(as_bf16, exact) and numeric.close(as_bf16, exact)[0]
        assert "bfloat16" in precision.words()
        assert not numeric.allclose(exact * 1.1, exact)  # a different number still fails
    assert numeric.precision() == numeric.FLOAT32


def test_dtype_option_on_the_command_line(tmp_path: Path) -> None:
    """The real command: --dtype float32 says the upcast on the model line; a bad --dtype is
    one line on stderr and exit code 2."""
    path = str(checkpoint("llama", "bfloat16"))
    result = run_cli("explain", SENTENCE, "--hf", path, "--dump", "-", "--width", "200")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines()[0].endswith("  bfloat16")
    result = run_cli("explain", SENTENCE, "--hf", path, "--dtype", "float32", "--dump", "-",
                     "--width", "200")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines()[0].endswith(
        "  float32 (upcast from bfloat16 on request)")
    assert "✗" not in result.stdout.decode()
    result = run_cli("explain", SENTENCE, "--hf", path, "--dtype", "float8", "--dump", "-")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr.decode()


# ---------------------------------------------------------------- a module built here


@pytest.mark.parametrize("model", ["mygpt", "raschka", "many-eyes"])
def test_a_tutorial_module_runs_in_the_dtype_asked(model: str) -> None:
    """--dtype bfloat16 on a module built here: module.to(bfloat16), x in bfloat16; the last
    stage's tensor is the module's own bfloat16 output, every shown number a bfloat16 number,
    the same stages as in float32 and no failed check; the header and the JSON say it."""
    from mha_tui.config import Config, Source
    from mha_tui.load.modules import load
    from mha_tui.pipeline import run_trace

    config = Config("I love AI !", embed_dim=8, num_heads=2, dtype="bfloat16")
    source = Source(model=model)
    t = run_trace(config, source)
    loaded = load(config, source)  # built again: the module's own forward, untraced
    assert next(loaded.module.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        out = loaded.call(loaded.module, loaded.x)
    out = out[0] if isinstance(out, tuple) else out
    assert out.dtype == torch.bfloat16
    final = t.stages[-1].tensors[-1]
    assert final.own_dtype == "bfloat16"
    assert torch.equal(torch.from_numpy(final.values).to(torch.bfloat16), out)
    for stage in t.stages:
        for record in stage.tensors:
            if record.dtype == "bfloat16":
                as_bf16 = torch.from_numpy(record.values).to(torch.bfloat16).float().numpy()
                assert np.array_equal(as_bf16, record.values, equal_nan=True), record.name
    plain = run_trace(Config("I love AI !", embed_dim=8, num_heads=2), source)
    assert [s.kind for s in t.stages] == [s.kind for s in plain.stages]
    assert [(s.id, c.label) for s in t.stages for c in s.checks if c.ok is False] == []
    assert to_text(t, RenderOptions()).splitlines()[0].endswith(" causal bfloat16")
    assert json.loads(to_json(t))["config"]["dtype"] == "bfloat16"
    assert "dtype" not in json.loads(to_json(plain))["config"]  # float32 transcripts unchanged


def test_dtype_is_refused_for_numpy_code() -> None:
    """NumPy code has no module.to(dtype): one line, exit code 2."""
    result = run_cli("explain", "I love AI !", "--model", "blueprint", "--dtype", "bfloat16",
                     "--dump", "-")
    assert result.returncode == 2
    assert result.stderr.decode().count("\n") == 1 and "NumPy code" in result.stderr.decode()


def test_an_encoder_decoders_cross_attention_in_its_own_dtype() -> None:
    """--context on a bfloat16 T5: the decoder's cross-attention runs in bfloat16 and its
    weights are the model's own cross_attentions, bit for bit; --dtype float32 says the upcast."""
    import transformers

    from mha_tui.load import hf_seq2seq
    from mha_tui.pipeline.hf_cross import CrossSession

    path = checkpoint("t5", "bfloat16")
    loaded = hf_seq2seq.load(str(path), "cross")
    assert loaded.info.dtype == "bfloat16"
    session = CrossSession(loaded, "The cat", "The mat sat", one_layer=True)
    t = session.trace(0)
    assert t.config.model is not None and t.config.model.dtype_words() == "bfloat16"
    model = transformers.T5ForConditionalGeneration.from_pretrained(
        path, attn_implementation="eager", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(session.context_ids)]),
                    decoder_input_ids=torch.tensor([list(t.config.ids)]), output_attentions=True)
    own = out.cross_attentions[0]
    assert own.dtype == torch.bfloat16
    shown = [r for r in t.stage("softmax").tensors if r.values.shape == tuple(own.shape)][-1]
    assert shown.own_dtype == "bfloat16"
    assert torch.equal(torch.from_numpy(shown.values).to(torch.bfloat16), own)
    assert [c.label for s in t.stages for c in s.checks if c.ok is False] == []
    upcast = hf_seq2seq.load(str(path), "cross", "float32")
    assert (upcast.info.dtype, upcast.info.stored_dtype) == ("float32", "bfloat16")
