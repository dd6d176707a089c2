"""The attention of the models people run (issue 17): tiny random checkpoints of every family
(tests/hf_families.py) and hand-written modules in the public modules' styles
(tests/fixtures/mechanisms/), each checked to be what it claims, then explained.

Expectations mha-tui does not meet yet are marked `xfail(strict=True)`: they turn into
failures the moment they pass, so the marks are taken off as each mechanism lands.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from mha_tui.config import Config, Source
from mha_tui.load import hf
from mha_tui.load.modules import load
from mha_tui.pipeline import run_trace
from mha_tui.pipeline.hf import Session
from mha_tui.records import Trace

from .hf_families import FAMILIES, SENTENCE, WINDOW, attention_of, build, model_for, tokenizer_for

MECHANISMS = Path(__file__).parent / "fixtures" / "mechanisms"
_ROOT: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _families_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    _ROOT.append(tmp_path_factory.mktemp("families"))


@cache
def family_dir(name: str) -> Path:
    """Family `name`'s checkpoint and tokenizer, saved once per test session."""
    return build(name, _ROOT[0] / name)


@cache
def own_run(name: str, module_path: str = ""
            ) -> tuple[torch.nn.Module, list[int], object, list[torch.Tensor]]:
    """The family's own class loaded from disk, its forward with output_attentions (eager),
    and each layer's attention module output, seen by a forward hook (the module at `module_path`,
    with `0` standing for the layer, or the family's self-attention)."""
    import transformers

    family = FAMILIES[name]
    path = family_dir(name)
    model = getattr(transformers, family.model_class).from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32).eval()
    ids = list(transformers.AutoTokenizer.from_pretrained(path)(SENTENCE)["input_ids"])
    outputs: list[torch.Tensor] = []
    modules = [model.get_submodule(module_path.replace(".0.", f".{layer}.", 1)) if module_path
               else attention_of(model, family, layer) for layer in range(2)]
    handles = [modules[layer].register_forward_hook(
        lambda module, args, out: outputs.append(out[0] if isinstance(out, tuple) else out))
        for layer in range(2)]
    extra = {"decoder_input_ids": torch.tensor([[0]])} if family.name == "t5" else {}
    try:
        with torch.no_grad():
            result = model(torch.tensor([ids]), output_attentions=True, **extra)
    finally:
        for handle in handles:
            handle.remove()
    return model, ids, result, outputs[:2]


def _attentions(name: str) -> tuple[torch.Tensor, ...]:
    _, _, result, _ = own_run(name)
    return result.encoder_attentions if name == "t5" else result.attentions


# ---------------------------------------------------------------- the checkpoints themselves


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_builds_and_runs_its_forward(name: str) -> None:
    """Each tiny checkpoint loads back with its own class and runs: 2 layers of 4 heads,
    weights that are probability rows, and the mechanism the family is here for."""
    family = FAMILIES[name]
    model, ids, _, outputs = own_run(name)
    T = len(ids)
    assert T > WINDOW + 3
    attentions = _attentions(name)
    assert len(attentions) == 2 and len(outputs) == 2
    for layer, weights in enumerate(attentions):
        assert weights.shape == (1, 4, T, T)
        assert torch.allclose(weights.sum(-1), torch.ones(1, 4, T), atol=1e-5)
        assert outputs[layer].shape == (1, T, 32)
        later = weights[0][:, torch.ones(T, T, dtype=torch.bool).triu(1)]  # on later keys
        if family.encoder:
            assert (later > 0).all(), "an encoder's every token sees every token"
        else:
            assert (later == 0).all(), "a decoder never looks ahead"
        far = weights[0].tril(-WINDOW)  # keys WINDOW or more tokens back
        windowed = name == "mistral" or (name == "gpt-neo" and layer == 1)
        assert torch.equal(far, torch.zeros_like(far)) is windowed
    attention = attention_of(model, family)
    linear_shapes = {n: tuple(p.shape) for n, p in attention.named_parameters() if p.ndim == 2}
    d_kv = {"llama": 16, "mistral": 16, "qwen2": 16, "gemma": 8}.get(name)
    if d_kv is not None:  # shared K/V heads: k_proj and v_proj are (h_kv * d_h, C)
        assert linear_shapes["k_proj.weight"] == linear_shapes["v_proj.weight"] == (d_kv, 32)
        assert linear_shapes["q_proj.weight"] == (32, 32)
    if name == "falcon":  # one fused layer: 4 query heads, 1 key head, 1 value head of 8
        assert linear_shapes["query_key_value.weight"] == ((4 + 2) * 8, 32)


def test_every_family_has_its_own_kind_of_tokenizer() -> None:
    pieces = {}
    for name in ("gpt-j", "llama", "bert", "t5", "roberta"):
        tokenizer = tokenizer_for(FAMILIES[name])
        pieces[name] = tokenizer.convert_ids_to_tokens(tokenizer(SENTENCE)["input_ids"])
    assert pieces["gpt-j"][:2] == ["The", "Ġcat"]
    assert pieces["llama"][:3] == ["<s>", "▁The", "▁cat"]
    assert pieces["bert"][:2] == ["[CLS]", "the"] and pieces["bert"][-1] == "[SEP]"
    assert pieces["t5"][:2] == ["▁The", "▁cat"] and pieces["t5"][-1] == "</s>"
    assert pieces["roberta"][0] == "<s>" and pieces["roberta"][-1] == "</s>"


def test_a_family_is_the_same_checkpoint_every_time() -> None:
    first, again = (model_for(FAMILIES["llama"], 300, seed=0) for _ in range(2))
    for (name, a), (_, b) in zip(first.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- the modules themselves


MODULES = {
    # file:class -> (--init, what its forward shows)
    "llama_rotary.py:LlamaAttention": ((), ("rotary_half", "kv_repeat")),
    "meta_llama.py:Attention": ((("dim", 32),), ("rotary_complex", "kv_repeat")),
    "gptj_rotary.py:GPTJAttention": ((), ("rotary_interleaved", "partial_rotary")),
    "neox_rotary.py:GPTNeoXAttention": ((), ("rotary_half", "partial_rotary", "fused_qkv")),
    "alibi.py:BloomAttention": ((), ("alibi", "fused_qkv")),
    "sliding_window.py:SlidingWindowAttention": ((), ("sliding_window",)),
    "opt_style.py:OPTAttention": ((), ("q_scaled",)),
    "timm_fused.py:Attention": ((("dim", 32),), ("fused_qkv", "q_scaled", "bidirectional")),
    "prenorm.py:PreNormAttention": ((), ("layer_norm",)),
    "mha_no_weights.py:SelfAttention": ((), ("need_weights_false",)),
}
MODULE_SENTENCE = "the cat sat on the mat"


def _module_config() -> Config:
    return Config(MODULE_SENTENCE, embed_dim=32, num_heads=4)


def _source(ref: str) -> Source:
    return Source(module=f"{MECHANISMS / ref}", init=MODULES[ref][0])


@pytest.mark.parametrize("ref", list(MODULES))
def test_every_module_runs_as_its_style_says(ref: str) -> None:
    """Built the way `--module` builds it; a later token never changes an earlier output
    (bidirectional timm: it does), and a window of 2 forgets token 0 from token 2 on."""
    loaded = load(_module_config(), _source(ref))
    with torch.no_grad():
        out = loaded.forward()
        T = loaded.x.shape[1]
        assert out.shape == (1, T, 32)
        torch.manual_seed(1)
        for changed in (T - 1, 0):
            x = loaded.x.clone()
            x[:, changed] += torch.randn(32)  # not a constant: a LayerNorm would erase it
            again = loaded.call(loaded.module, x)
            again = again[0] if isinstance(again, tuple) else again
            moved = (again - out).abs().amax(-1)[0] > 1e-6  # (T,) which outputs changed
            if changed == T - 1:
                expected = torch.ones(T, dtype=torch.bool) if "bidirectional" in MODULES[ref][1] \
                    else torch.arange(T) == T - 1
            else:
                expected = (torch.ones(T, dtype=torch.bool) if "bidirectional" in MODULES[ref][1]
                            else torch.arange(T) < (WINDOW if "sliding_window" in MODULES[ref][1]
                                                    else T))
            assert torch.equal(moved, expected), (changed, moved)


def test_the_rotary_modules_rotate_by_position_only() -> None:
    """Rotary's defining property, on the modules' own q/k: the same token at two positions
    gives scores that depend only on the distance (checked on the Llama-style module)."""
    from .fixtures.mechanisms import llama_rotary

    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    rope = llama_rotary.RotaryEmbedding(8)
    cos, sin = rope(q, torch.arange(12)[None])  # (1, 12, 8)

    def score(i: int, j: int) -> torch.Tensor:
        qi, _ = llama_rotary.apply_rotary_pos_emb(q, q, cos[:, None, i:i + 1], sin[:, None, i:i + 1])
        _, kj = llama_rotary.apply_rotary_pos_emb(k, k, cos[:, None, j:j + 1], sin[:, None, j:j + 1])
        return (qi * kj).sum()

    assert torch.allclose(score(5, 2), score(9, 6), atol=1e-5)
    assert not torch.allclose(score(5, 2), score(5, 3), atol=1e-3)


# ---------------------------------------------------------------- explained today (xfail: to do)


@cache
def hf_trace(name: str, layer: int) -> Trace:
    loaded = hf.load(str(family_dir(name)))
    return Session(loaded, SENTENCE).trace(layer)


@cache
def module_trace(ref: str) -> Trace:
    return run_trace(_module_config(), _source(ref))


def _layer(name: str) -> int:
    return 1 if name == "gpt-neo" else 0  # GPT-Neo's layer 1 is its local one


UNPLACED: set[str] = set()


def _xfail(condition: bool, reason: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(strict=True, reason=reason)] if condition else []


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=_xfail(name in UNPLACED, "unplaced ops")) for name in FAMILIES])
def test_no_unplaced_op_remains_in_a_family(name: str) -> None:
    trace = hf_trace(name, _layer(name))
    assert [stage.title for stage in trace.stages if stage.kind == "op"] == []


@pytest.mark.parametrize("name", list(FAMILIES))
def test_no_check_of_a_family_fails(name: str) -> None:
    """A model's own forward is right by definition: a ✗ on its trace is mha-tui's mistake
    (GPT-Neo's local layer: the window's fill, then the added causal mask, was called
    wrong because only the first mask op's fill was expected)."""
    trace = hf_trace(name, _layer(name))
    failed = [f"{stage.id}: {check.label}" for stage in trace.stages for check in stage.checks
              if check.ok is False]
    assert failed == []


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_shown_softmax_and_output_are_the_models_own(name: str) -> None:
    """The softmax stage's weights equal the model's output_attentions (eager), head by head,
    and the last stage's tensor equals the attention module's own output."""
    layer = _layer(name)
    trace = hf_trace(name, layer)
    weights = trace.stage("softmax").tensors[-1].values
    assert torch.allclose(torch.from_numpy(weights), _attentions(name)[layer], atol=1e-6)
    final = torch.from_numpy(trace.stages[-1].tensors[-1].values)
    shown = trace.config.model.attention.replace(f".{layer}.", ".0.", 1)
    # The same module in the family's own class (an encoder's path lacks its head's prefix).
    own = next(path for path, _ in own_run(name)[0].named_modules()
               if path == shown or path.endswith(f".{shown}"))
    assert torch.equal(final, own_run(name, own)[3][layer])


# What says a mechanism is named: a stage's title (or, for a mask that is absent or a scale
# that moved, its words) naming it.
NAMED = {
    "rotary_half": ("title", r"(?i)\brotary\b"),
    "rotary_interleaved": ("title", r"(?i)\brotary\b"),
    "rotary_complex": ("title", r"(?i)\brotary\b"),
    "partial_rotary": ("text", r"(?i)pass-through"),
    "kv_repeat": ("title", r"K/V heads?"),
    "multi_query": ("title", r"K/V heads?"),
    "sliding_window": ("title", r"(?i)window"),
    "local_window": ("title", r"(?i)window"),
    "alibi": ("title", r"ALiBi"),
    "relative_bias": ("title", r"(?i)relative position"),
    "bidirectional": ("text", r"(?i)every token sees every token"),
    "q_scaled": ("text", r"(?i)\bQ is scaled|scales Q\b"),
    "fused_qkv": ("title", r"(?i)fused"),
    "layer_norm": ("title", r"(?i)layer ?norm"),
    "need_weights_false": ("kinds", "softmax"),
    # The first stage: what the embeddings were found to be, and T5's scale of 1.
    "positions": ("text", r"token t gets row t of \S*position|token t gets row t of \S*wpe"),
    "offset_positions": ("text", r"token t gets row t \+ 2 of"),
    "scaled_embeddings": ("text", r"sqrt\(C\) = sqrt\(32\)"),
    "unscaled": ("title", r"Not scaled: the factor is 1, not 1/sqrt\(d_h\)"),
}
SKIPPED = {"padding"}  # one sentence is never padded
# Named on screen today; the rest are xfail(strict) until their kind lands.
NAMED_NOW = {"rotary_half", "rotary_interleaved", "rotary_complex", "partial_rotary", "kv_repeat",
             "multi_query", "sliding_window", "local_window", "bidirectional", "alibi", "q_scaled",
             "layer_norm", "need_weights_false", "fused_qkv", "positions", "offset_positions",
             "scaled_embeddings", "unscaled", "relative_bias"}


def _named(trace: Trace, mechanism: str) -> bool:
    where, pattern = NAMED[mechanism]
    if where == "kinds":
        return any(stage.kind == pattern for stage in trace.stages)
    if where == "title":
        text = "\n".join(stage.title for stage in trace.stages)
    else:
        text = "\n".join(f"{stage.title}\n{stage.explanation}\n{stage.note}\n" + "\n".join(
            check.label for check in stage.checks) for stage in trace.stages)
    return re.search(pattern, text) is not None


@pytest.mark.parametrize("name,mechanism", [
    pytest.param(name, mechanism, marks=_xfail(mechanism not in NAMED_NOW, "not named yet"))
    for name, family in FAMILIES.items() for mechanism in family.mechanisms
    if mechanism not in SKIPPED])
def test_the_mechanism_is_named_in_a_family(name: str, mechanism: str) -> None:
    assert _named(hf_trace(name, _layer(name)), mechanism)


@pytest.mark.parametrize("ref,mechanism", [
    pytest.param(ref, mechanism, marks=_xfail(mechanism not in NAMED_NOW, "not named yet"))
    for ref, (_, mechanisms) in MODULES.items() for mechanism in mechanisms])
def test_the_mechanism_is_named_in_a_module(ref: str, mechanism: str) -> None:
    assert _named(module_trace(ref), mechanism)


MODULE_UNPLACED: set[str] = set()


@pytest.mark.parametrize("ref", [
    pytest.param(ref, marks=_xfail(ref in MODULE_UNPLACED, "unplaced ops")) for ref in MODULES])
def test_no_unplaced_op_remains_in_a_module(ref: str) -> None:
    trace = module_trace(ref)
    assert [stage.title for stage in trace.stages if stage.kind == "op"] == []
    with torch.no_grad():
        expected = load(_module_config(), _source(ref)).forward()
    # allclose, not equal: untraced, nn.MultiheadAttention(need_weights=False) takes torch's
    # fused fast path, whose float32 rounding differs in the last bits.
    final = torch.from_numpy(trace.stages[-1].tensors[-1].values)
    assert torch.allclose(final, expected, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- encoders and the first stage


ENCODER_CLASSES = {"bert": "BertModel", "roberta": "RobertaModel",
                   "distilbert": "DistilBertModel", "t5": "T5EncoderModel"}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_loads_with_its_own_kind_of_class(name: str) -> None:
    """Encoders load as the bare encoder (never a causal-LM head, never T5's decoder);
    decoders as their causal LM."""
    loaded = hf.load(str(family_dir(name)))
    assert loaded.info.encoder is FAMILIES[name].encoder
    if FAMILIES[name].encoder:
        assert loaded.info.class_name == ENCODER_CLASSES[name]
    else:
        assert loaded.info.class_name.endswith("ForCausalLM")


def _block0_input(name: str) -> torch.Tensor:
    """What the family's first block receives, computed here from each family's published
    recipe with the model's own tables (the tests' knowledge, not mha-tui's)."""
    model, ids, _, _ = own_run(name)
    T = len(ids)
    tokens = model.get_input_embeddings().weight[torch.tensor(ids)]  # (T, C)
    with torch.no_grad():
        if name == "gpt-neo":
            return tokens + model.transformer.wpe.weight[:T]
        if name == "gemma":
            return tokens * torch.tensor(32 ** 0.5)
        if name == "opt":
            return tokens + model.model.decoder.embed_positions.weight[2:2 + T]
        if name == "bloom":
            return model.transformer.word_embeddings_layernorm(tokens)
        if name in ("bert", "roberta"):
            parts = getattr(model, name).embeddings
            first = 2 if name == "roberta" else 0  # after RoBERTa's padding index 1
            return parts.LayerNorm(tokens + parts.token_type_embeddings.weight[0]
                                   + parts.position_embeddings.weight[first:first + T])
        if name == "distilbert":
            parts = model.distilbert.embeddings
            return parts.LayerNorm(tokens + parts.position_embeddings.weight[:T])
        return tokens  # rotary, ALiBi and T5's relative bias: positions enter in attention


# What the first stage must say it found, per family (beyond the token lookup).
FIRST_STAGE_WORDS = {
    "gpt-neo": [r"token t gets row t of transformer\.wpe\.weight", r"is wte \+ wpe"],
    "opt": [r"token t gets row t \+ 2 of model\.decoder\.embed_positions\.weight"],
    "gemma": [r"times 5\.65685 = sqrt\(C\) = sqrt\(32\)"],
    "bloom": [r"applied to that sum|word_embeddings_layernorm"],
    "bert": [r"every token gets row 0 of embeddings\.token_type_embeddings\.weight",
             r"token t gets row t of embeddings\.position_embeddings\.weight",
             r"embeddings\.LayerNorm applied to that sum"],
    "roberta": [r"token t gets row t \+ 2 of embeddings\.position_embeddings\.weight.*"
                r"row 1 is the padding index", r"embeddings\.LayerNorm applied to that sum"],
    "distilbert": [r"token t gets row t of embeddings\.position_embeddings\.weight",
                   r"embeddings\.LayerNorm applied to that sum"],
}
NO_POSITION_EMBEDDING = {"gpt-j", "gpt-neox", "phi", "llama", "mistral", "qwen2", "gemma",
                         "bloom", "falcon", "mpt", "t5"}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_first_stage_is_read_off_each_familys_own_modules(name: str) -> None:
    """Every check of the first stage holds (no false ✗ for Gemma's sqrt(C), OPT's and
    RoBERTa's offset positions, BERT's token types and LayerNorm), says what it found, and
    the block-0 input shown is the one each family's recipe gives."""
    layer = _layer(name)
    first = hf_trace(name, layer).stages[0]
    assert first.kind == "embed"
    assert [c.label for c in first.checks if c.ok is False] == []
    labels = "\n".join(c.label for c in first.checks)
    assert re.search(r"row t of the token embeddings is row input_ids\[t\]", labels)
    for words in FIRST_STAGE_WORDS.get(name, []):
        assert re.search(words, labels), (words, labels)
    said = "No position embedding is added here" in first.explanation
    assert said is (name in NO_POSITION_EMBEDDING), first.explanation
    inside = any(stage.kind in ("rotary", "pos_bias") for stage in hf_trace(name, layer).stages)
    assert ("positions enter inside attention" in first.explanation) is inside
    block0 = next(r for r in first.tensors if r.name.endswith(".0 input"))
    assert torch.allclose(torch.from_numpy(block0.values)[0], _block0_input(name), atol=1e-6)


# TRIAL2 #2: the tensors that were drawn with anonymous axes (d0, d1, ...): (stage, tensor) ->
# the dims the trace knows them by.
NAMED_DIMS = {
    "llama": {("project", "key_states"): ("B", "T", "h_kv*d_h"),
              ("project", "value_states"): ("B", "T", "h_kv*d_h"),
              ("rotary", "K before"): ("B", "h_kv", "T", "d_h"),
              ("rotary", "K after"): ("B", "h_kv", "T", "d_h"),
              ("kv_repeat", "K (2 heads)"): ("B", "h_kv", "T", "d_h"),
              ("mask", "attention_mask"): ("B", "1", "T", "T")},
    "gemma": {("project", "key_states"): ("B", "T", "h_kv*d_h"),
              ("rotary", "K after"): ("B", "h_kv", "T", "d_h"),
              ("kv_repeat", "V (1 head)"): ("B", "h_kv", "T", "d_h")},
    "falcon": {("project", "query_key_value(x)"): ("B", "T", "(h+2*h_kv)*d_h"),
               ("qkv_split", "k"): ("B", "T", "h_kv", "d_h"),
               ("transpose", "key_layer"): ("B", "h_kv", "T", "d_h"),
               ("rotary", "K before"): ("B", "h_kv", "T", "d_h")},
    "gpt-neox": {("project", "qkv"): ("B", "T", "3C"), ("qkv_split", "qkv (fused)"): ("B", "T", "3C")},
    "bloom": {("project", "fused_qkv"): ("B", "T", "3C")},
    "gpt-neo": {("mask", "attention.bias[:, :, 0:7, :7]"): ("B", "1", "T", "T")},
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_tensor_of_a_family_has_named_axes(name: str) -> None:
    """TRIAL2 #2: K and V with h_kv heads, fused q | k | v outputs and the model's
    (B, 1, T, T) mask were drawn as d0, d1, ... with rows [0, 0] ..; now every tensor of
    every family's layer has named axes, and the K/V heads are drawn as heads with tokens."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.render.tensor import matrix_cell, tensor_index, tensor_matrices

    trace = hf_trace(name, _layer(name))
    anonymous = [(s.id, t.name, t.dims) for s in trace.stages for t in (*s.tensors, *s.aside)
                 if t.dims[:1] == ("d0",)]
    assert anonymous == []
    for (stage_id, tensor), dims in NAMED_DIMS.get(name, {}).items():
        record = trace.stage(stage_id).tensor(tensor)
        assert record.dims == dims, (stage_id, tensor, record.dims)
        matrices = tensor_matrices(record, trace.config, RenderOptions(full=True))
        if "T" in dims:  # token rows, one matrix per K/V head
            assert all(list(m.rows.labels) == list(trace.config.tokens) for m in matrices)
        if "h_kv" in dims:
            assert len(matrices) == record.shape[dims.index("h_kv")]
        last = tuple(n - 1 for n in record.shape)  # the cursor reaches the last cell and back
        place = matrix_cell(record, last)
        assert place is not None and tensor_index(record, *place) == last


@pytest.mark.parametrize("name", ["bert", "roberta", "distilbert"])
def test_a_post_norm_encoders_first_title_says_where_its_input_comes_from(name: str) -> None:
    """TRIAL2 #4: "Where layer 0's input comes from: layer 0's input" said nothing. With no
    layer norm before attention, layer 0 reads the embeddings' sum through the embeddings'
    own LayerNorm (read off the model), a later layer the residual stream after the blocks
    before it."""
    first = hf_trace(name, 0).stages[0]
    assert first.title == ("Where layer 0's input comes from: the embeddings' sum through "
                           "embeddings.LayerNorm"), first.title
    later = hf_trace(name, 1).stages[0]
    assert later.title == "Where layer 1's input comes from: the residual stream after 1 block"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_json_transcript_of_each_family_finishes(name: str) -> None:
    """The JSON transcript parses, holds every stage, and says encoder or not."""
    import json

    from mha_tui.write.dump import to_json

    trace = hf_trace(name, _layer(name))
    document = json.loads(to_json(trace))
    assert [stage["id"] for stage in document["stages"]] == [s.id for s in trace.stages]
    assert document["config"]["model"]["encoder"] is FAMILIES[name].encoder


@pytest.mark.parametrize("layer", [0, 1])
def test_t5s_relative_bias_is_its_own_and_its_scale_of_1_is_said(layer: int) -> None:
    """T5's encoder: the bias shown is T5's own compute_bias (its buckets, its learned table),
    computed in layer 0 and handed to layer 1 (said); the scores are multiplied by 1."""
    trace = hf_trace("t5", layer)
    stage = trace.stage("pos_bias")
    assert stage.title == "Relative position bias: a number per head and distance"
    bias = next(r for r in stage.tensors if r.name == "position_bias")
    model, ids, _, _ = own_run("t5")
    with torch.no_grad():
        own = model.encoder.block[0].layer[0].SelfAttention.compute_bias(len(ids), len(ids))
    assert torch.equal(torch.from_numpy(bias.values), own)
    assert all(check.ok is not False for check in stage.checks)
    assert any("depends only on the distance" in check.label for check in stage.checks)
    assert ("does not compute the bias: it arrives as its forward's argument `position_bias`"
            in stage.note) is (layer == 1)
    scale = trace.stage("scale")
    assert scale.title.startswith("Not scaled: the factor is 1") and "No 1/sqrt(d_h)" in scale.note


@pytest.mark.parametrize("name", ["bert", "t5"])
async def test_an_encoder_steps_through_the_app(name: str) -> None:
    """Every stage of both layers of an encoder draws in the app (T5's nested attention, its
    pos_bias stage handed from layer 0 to layer 1)."""
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.stage_view import StageView

    session = Session(hf.load(str(family_dir(name))), SENTENCE)
    app = ExplainApp(session.config(0), loader=lambda config: session.trace(0), layers=session)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.trace is None:
            await pilot.pause(0.05)
        for layer in (0, 1):
            assert app.config.model.layer == layer
            for index in range(len(app.trace.stages)):
                app.stage_index = index
                await pilot.pause()
                assert app.trace.stages[index].title in app.query_one(StageView).plain
            await pilot.press("right_square_bracket")
            await pilot.pause()
        assert app.config.model.layer == 1 and app.config.model.encoder


def test_an_encoder_says_so_on_screen_and_in_transcripts() -> None:
    """The header of an encoder's transcript (and app) says so; a decoder's does not."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import to_text

    for name in ("bert", "t5", "llama"):
        text = to_text(hf_trace(name, 0), RenderOptions(), width=120)
        header = text.split("\n\n", 1)[0]
        said = "encoder: every token sees every token" in header
        assert said is FAMILIES[name].encoder, header


def test_the_class_is_chosen_from_the_config() -> None:
    """Encoder or causal LM, from config.json alone: BERT as a decoder (is_decoder) stays a
    causal LM; an encoder-decoder without a text-encoding class (BART, Marian) loads whole
    (its encoder is taken out); Whisper's encoder reads audio: refused in one line."""
    import transformers

    cases = [(transformers.BertConfig(), "AutoModelForTextEncoding", True),
             (transformers.BertConfig(is_decoder=True), "AutoModelForCausalLM", False),
             (transformers.DistilBertConfig(), "AutoModelForTextEncoding", True),
             (transformers.T5Config(), "AutoModelForTextEncoding", True),
             (transformers.GPT2Config(), "AutoModelForCausalLM", False),
             (transformers.LlamaConfig(), "AutoModelForCausalLM", False),
             # loaded whole; `load` keeps the encoder (get_encoder())
             (transformers.BartConfig(), "AutoModel", True),
             (transformers.MarianConfig(), "AutoModel", True)]
    for config, auto, encoder in cases:
        chosen, is_encoder = hf.auto_class(transformers, config)
        assert (chosen.__name__, is_encoder) == (auto, encoder), type(config).__name__
    with pytest.raises(hf.HfError, match="does not read a sentence"):
        hf.auto_class(transformers, transformers.WhisperConfig())


def test_embeddings_narrower_than_the_blocks_are_said_not_summed(tmp_path: Path) -> None:
    """OPT-350m's layout (word_embed_proj_dim 16 < hidden 32: project_in widens the token
    embeddings): the first stage says the input is not a plain sum, with no false ✗."""
    import transformers

    from .hf_models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = transformers.OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64,
                                    num_hidden_layers=1, num_attention_heads=4,
                                    word_embed_proj_dim=16, max_position_embeddings=64,
                                    bos_token_id=0, eos_token_id=0, pad_token_id=1)
    transformers.OPTForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    first = Session(hf.load(str(tmp_path)), SENTENCE).trace(0).stages[0]
    assert [c.label for c in first.checks if c.ok is False] == []
    assert any("is not a plain sum of the embeddings: model.decoder.embed_tokens gives (1, 7, 16)"
               in c.label and c.ok is None for c in first.checks)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_module_line_names_the_transformers_file(name: str) -> None:
    """The header's module line shows the attention class's file as transformers names it
    (`transformers/models/<family>/modeling_<family>.py`), on the line itself at width 100,
    never an absolute or site-packages path wrapped onto a line of its own."""
    import inspect

    import transformers
    from rich.console import Console

    from mha_tui.render.header import module_line
    from mha_tui.render.options import RenderOptions

    trace = hf_trace(name, _layer(name))
    model = own_run(name)[0]
    source = Path(inspect.getsourcefile(type(attention_of(model, FAMILIES[name]))) or "")
    expected = source.relative_to(Path(transformers.__file__).parent.parent).as_posix()
    assert expected.startswith("transformers/models/")
    console = Console(width=100, record=True, color_system=None)
    console.print(module_line(trace.module, RenderOptions()))
    assert console.export_text().splitlines() == [
        f"module {trace.module.class_name}  file {expected}"]
