"""`--hf` with `--context` (#29): layer L of an encoder-decoder's decoder (T5, BART, Marian),
its cross-attention by default and its self-attention on request, on tiny checkpoints built
offline (tests/hf_families.py SEQ2SEQ). Every number compared here comes from the model's own
class run in the test, apart from mha-tui: `output_attentions=True` (eager), and the decoder's
input written out as the models are trained (the decoder start token, then the labels but
the last)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.load import hf_seq2seq
from mha_tui.pipeline.hf_cross import CrossSession
from mha_tui.records import Trace

from .conftest import run_cli
from .hf_families import FAMILIES, SEQ2SEQ, build

SENTENCE = "The cat sat on the mat."
CONTEXT = "A cat and a dog were friends."
_ROOT: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _root(tmp_path_factory: pytest.TempPathFactory) -> None:
    _ROOT.append(tmp_path_factory.mktemp("seq2seq"))


@cache
def family_dir(name: str) -> Path:
    return build(name, _ROOT[-1] / name)


@cache
def own_run(name: str) -> tuple[list[int], list[int], object, object]:
    """(decoder ids, encoder ids, the model's outputs, the model) from the family's own class."""
    import transformers

    family = SEQ2SEQ[name]
    path = family_dir(name)
    model = getattr(transformers, family.model_class).from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    encoder_ids = list(tokenizer(CONTEXT)["input_ids"])
    labels = list(tokenizer(text_target=SENTENCE)["input_ids"])
    decoder_ids = [model.config.decoder_start_token_id, *labels[:-1]]
    with torch.no_grad():
        outputs = model(input_ids=torch.tensor([encoder_ids]),
                        decoder_input_ids=torch.tensor([decoder_ids]), output_attentions=True)
    return decoder_ids, encoder_ids, outputs, model


@cache
def traced(name: str, attention: str, layer: int) -> Trace:
    loaded = hf_seq2seq.load(str(family_dir(name)), attention)
    return CrossSession(loaded, SENTENCE, CONTEXT, one_layer=True).trace(layer)


def _stage(trace: Trace, kind: str):
    return next(stage for stage in trace.stages if stage.kind == kind)


def _weights(trace: Trace, shape: tuple[int, ...]) -> torch.Tensor:
    softmax = _stage(trace, "softmax")
    found = [t for t in softmax.tensors if t.values.shape == shape]
    assert found, [t.values.shape for t in softmax.tensors]
    return torch.from_numpy(found[-1].values)


@pytest.mark.parametrize("layer", [0, 1])
@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_cross_attention_is_the_models_own(name: str, layer: int) -> None:
    """Layer L's cross-attention: rows are the decoder's tokens, columns the context's, and
    the weights shown are the model's own cross_attentions[L], bit for bit; no causal mask
    across the two sequences, and the words say T_q x T_k."""
    decoder_ids, encoder_ids, outputs, _ = own_run(name)
    trace = traced(name, "cross", layer)
    T_q, T_k = len(decoder_ids), len(encoder_ids)
    assert T_q != T_k
    config = trace.config
    assert list(config.ids) == decoder_ids
    assert (len(config.tokens), len(config.key_tokens)) == (T_q, T_k)
    assert config.cross and config.context == CONTEXT
    own = outputs.cross_attentions[layer]  # (B, h, T_q, T_k)
    assert own.shape == (1, 4, T_q, T_k)
    assert torch.equal(_weights(trace, tuple(own.shape)), own)
    scores = _stage(trace, "scores")
    assert scores.dims_out[-2:] == ("T", "T_k")
    assert f"each of the {T_q} query tokens looks at the {T_k} context tokens" in " ".join(
        [scores.explanation, *(check.label for check in scores.checks)])
    assert not any(stage.kind == "mask" for stage in trace.stages)
    assert "No causal mask across two sequences" in _stage(trace, "softmax").explanation
    assert not [c.label for s in trace.stages for c in s.checks if c.ok is False]
    first = trace.stages[0]
    assert any(c.ok and "encoder's output on the context" in c.label for c in first.checks)
    encoded = next(t for t in first.tensors if t.name == "encoder(context_ids)")
    assert torch.equal(torch.from_numpy(encoded.values), outputs.encoder_last_hidden_state)


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_the_decoders_self_attention_on_request(name: str) -> None:
    """attention="self": the same layer's self-attention, causal, equal to the model's own
    decoder_attentions[L]; its keys are the decoder's own tokens."""
    decoder_ids, _, outputs, _ = own_run(name)
    trace = traced(name, "self", 1)
    T = len(decoder_ids)
    own = outputs.decoder_attentions[1]
    assert own.shape == (1, 4, T, T)
    assert torch.equal(_weights(trace, tuple(own.shape)), own)
    assert not trace.config.cross
    mask = _stage(trace, "mask")
    assert "Causal" in mask.title
    upper = own[0][:, torch.ones(T, T, dtype=torch.bool).triu(1)]
    assert (upper == 0).all()
    assert not [c.label for s in trace.stages for c in s.checks if c.ok is False]


def test_scaled_scores_keep_the_keys_axis_when_t_k_equals_d_h() -> None:
    """BART scales the scores (matmul * scaling): with 8 context tokens and d_h = 8 the scaled
    scores are (B, h, T, T_k), their columns the context's tokens, not channels d0..d7."""
    loaded = hf_seq2seq.load(str(family_dir("bart")))
    session = CrossSession(loaded, SENTENCE, "The dog sat on the mat", one_layer=True)
    assert len(session.context_ids) == loaded.info.head_dim == 8
    scale = _stage(session.trace(0), "scale")
    assert scale.dims_out == ("B", "h", "T", "T_k")
    assert scale.tensors[0].dims == ("B", "h", "T", "T_k")


def test_the_loader_finds_each_layers_two_attentions() -> None:
    for name, family in SEQ2SEQ.items():
        loaded = hf_seq2seq.load(str(family_dir(name)))
        assert loaded.attention_path(0) == family.extra["cross"]
        assert loaded.attention(1) is loaded.model.get_submodule(family.extra["cross"].replace(
            ".0.", ".1.", 1))
        assert loaded.self_name and family.attention.endswith(loaded.self_name)
        mine = hf_seq2seq.load(str(family_dir(name)), "self")
        assert mine.attention_path(1) == family.attention.replace(".0.", ".1.", 1)


# ---------------------------------------------------------------- the command line


def test_cli_cross_attention_transcript() -> None:
    done = run_cli("explain", "--hf", str(family_dir("bart")), SENTENCE, "--context", CONTEXT,
                   "--layer", "1", "--dump", "-")
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode()
    decoder_ids, encoder_ids, _, _ = own_run("bart")
    assert f"T_q={len(decoder_ids)} T_k={len(encoder_ids)} cross-attention" in text
    assert "cross_attentions[1] (its forward with output_attentions=True, eager): torch.equal = " \
           "True" in " ".join(text.split())
    assert "✗" not in text


def test_cli_self_attention_and_json() -> None:
    result = CliRunner().invoke(app, ["explain", SENTENCE, "--hf", str(family_dir("marian")),
                                      "--context", CONTEXT, "--attention", "self", "--dump", "-",
                                      "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["config"]["model"]["class"] == "MarianMTModel"
    assert "context_tokens" not in data["config"]  # the decoder's self-attention reads no context
    result = CliRunner().invoke(app, ["explain", SENTENCE, "--hf", str(family_dir("t5")),
                                      "--context", CONTEXT, "--dump", "-", "--format", "json"])
    data = json.loads(result.stdout)
    _, encoder_ids, _, _ = own_run("t5")
    assert data["config"]["context"] == CONTEXT
    assert len(data["config"]["context_tokens"]) == len(encoder_ids)


@pytest.mark.parametrize(("args", "said"), [
    (("t5", "--attention", "cross"), "--attention picks the cross- or self-attention"),
    (("gpt-neo", "--context", CONTEXT), "needs an encoder-decoder model"),
    (("bart", "--context", "  "), "--context is empty"),
    (("bart", "--context", CONTEXT, "--layer", "2"), "--layer 2 is out of range"),
])
def test_cli_refusals_are_one_line(args: tuple[str, ...], said: str) -> None:
    """In process (torch loaded once): exit 2, one line on stderr, nothing on stdout."""
    name, *rest = args
    path = family_dir(name) if name in SEQ2SEQ else build(name, _ROOT[-1] / name)
    assert name in SEQ2SEQ or name in FAMILIES
    result = CliRunner().invoke(app, ["explain", SENTENCE, "--hf", str(path), *rest,
                                      "--dump", "-"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr


@pytest.mark.parametrize("name", list(SEQ2SEQ))
@pytest.mark.parametrize("layer", [0, 1])
def test_without_context_every_encoder_decoder_shows_its_encoder(name: str, layer: int) -> None:
    """T5, BART and Marian alike: without --context, layer L of the encoder, said in one
    header line; its weights are the model's own encoder_attentions (the family's own class,
    eager), bit for bit."""
    import transformers

    from mha_tui.load.hf import load
    from mha_tui.pipeline.hf import Session

    path = family_dir(name)
    trace = Session(load(str(path), SENTENCE), SENTENCE, one_layer=True).trace(layer)
    assert trace.config.model.encoder and trace.config.model.encoder_of == name
    model = getattr(transformers, SEQ2SEQ[name].model_class).from_pretrained(
        path, attn_implementation="eager", dtype=torch.float32).eval()
    ids = transformers.AutoTokenizer.from_pretrained(path)(SENTENCE)["input_ids"]
    assert list(trace.config.model.ids) == list(ids)
    with torch.no_grad():
        own = model(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([ids[:2]]),
                    output_attentions=True).encoder_attentions[layer]  # (1, h, T, T)
    assert torch.equal(_weights(trace, tuple(own.shape)), own)
    result = CliRunner().invoke(app, ["explain", SENTENCE, "--hf", str(path), "--layer",
                                      str(layer), "--dump", "-"])
    assert result.exit_code == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert f"({name} is an encoder-decoder: this is its encoder, self-attention over the " \
           "sentence; --context SENTENCE shows its decoder's cross-attention)" in said
    assert "encoder: every token sees every token" in said and "✗" not in said


async def test_the_cross_attention_steps_through_the_app() -> None:
    """Every stage of both decoder layers draws in the app, the columns labelled with the
    context's tokens; ] moves to the next decoder layer's cross-attention."""
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.stage_view import StageView

    session = CrossSession(hf_seq2seq.load(str(family_dir("bart"))), SENTENCE, CONTEXT)
    app = ExplainApp(session.config(0), loader=lambda config: session.trace(
        config.model.layer if config.model else 0), layers=session)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.trace is None:
            await pilot.pause(0.05)
        for layer in (0, 1):
            assert app.config.model.layer == layer and app.config.cross
            for index, stage in enumerate(app.trace.stages):
                app.stage_index = index
                await pilot.pause()
                shown = app.query_one(StageView).plain
                assert stage.title in shown
                if stage.kind == "softmax":
                    assert "␣dog" in shown and "cross_attentions" in shown
            await pilot.press("right_square_bracket")
            await pilot.pause()
            while app.trace is None or app.trace.config.model.layer != min(layer + 1, 1):
                await pilot.pause(0.05)
