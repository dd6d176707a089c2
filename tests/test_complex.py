"""Complex tensors (issue 17): Meta's Llama keeps its rotary angles as complex `freqs_cis`,
FNet mixes tokens with a Fourier transform. A complex tensor a stage holds is shown as its
real and imaginary parts, two real tensors labelled as torch spells them (`t.real`,
`t.imag`), in the text transcript, the JSON transcript and the app (render.stage.labelled,
which they all draw from); the render of a complex array crashed (`np.isneginf` refuses
complex) and JSON wrote Python's `(1+2j)`. The stage itself keeps the module's complex tensor."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_tui.config import Config, Source
from mha_tui.load.modules import load
from mha_tui.pipeline import run_trace
from mha_tui.records import TensorRecord, Trace
from mha_tui.render.options import RenderOptions
from mha_tui.write.dump import to_json, to_text

from .conftest import settle

FNET = str(Path(__file__).parent / "fixtures" / "mechanisms" / "fnet_fourier.py") + \
    ":FNetBasicFourierTransform"
# 12 tokens, C 32: wide enough that a table elides columns and prints its summary line
CONFIG = Config("the cat sat on the mat and the dog sat on it", embed_dim=32, num_heads=4)


@cache
def fnet() -> Trace:
    return run_trace(CONFIG, Source(module=FNET))


def _expected() -> torch.Tensor:
    with torch.no_grad():
        return torch.fft.fftn(load(CONFIG, Source(module=FNET)).x, dim=(1, 2))


def test_complex_parts_are_torchs_real_and_imag_views() -> None:
    values = (np.arange(6, dtype=np.float32) + 1j * np.arange(6, 12, dtype=np.float32)).astype(
        np.complex64).reshape(2, 3)
    record = TensorRecord("freqs_cis", ("T", "pair"), values, (3, 1), True, caption="angles")
    real, imag = record.complex_parts()
    assert (real.name, imag.name) == ("freqs_cis.real", "freqs_cis.imag")
    assert real.values.dtype == np.float32 and np.array_equal(real.values, values.real)
    assert np.array_equal(imag.values, values.imag)
    assert real.strides == (6, 2) and not real.contiguous  # torch's t.real: every other float
    assert "real parts" in real.caption and "imaginary parts" in imag.caption
    assert real.caption.endswith("; angles")
    spaced = replace(record, name="real input: mixed").complex_parts()
    assert [r.name for r in spaced] == ["real input: mixed (real part)",
                                        "real input: mixed (imaginary part)"]
    plain = replace(record, values=values.real.copy())
    assert plain.complex_parts() == (plain,)


def test_a_complex_op_output_is_shown_as_its_real_and_imaginary_parts() -> None:
    """FNet's fftn: an op stage titled as torch's public API spells it; the stage holds the
    complex tensor torch.fft.fftn returned (recomputed here), and what every format shows
    (`labelled`) is its two parts."""
    from mha_tui.kinds.op import code_of
    from mha_tui.render.stage import labelled

    stage = fnet().stages[1]
    assert stage.kind == "op" and code_of(stage.title) == "torch.fft.fftn(hidden_states, dim=(1, 2))"
    assert stage.title.startswith("A transform of x before the projections: ")
    expected = _expected()
    assert stage.tensors[1].values.dtype == np.complex64
    assert torch.allclose(torch.from_numpy(stage.tensors[1].values), expected, atol=1e-4)
    shown = labelled(stage)
    assert [t.name for t in shown.tensors] == ["fftn input: hidden_states", "mixed.real", "mixed.imag"]
    assert torch.allclose(torch.from_numpy(shown.tensors[1].values), expected.real, atol=1e-4)
    assert torch.allclose(torch.from_numpy(shown.tensors[2].values), expected.imag, atol=1e-4)
    assert code_of(fnet().stages[2].title) == "mixed.real"  # a property, not `mixed.real()`
    for stage in map(labelled, fnet().stages):
        assert all(t.values.dtype.kind != "c" for t in (*stage.tensors, *stage.aside))


@pytest.mark.parametrize("full,color", [(False, False), (False, True), (True, False)])
def test_the_text_transcript_shows_both_parts(full: bool, color: bool) -> None:
    text = to_text(fnet(), RenderOptions(full=full), width=100, color=color)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "mixed.real  shape (1, 12, 32)" in plain and "mixed.imag  shape (1, 12, 32)" in plain
    assert "imaginary parts" in plain and "j " not in plain.split("mixed.real", 1)[1][:3000]


def test_the_json_transcript_holds_both_parts_as_numbers() -> None:
    data = json.loads(to_json(fnet()))
    tensors = data["stages"][1]["tensors"]
    expected = _expected()
    assert np.allclose(np.array(tensors["mixed.real"]["values"]), expected.real.numpy(), atol=1e-4)
    assert np.allclose(np.array(tensors["mixed.imag"]["values"]), expected.imag.numpy(), atol=1e-4)
    assert tensors["mixed.imag"]["strides"] == [2 * 32 * 12, 2 * 32, 2]


async def test_the_app_shows_both_parts() -> None:
    from mha_tui.app.explain import ExplainApp

    app = ExplainApp(fnet().config, trace=fnet(), start="op")
    async with app.run_test(size=(100, 32)) as pilot:
        await settle(app, pilot)
        shown = re.sub(r"<[^>]+>", "", app.export_screenshot()).replace("&#160;", " ")
        assert "torch.fft.fftn(hidden_states, dim=(1, 2))" in shown
        assert "fftn input: hidden_states" in shown
