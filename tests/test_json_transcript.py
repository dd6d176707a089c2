"""The JSON transcript holds every tensor of every stage, for every module the tests know.

Two tensors of one name in a stage (a rotary module's `q_embed`, made by a mul and by the add
after it) are both written, under the names the screen shows (`render.stage.labelled`).
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import MODEL_NAMES, NUMPY_MODEL_NAMES, Config, Source
from mha_tui.records import Stage, TensorRecord, Trace
from mha_tui.render.options import RenderOptions
from mha_tui.render.stage import labelled
from mha_tui.write.dump import TranscriptError, to_json, to_text, write_json

from .conftest import ROOT, run_cli

FIXTURES = Path(ROOT, "tests", "fixtures")
ROTARY = f"{FIXTURES / 'rotary_attn.py'}:RotaryAttention"
HALVES = f"{FIXTURES / 'halves_attn.py'}:MultiHeadAttention"

# Every module style the tests already use: the tutorials, each fixture class, torch's own.
MODULES = [
    *(f"{FIXTURES / 'check_variants.py'}:{name}" for name in
      ("FusedMaskFirst", "WhereMinusBillion", "SplitScale", "SdpaMaskArgument")),
    f"{FIXTURES / 'crash_attn.py'}:CrashingAttention",
    f"{FIXTURES / 'einsum_attn.py'}:EinsumAttention",
    f"{FIXTURES / 'nanogpt_attn.py'}:CausalSelfAttention",
    *(f"{FIXTURES / 'numpy_attn.py'}:{name}" for name in
      ("NumpyAttention", "BrokenReshape", "PerHeadWeights", "ScaledBySqrtC", "SoftmaxOverQueries")),
    *(f"{path}:MultiHeadAttention" for path in sorted((FIXTURES / "mistakes").glob("*.py"))
      if path.name != "__init__.py"),
    ROTARY,
    HALVES,
    "torch.nn:MultiheadAttention",
]


@cache
def _trace(model: str | None, module: str | None) -> Trace:
    from mha_tui.load.numpy_modules import load as load_numpy
    from mha_tui.pipeline import run_trace

    config = Config("I love AI !")
    source = Source(model=model or "mygpt", module=module)
    loaded = load_numpy(config, source)
    if loaded is None:
        from mha_tui.load.modules import load

        loaded = load(config, source)
    return run_trace(config, loaded=loaded)


def _values(data: object) -> np.ndarray:
    """A tensor's JSON values as an array (non-finite floats are strings in the file)."""
    def number(v: object) -> object:
        if isinstance(v, list):
            return [number(x) for x in v]
        return float(v) if isinstance(v, str) else v
    return np.array(number(data))


def _same_values(written: np.ndarray, record: TensorRecord) -> bool:
    expected = record.values
    if written.shape != expected.shape:
        return False
    if expected.dtype.kind == "f":  # exact, NaN where NaN (float32 text reads back exactly)
        return bool(np.array_equal(written.astype(expected.dtype), expected, equal_nan=True))
    return bool(np.array_equal(written, expected))


def _assert_round_trip(trace: Trace) -> None:
    document = json.loads(to_json(trace))
    assert [s["id"] for s in document["stages"]] == [s.id for s in trace.stages]
    for stage, written in zip(trace.stages, document["stages"], strict=True):
        for part in ("tensors", "aside"):
            records = getattr(stage, part)
            assert len(written[part]) == len(records), (stage.id, part)
            for record, (name, tensor) in zip(records, written[part].items(), strict=True):
                assert name.split(" (")[0] == record.name.split(" (")[0], (stage.id, name)
                assert tensor["shape"] == list(record.shape)
                assert _same_values(_values(tensor["values"]), record), (stage.id, name)


@pytest.mark.parametrize("model", MODEL_NAMES + NUMPY_MODEL_NAMES)
def test_json_round_trip_for_every_model(model: str) -> None:
    """The same stages and the same tensors (count, names, values) as the trace."""
    _assert_round_trip(_trace(model, None))


@pytest.mark.parametrize("module", MODULES, ids=lambda spec: spec.rsplit("/", 1)[-1])
def test_json_round_trip_for_every_module_style(module: str) -> None:
    _assert_round_trip(_trace(None, module))


def _record(name: str, value: float) -> TensorRecord:
    values = np.full((2, 2), value, dtype=np.float32)
    return TensorRecord(name=name, dims=("T", "T"), values=values, strides=(2, 1), contiguous=True)


def _hand_trace(*names: str, aside: tuple[str, ...] = ()) -> Trace:
    tensors = tuple(_record(name, float(i)) for i, name in enumerate(names))
    extra = tuple(_record(name, float(len(names) + i)) for i, name in enumerate(aside))
    stage = Stage(id="op", title="Tensor.add", code="q_embed = q + r", explanation="",
                  shape_in=(2, 2), shape_out=(2, 2), dims_in=("T", "T"), dims_out=("T", "T"),
                  tensors=tensors, aside=extra, kind="op")
    return Trace(config=Config("I love"), stages=(stage,))


def test_two_tensors_of_one_name_are_both_written() -> None:
    """Before: the dict kept one of them and write_json looped forever."""
    trace = _hand_trace("q_embed", "q", "q_embed", "q_embed")
    stage = json.loads(to_json(trace))["stages"][0]
    assert list(stage["tensors"]) == ["q_embed", "q", "q_embed (2)", "q_embed (3)"]
    assert [stage["tensors"][name]["values"][0][0] for name in stage["tensors"]] == [0, 1, 2, 3]


def test_a_numbered_name_never_takes_an_existing_one() -> None:
    trace = _hand_trace("q_embed", "q_embed (2)", "q_embed", aside=("q_embed",))
    shown = labelled(trace.stages[0])
    names = [r.name for r in (*shown.tensors, *shown.aside)]
    assert names == ["q_embed", "q_embed (2)", "q_embed (3)", "q_embed (4)"]
    assert [float(r.values[0, 0]) for r in (*shown.tensors, *shown.aside)] == [0, 1, 2, 3]
    stage = json.loads(to_json(trace))["stages"][0]
    assert list(stage["tensors"]) == names[:3] and list(stage["aside"]) == names[3:]


def test_the_text_transcript_shows_the_same_names_as_the_json() -> None:
    trace = _hand_trace("q_embed", "q_embed")
    text = to_text(trace, RenderOptions())
    assert "q_embed (2)  shape (2, 2)" in text
    assert text.count("q_embed  shape (2, 2)") == 1


def test_a_real_module_with_two_tensors_of_one_name_keeps_both() -> None:
    """`v = (v * 0.5) + (v * 0.5)`: the add's stage holds two inputs called `v`."""
    trace = _trace(None, HALVES)
    doubled = [s for s in trace.stages if len({r.name for r in s.tensors}) < len(s.tensors)]
    assert doubled, "the fixture must give a stage two tensors of one name"
    document = json.loads(to_json(trace))
    text = to_text(trace, RenderOptions())
    for stage in doubled:
        written = next(s for s in document["stages"] if s["id"] == stage.id)
        assert len(written["tensors"]) == len(stage.tensors)
        numbered = [name for name in written["tensors"] if name.endswith(" (2)")]
        assert numbered
        for name in numbered:  # the text transcript shows the same name
            assert f"{name}  shape" in text


def test_rotary_json_from_the_command_line_finishes(tmp_path: Path) -> None:
    """The blocker as a user met it: --format json on a rotary module spun forever."""
    out = tmp_path / "r.json"
    result = run_cli("explain", "I love AI !", "--module", ROTARY, "--dump", str(out),
                     "--format", "json", timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    stages = json.loads(out.read_text("utf-8"))["stages"]
    assert sum(len(s["tensors"]) for s in stages) == sum(
        len(s.tensors) for s in _trace(None, ROTARY).stages)


def test_a_value_json_cannot_hold_is_an_error_not_a_loop() -> None:
    """Any failure to build the document raises one error before a byte is written."""
    trace = _hand_trace("t")
    stage = replace(trace.stages[0], note=math.nan)  # type: ignore[arg-type]
    out = io.BytesIO()
    with pytest.raises(TranscriptError, match="could not build the JSON transcript"):
        write_json(replace(trace, stages=(stage,)), out)
    assert out.getvalue() == b""


def test_json_round_trip_for_a_tiny_llama_checkpoint(tmp_path: Path) -> None:
    """A Hugging Face Llama layer (rotary positions, shared K/V heads), built offline: a
    family the issue found spinning forever in JSON."""
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mha_tui.load import hf
    from mha_tui.pipeline.hf import Session

    from .hf_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    LlamaForCausalLM(config).eval().save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    trace = Session(hf.load(str(tmp_path)), "The cat sat", ascii_only=False,
                       one_layer=True).trace(0)
    _assert_round_trip(trace)
