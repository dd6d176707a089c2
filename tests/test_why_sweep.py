"""Issue 20's "put the cursor on any number of any stage and see how it was computed", swept
over every way mha-tui loads a module: each `--model`, nn.MultiheadAttention, the public
modules (tests/fixtures/public), the mechanisms (tests/fixtures/mechanisms), the other
fixtures a learner's file stands for (tests/fixtures, mistakes/, unsound/) and a tiny random
`--hf` checkpoint of every family in tests/hf_families.py (and GPT-2).

Each module is traced once, with the pipeline the app and `--why` use, and `why` is asked for
the first cell, the last, a middle one and one in every head of EVERY stage. Each answer must
explain the cell: mha-tui's computation equal to the module's own number (✓), or, for an op
mha-tui does not recompute, the module's own number said to be so; a witness (the fused op's
own output) that differs must say why. Never a refusal ("holds no linear op"), never an
exception. One stage's first cell is also drawn as `--why` prints it.
"""

from __future__ import annotations

import ast
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import MODEL_NAMES, NUMPY_MODEL_NAMES, Config, Source
from mha_tui.pipeline import checked
from mha_tui.records import TensorRecord, Trace
from mha_tui.records.request import Request
from mha_tui.why import main_tensor, why

from .hf_families import FAMILIES
from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)

FIXTURES = Path(__file__).parent / "fixtures"
SENTENCE = "the cat sat on the mat"


def _classes(path: Path) -> list[str]:
    """The public classes a fixture file defines (those a learner would name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and not node.name.startswith("_")]


# Classes a fixture file defines as parts of another (a config, an attention that takes its
# rotary table as an argument, the cache module): they run inside the class that builds them.
PARTS = {"kv_caches": ("ModelArgs", "MetaAttention", "KVCache", "GPTFastAttention")}

# (id, the module ref or --model name, --init, causal): tiny sizes, C 16, h 4
MODULES: list[tuple[str, str, tuple[tuple[str, object], ...], bool]] = [
    *((f"model-{name}", name, (), True) for name in MODEL_NAMES + NUMPY_MODEL_NAMES),
    ("torch-mha", "torch.nn:MultiheadAttention", (), True),
    ("public-nanogpt-flash", "public/nanogpt.py:FlashAttention", (), True),
    ("public-nanogpt-manual", "public/nanogpt.py:SlowAttention", (), True),
    ("public-mingpt", "public/mingpt.py:MinGPTAttention", (), True),
    # timm's ViT attention is bidirectional by design (check's tests run it --no-causal)
    ("public-timm-fused", "public/timm_attention.py:FusedAttention", (("dim", 16),), False),
    ("public-timm-manual", "public/timm_attention.py:ManualAttention", (("dim", 16),), False),
    ("public-timm", "public/timm_attention.py:Attention", (), False),
    # ... and with the causal mask the loader hands it: its last row has no key left (NaN)
    ("public-timm-manual-causal", "public/timm_attention.py:ManualAttention", (("dim", 16),),
     True),
    ("public-timm-fused-causal", "public/timm_attention.py:FusedAttention", (("dim", 16),), True),
    ("public-hf-llama", "public/hf_llama.py:HFLlamaAttention", (), True),
    ("public-hf-mistral", "public/hf_mistral.py:HFMistralAttention", (), True),
    ("public-meta-llama", "public/meta_llama.py:MetaLlamaAttention",
     (("dim", 16), ("n_heads", 4)), True),
    *((f"mechanisms-{path.stem}-{cls}", f"mechanisms/{path.name}:{cls}",
       (("dim", 16),) if cls in ("Attention",) else (), True)
      for path in sorted((FIXTURES / "mechanisms").glob("[!_]*.py")) for cls in _classes(path)
      if cls in ("Attention", "BloomAttention", "FNetBasicFourierTransform", "GPTJAttention",
                 "GQAAttention", "LlamaAttention", "SelfAttention", "GPTNeoXAttention",
                 "OPTAttention", "BertAttention", "PreNormAttention", "SlidingWindowAttention",
                 "Gemma2Attention")),
    ("mechanisms-sinks-AttentionBlock", "mechanisms/sinks.py:AttentionBlock", (), True),
    # issue 30's kinds with no softmax-attention counterpart: cosine, differential, linear
    ("longtail-open-clip-cosine", "longtail/open_clip_attn.py:Attention", (), False),
    ("longtail-diff-attn", "longtail/diff_attn.py:MultiheadDiffAttn", (), True),
    ("longtail-linear-attn", "longtail/linear_attn.py:AttentionLayer", (), False),
    # the installed transformers' DiffLlama (V's halves shared by .repeat: heads cycled) and
    # gpt-oss (rotary by torch.chunk halves joined by a cat)
    ("longtail-diffllama", "longtail/hf_installed.py:DiffLlamaSelfAttention", (), True),
    ("longtail-gpt-oss", "longtail/hf_installed.py:GptOssSelfAttention", (), True),
    *((f"fixtures-{path.stem}-{cls}", f"{path.name}:{cls}", (), True)
      for path in sorted(FIXTURES.glob("[!_]*.py"))
      # endless: a forward that never returns; two_sequences: forwards that need --context
      # (their cells: test_two_sequences); arena_attn: built from a cfg object (--init cfg=)
      if path.stem not in ("endless", "two_sequences", "arena_attn")
      for cls in _classes(path) if cls not in PARTS.get(path.stem, ())),
    *((f"{folder}-{path.stem}", f"{folder}/{path.name}:{cls}", (), True)
      for folder in ("mistakes", "unsound") for path in sorted((FIXTURES / folder).glob("[!_]*.py"))
      for cls in _classes(path)[-1:]),
]


def _longtail_rest() -> list[tuple[str, str, tuple[tuple[str, object], ...], bool]]:
    """Every other configuration of issue 30's long tail (tests/longtail_cases.py), with its
    own --init and causality; SAM's lays its tokens on a square grid, which this sentence's
    6 tokens are not (its cells: the 4-token sentence of tests/test_why_longtail.py)."""
    from .longtail_cases import CASES

    swept = {(ref, init, causal) for _, ref, init, causal in MODULES}
    rest = dict.fromkeys((case.ref, case.init, case.causal) for case in CASES.values()
                         if case.library == "torch" and "sam_attn" not in case.ref)
    return [(f"longtail-{Path(ref.split(':')[0]).stem}-{ref.split(':')[1]}"
             + ("" if causal else "-no-causal"), ref, init, causal)
            for ref, init, causal in rest if (ref, init, causal) not in swept]


MODULES += _longtail_rest()

XFAIL: dict[str, str] = {  # id -> why a module's cells are not all explained yet
    **{f"longtail-hf_installed-{cls}": "norm: a q/k norm written out op by op (pow, mean, "
       "rsqrt: Hugging Face's RMSNorm; Cohere's LayerNorm) has no why (holds no layer_norm "
       "or rms_norm)" for cls in ("Qwen3SelfAttention", "Olmo2SelfAttention",
                                  "CohereQKNormSelfAttention")},
    "longtail-hf_installed-DebertaV2SelfAttention-no-causal": "scale and pos_bias: DeBERTa's "
        "scale is a 0-d tensor and its terms are not found among the add's inputs",
    "longtail-former_attn-SelfAttention": "scale: q and k each divided by s ** (1/4) before "
        "the bmm of heads folded into the batch, recomputed off the module's numbers; mask: "
        "mask_'s index_put has no op to explain it by",
}


@cache
def module_trace(ref: str, init: tuple[tuple[str, object], ...], causal: bool) -> Trace:
    """One trace per module, as the app and `--why` make it (pipeline.checked, then run)."""
    config = Config(SENTENCE, embed_dim=16, num_heads=4, causal=causal)
    source = Source(model=ref) if ":" not in ref else Source(
        module=ref if ref.startswith("torch.") else str(FIXTURES / ref), init=init)
    run, _ = checked(Request(config, source))
    return run(config)


def cells(record: TensorRecord) -> list[tuple[int, ...]]:
    """The first cell, the last, a middle one, and a middle one of every head."""
    shape = record.values.shape
    chosen = {tuple(0 for _ in shape), tuple(n - 1 for n in shape), tuple(n // 2 for n in shape)}
    for axis, dim in enumerate(record.dims):
        if dim == "h":
            for head in range(shape[axis]):
                middle = [n // 2 for n in shape]
                middle[axis] = head
                chosen.add(tuple(middle))
    return sorted(chosen)


def problems(trace: Trace) -> tuple[list[str], int]:
    """Every asked cell whose answer does not explain it, and how many cells were asked."""
    found: list[str] = []
    asked = 0
    for stage in trace.stages:
        record = main_tensor(stage)
        for index in cells(record):
            asked += 1
            where = f"{stage.id}[{', '.join(map(str, index))}]"
            try:
                cell = why(trace, stage.id, index)
            except Exception as error:  # a refusal or a crash: both are found
                found.append(f"{where}: {type(error).__name__}: {error}")
                continue
            if cell.index != index or cell.tensor != record.name or not cell.terms:
                found.append(f"{where}: answers another cell ({cell.tensor}{list(cell.index)})")
            own = float(np.real(record.values[index]))
            if cell.recorded_by == "" and not (cell.recorded == own or (
                    math.isnan(cell.recorded) and math.isnan(own))):
                found.append(f"{where}: the module's number is {own}, the answer says "
                             f"{cell.recorded}")
            if not cell.recomputed:
                if not any("own" in note for note in cell.notes):
                    found.append(f"{where}: not recomputed, and does not say whose it is")
            elif not cell.agrees:
                found.append(f"{where}: ✗ mha-tui's {cell.computed} against {cell.recorded}")
            if cell.witness is not None and not cell.compared(cell.witness.value)[1] \
                    and not cell.witness.caveat:
                found.append(f"{where}: ✗ against {cell.witness.label}, with no word why")
    return found, asked


def _first_drawn(trace: Trace) -> str:
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import why_text

    stage = trace.stages[len(trace.stages) // 2]
    index = cells(main_tensor(stage))[0]
    return why_text(why(trace, stage.id, index), RenderOptions(), width=100)


@pytest.mark.parametrize(("ref", "init", "causal"), [
    pytest.param(ref, init, causal, id=name,
                 marks=[pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL
                 else []) for name, ref, init, causal in MODULES])
def test_every_stage_of_a_module_explains_its_cells(ref: str, init: tuple, causal: bool) -> None:
    trace = module_trace(ref, init, causal)
    found, asked = problems(trace)
    assert not found, "\n".join(found)
    assert asked >= 3 * len(trace.stages)
    drawn = _first_drawn(trace)
    assert drawn.startswith("why ") and ("✓" in drawn or "not recomputed" in drawn), drawn


# Sizes at the edges: no mask (--no-causal), one token and one head, d_h = 2.
EDGES = [
    *((f"{name}-no-causal", name, (), SENTENCE, 16, 8) for name in ("mygpt", "course", "blueprint")),
    ("torch-mha-no-causal", "torch.nn:MultiheadAttention", (), SENTENCE, 16, 8),
    ("numpy-no-causal", "numpy_attn.py:NumpyAttention", (), SENTENCE, 16, 8),
    *((f"one-token-{ref.split(':')[-1]}", ref, (), "hi", 16, 1) for ref in (
        "mygpt", "blueprint", "mechanisms/gptj_rotary.py:GPTJAttention",
        "mechanisms/neox_rotary.py:GPTNeoXAttention", "check_variants.py:WhereMinusBillion",
        "numpy_attn.py:NumpyAttention", "numpy_attn.py:PerHeadWeights",
        "public/nanogpt.py:SlowAttention")),
]


@pytest.mark.parametrize(("ref", "init", "sentence", "embed_dim", "heads"), [
    pytest.param(*case[1:], id=case[0]) for case in EDGES])
def test_edge_sizes_explain_their_cells(ref: str, init: tuple, sentence: str, embed_dim: int,
                                        heads: int) -> None:
    config = Config(sentence, embed_dim=embed_dim, num_heads=heads,
                    causal=sentence != SENTENCE)  # the long sentence: --no-causal
    source = Source(model=ref) if ":" not in ref else Source(
        module=ref if ref.startswith("torch.") else str(FIXTURES / ref), init=init)
    run, _ = checked(Request(config, source))
    found, asked = problems(run(config))
    assert not found, "\n".join(found)
    assert asked


# --hf: every family's tiny random checkpoint (and GPT-2's, tests/hf_models.py), layer 0;
# GPT-Neo's layer 1 too (its local, windowed layer)
HF = [("gpt2", 0), *((name, 0) for name in FAMILIES), ("gpt-neo", 1)]
HF_XFAIL: dict[str, str] = {}  # name -> why its cells are not all explained yet


@cache
def hf_trace(name: str, layer: int) -> Trace:
    from .test_families import hf_trace as family_trace

    if name != "gpt2":
        return family_trace(name, layer)
    from mha_tui.load import hf
    from mha_tui.pipeline.hf import Session

    from .hf_families import SENTENCE as HF_SENTENCE
    from .hf_models import save_tiny_gpt2
    from .test_families import _ROOT

    directory = _ROOT[0] / "gpt2-why-sweep"
    if not directory.exists():
        save_tiny_gpt2(directory)
    return Session(hf.load(str(directory)), HF_SENTENCE).trace(layer)


@pytest.mark.parametrize(("name", "layer"), [
    pytest.param(name, layer, id=f"hf-{name}-layer{layer}",
                 marks=[pytest.mark.xfail(strict=True, reason=HF_XFAIL[name])]
                 if name in HF_XFAIL else []) for name, layer in HF])
def test_every_stage_of_an_hf_layer_explains_its_cells(name: str, layer: int) -> None:
    trace = hf_trace(name, layer)
    found, asked = problems(trace)
    assert not found, "\n".join(found)
    assert asked >= 3 * len(trace.stages)
