"""Cross-attention (issue #29, part 1): queries from one sequence, keys and values from
another. Modules written in the public projects' styles (tests/fixtures/two_sequences.py)
are called by their forward's signature, traced with T_q != T_k, and drawn with the
queries' tokens on the rows and the context's on the columns; a forward that takes one
sequence is refused in one line."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import mha_tui
from mha_tui.config import Config, ConfigError
from mha_tui.load.signature import Refused, plan
from mha_tui.notebook import text_of
from mha_tui.records import TensorRecord
from mha_tui.render.options import RenderOptions
from mha_tui.render.tensor import tensor_matrices

from .conftest import run_cli
from .fixtures import two_sequences as ts

QUERIES = ["I", "love", "AI"]
CONTEXT = ["le", "chat", "est", "sur", "tapis"]

STYLES = {
    "stable-diffusion": lambda: ts.SDCrossAttention(4, heads=2),
    "whisper": lambda: ts.WhisperAttention(4, 2),
    "annotated-transformer": lambda: ts.AnnotatedMultiHeadedAttention(2, 4),
    "bart": lambda: ts.BartStyleAttention(4, 2),
    "nn.Transformer decoder (tgt, memory)": lambda: ts.DecoderCrossAttention(4, 2),
    "nn.MultiheadAttention": lambda: nn.MultiheadAttention(4, 2, batch_first=True),
    "t5 (the context after a mask parameter)": lambda: ts.T5CrossAttention(4, 2),
}


def _inputs(T_q: int = 3, T_k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(1, T_q, 4, generator=generator),  # (B, T_q, C)
            torch.randn(1, T_k, 4, generator=generator))  # (B, T_k, C)


def _own_output(module: nn.Module, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """The module's forward as its authors call it, outside mha-tui."""
    with torch.no_grad():
        if isinstance(module, nn.MultiheadAttention):
            fastpath = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)  # as traced: its slow path
            try:
                return module(x, context, context)[0]
            finally:
                torch.backends.mha.set_fastpath_enabled(fastpath)
        if isinstance(module, ts.AnnotatedMultiHeadedAttention):
            return module(x, context, context)
        if isinstance(module, ts.DecoderCrossAttention):
            return module(x, context)
        if isinstance(module, ts.WhisperAttention):
            return module(x, xa=context)
        if isinstance(module, ts.T5CrossAttention):
            return module(x, key_value_states=context)
        if isinstance(module, ts.BartStyleAttention):
            return module(x, key_value_states=context)[0]
        return module(x, context=context)


@pytest.mark.parametrize("style", STYLES)
def test_each_public_style_is_traced_with_queries_and_keys_of_their_own(style: str) -> None:
    torch.manual_seed(0)
    module = STYLES[style]().eval()
    x, context = _inputs()
    trace = mha_tui.trace(module, x, QUERIES, context=context, context_tokens=CONTEXT)
    assert not trace.failed, trace.raised
    softmax = trace.stage("softmax")
    weights = softmax.tensors[-1]
    assert weights.values.shape[-2:] == (3, 5)
    assert weights.dims[-2:] == ("T", "T_k")
    assert softmax.dims_out[-1] == "T_k"
    np.testing.assert_allclose(weights.values.sum(-1), 1.0, atol=1e-5)
    # the recorded output is what the authors' own call returns
    out = trace.recording.snapshot(trace.recording.output).values
    np.testing.assert_array_equal(out.reshape(-1), _own_output(module, x, context).numpy().reshape(-1))
    assert "3 query tokens looks at the 5 context tokens" in " ".join(
        c.label for c in trace.stage("scores").checks)


@pytest.mark.parametrize("style", ["stable-diffusion", "annotated-transformer", "whisper"])
def test_the_rows_are_the_query_tokens_and_the_columns_the_context_tokens(style: str) -> None:
    module = STYLES[style]().eval()
    x, context = _inputs()
    trace = mha_tui.trace(module, x, QUERIES, context=context, context_tokens=CONTEXT)
    weights = trace.stage("softmax").tensors[-1]
    matrix = tensor_matrices(weights, trace.config, RenderOptions())[0]
    assert matrix.rows.labels == QUERIES
    assert matrix.cols.labels == CONTEXT
    keys = next(t for t in trace.stage("project").tensors if t.dims == ("B", "T_k", "C"))
    assert tensor_matrices(keys, trace.config, RenderOptions())[0].rows.labels == CONTEXT
    text = text_of(trace)
    assert "T_q=3 T_k=5" in text and "cross-attention" in text
    # every T axis named as the header names it: the queries' T_q, the keys' T_k
    assert "(B, h, T_q, T_k)" in text and "dims (B, T_q, C)" in text
    axes = [line for line in text.splitlines() if line.startswith("shape ") or "  dims (" in line]
    assert axes and not [line for line in axes if re.search(r"[(, ]T[,)]", line.split("shape", 1)[1])]


def test_a_decode_step_sized_matrix_is_drawn_by_position_not_refused() -> None:
    """One query against five keys (a decode step): the axis whose length is not the
    tokens' count is labelled by position instead of raising IndexError."""
    config = Config("a b c d e")
    record = TensorRecord(name="w", dims=("B", "h", "T", "T"), values=np.full((1, 2, 1, 5), 0.2),
                          strides=(10, 5, 5, 1), contiguous=True, kind="prob")
    matrix = tensor_matrices(record, config, RenderOptions())[0]
    assert matrix.rows.labels == ["t0"]
    assert matrix.cols.labels == list("abcde")


def test_keys_from_the_query_sequence_show_on_the_query_axis() -> None:
    """The classic bug with T_q == T_k (no shape error to give it away): the keys' rows are
    the sentence's tokens, the values' the context's."""
    module = ts.KeysFromQuery(4, 2).eval()
    x, context = _inputs(3, 3)
    trace = mha_tui.trace(module, x, QUERIES, context=context, context_tokens=CONTEXT[:3])
    dims = {t.name: t.dims for t in trace.stage("project").tensors if t.name in ("k", "v")}
    assert dims == {"k": ("B", "T", "C"), "v": ("B", "T_k", "C")} or \
        [t.dims for t in trace.stage("project").tensors][-3:] == [("B", "T", "C"), ("B", "T", "C"),
                                                                  ("B", "T_k", "C")]


def test_keys_from_the_query_sequence_with_other_lengths_fail_at_their_line() -> None:
    module = ts.KeysFromQuery(4, 2).eval()
    x, context = _inputs()
    trace = mha_tui.trace(module, x, QUERIES, context=context)
    assert trace.failed and "two_sequences.py" in trace.raised
    assert trace.stage("scores").tensors[-1].values.shape[-2:] == (3, 3)  # (T_q, T_q): not T_k


@pytest.mark.parametrize(("module", "parameter"), [
    (ts.SDCrossAttention(4), "context"), (ts.WhisperAttention(4, 2), "xa"),
    (ts.BartStyleAttention(4, 2), "key_value_states"), (ts.DecoderCrossAttention(4, 2), "memory"),
    (ts.AnnotatedMultiHeadedAttention(2, 4), "key and value"),
    (nn.MultiheadAttention(4, 2, batch_first=True), "key and value")])
def test_the_context_goes_to_the_parameter_public_code_names(module: nn.Module, parameter: str) -> None:
    call = plan(module.forward, type(module).__name__, causal=True, context=True)
    assert call.context_parameter == parameter
    assert ("mask", "mask") not in call.kwargs or parameter == "mask"  # no causal mask across


def test_a_context_after_a_mask_parameter_goes_by_its_name_not_into_the_mask() -> None:
    """T5's forward(hidden_states, mask=None, key_value_states=None): the context is not the
    second positional argument (that is the mask)."""
    call = plan(ts.T5CrossAttention(4, 2).forward, "T5CrossAttention.forward", causal=True,
                context=True)
    assert call.args == ("x",) and ("key_value_states", "context") in call.kwargs


def test_a_forward_of_one_sequence_is_refused_in_one_line() -> None:
    with pytest.raises(Refused) as refused:
        plan(ts.SelfOnly(4, 2).forward, "SelfOnly.forward", causal=True, context=True)
    message = str(refused.value)
    assert "\n" not in message and "SelfOnly.forward(x) takes one sequence" in message


def test_the_context_joins_the_vocabulary_after_the_sentence() -> None:
    config = Config("I love AI !", context="le chat est sur le tapis")
    assert config.key_tokens == ("le", "chat", "est", "sur", "le", "tapis")
    assert config.vocab[:4] == ("I", "love", "AI", "!") and config.vocab[4:] == (
        "le", "chat", "est", "sur", "tapis")
    assert config.context_ids == (4, 5, 6, 7, 4, 8)
    with pytest.raises(ConfigError, match="--context is empty"):
        Config("I love AI !", context="   ")


def test_explain_context_from_the_command_line(tmp_path) -> None:
    result = run_cli("explain", "I love AI !", "--context", "le chat est sur le tapis", "--dump", "-")
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "T_q=4 T_k=6" in text and "context le chat est sur le tapis" in text
    assert "tapis" in text.split("Raw attention scores", 1)[1]
    assert "each of the 4 query tokens looks at the 6 context tokens" in text
    assert "✓ context[0, t] is row context_ids[t] of the embedding table for all 6 context tokens" in text
    out = tmp_path / "t.json"
    result = run_cli("explain", "I love AI !", "--context", "le chat est sur le tapis", "--dump", str(out))
    assert result.returncode == 0, result.stderr.decode()
    written = json.loads(out.read_text())
    assert written["config"]["context_tokens"] == ["le", "chat", "est", "sur", "le", "tapis"]
    # the flag asked for is still true; what the module did is the header's word
    assert written["config"]["causal"] is True and written["masking"] == "no mask"
    # the axes named as the text names them: the queries' T_q beside the keys' T_k
    softmax = next(stage for stage in written["stages"] if stage["kind"] == "softmax")
    assert softmax["dims_out"] == ["B", "h", "T_q", "T_k"]
    assert [t["dims"] for t in softmax["tensors"].values()] == [["B", "h", "T_q", "T_k"]]
    why = run_cli("explain", "I love AI !", "--context", "le chat est sur le tapis", "--dump", "-",
                  "--why", "softmax[0, 0, 1, 5]")
    assert why.returncode == 0, why.stderr.decode()
    assert "key tapis (column 5)" in why.stdout.decode()


def test_explain_context_refuses_a_module_of_one_sequence_in_one_line(tmp_path) -> None:
    result = run_cli("explain", "I love AI !", "--context", "le chat", "--model", "mygpt",
                     "--dump", str(tmp_path / "t.txt"))
    assert result.returncode == 2
    err = result.stderr.decode().strip()
    assert "takes one sequence" in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "t.txt").exists()


# ---------------------------------------------------------------- check --context

CHECKED = {
    "stable-diffusion": (lambda: ts.SDCrossAttention(4), 2),
    "whisper": (lambda: ts.WhisperAttention(4, 2), None),
    "annotated-transformer": (lambda: ts.AnnotatedMultiHeadedAttention(2, 4), None),
    "bart": (lambda: ts.BartStyleAttention(4, 2), None),
    "nn.MultiheadAttention": (lambda: nn.MultiheadAttention(4, 2, batch_first=True), None),
    "nn.Transformer decoder (tgt, memory)": (lambda: ts.DecoderCrossAttention(4, 2), None),
    "torch's module wrapped, no head count of its own": (lambda: ts.LatentCrossAttention(4, 2),
                                                         None),
}


@pytest.mark.parametrize("style", CHECKED)
def test_a_right_cross_attention_is_equivalent_to_the_cross_reference(style: str) -> None:
    make, heads = CHECKED[style]
    x, context = _inputs()
    checked = mha_tui.check(make().eval(), x, context=context, heads=heads)
    assert checked.equivalent, checked.verdict.diagnosis
    assert "keys and values from the context" in checked.verdict.end_to_end.checked


@pytest.mark.parametrize(("cls", "role", "line"), [
    (ts.KeysFromQuery, "keys", "k = self.heads(self.W_k(x))"),
    (ts.ValuesFromQuery, "values", "v = self.heads(self.W_v(x))")])
@pytest.mark.parametrize("T_k", [3, 5])  # T_k == T_q: nothing else tells; T_k != T_q: it crashes later
def test_keys_or_values_from_the_query_sequence_are_named_at_their_line(cls, role: str, line: str,
                                                                        T_k: int) -> None:
    x, context = _inputs(3, T_k)
    checked = mha_tui.check(cls(4, 2).eval(), x, context=context)
    diagnosis = checked.verdict.diagnosis
    assert not checked.equivalent and diagnosis is not None
    assert diagnosis.kind == "wrong_sequence"
    assert f"the {role} are made from the query sequence" in diagnosis.message
    with open(diagnosis.file) as source:
        assert line in source.read().splitlines()[diagnosis.line - 1]


@pytest.mark.parametrize(("cls", "role", "argument"), [
    (ts.MemoryKeysFromTgt, "keys", "key"), (ts.MemoryValuesFromTgt, "values", "value")])
@pytest.mark.parametrize("T_k", [3, 5])  # T_k != T_q: torch's module fails before any op
def test_torch_attention_given_the_query_sequence_is_named_at_the_call(cls, role: str,
                                                                       argument: str,
                                                                       T_k: int) -> None:
    """nn.MultiheadAttention called with its key or value from the query sequence: wrong at
    the learner's call, read from the arguments torch's module got (with T_k != T_q its
    forward fails on key and value of other lengths before any projection runs)."""
    x, context = _inputs(3, T_k)
    checked = mha_tui.check(cls(4, 2).eval(), x, context=context)
    diagnosis = checked.verdict.diagnosis
    assert not checked.equivalent and diagnosis is not None
    assert diagnosis.kind == "wrong_sequence", diagnosis.message
    assert f"the {role} are made from the query sequence (tgt)" in diagnosis.message
    assert f"nn.MultiheadAttention's {argument} is the context" in diagnosis.message
    with open(diagnosis.file) as source:
        assert "# BUG" in source.read().splitlines()[diagnosis.line - 1]


def test_check_context_from_the_command_line() -> None:
    good = run_cli("check", "--model", "cross", "--context", "le chat est sur le tapis")
    assert good.returncode == 0, good.stdout.decode() + good.stderr.decode()
    bad = run_cli("check", "tests/fixtures/two_sequences.py:KeysFromQuery", "--init", "embed_dim=4",
                  "--context", "le chat est sur le tapis")
    assert bad.returncode == 1
    assert "[wrong_sequence] the keys are made from the query" in " ".join(bad.stdout.decode().split())


# ---------------------------------------------------------------- padded batches (--batch)

PADDED = "tests/fixtures/two_sequences.py:{}"


def _padded_trace(cls: str, causal: bool = False):
    from mha_tui.config import Source
    from mha_tui.pipeline import run_trace

    return run_trace(Config("I love AI !", batch=("the cat",), causal=causal),
                     Source(module=PADDED.format(cls)))


def test_a_batch_is_padded_to_its_longest_row() -> None:
    config = Config("I", batch=("the cat sat", "a dog"))
    assert config.rows == (("I", "<pad>", "<pad>"), ("the", "cat", "sat"), ("a", "dog", "<pad>"))
    assert config.padding == ((False, True, True), (False, False, False), (False, False, True))
    pad = config.vocab.index("<pad>")
    assert config.batch_ids[0][1:] == (pad, pad)
    with pytest.raises(ConfigError, match="padding token"):
        Config("I <pad>", batch=("a",))


@pytest.mark.parametrize(("cls", "parameter", "given"), [
    (ts.HFPaddedAttention, "attention_mask", [[1, 1, 1, 1], [1, 1, 0, 0]]),
    (ts.KeyPaddingAttention, "key_padding_mask", [[False] * 4, [False, False, True, True]]),
    (ts.FairseqEncoderAttention, "encoder_padding_mask", [[False] * 4, [False, False, True, True]])])
def test_the_padding_mask_goes_to_the_modules_own_parameter(cls, parameter: str, given) -> None:
    from mha_tui.load.modules import forward_inputs

    module = cls(4, 2)
    padding = torch.tensor(Config("I love AI !", batch=("the cat",)).padding)
    _, kwargs = forward_inputs(module, torch.zeros(2, 4, 4), causal=False, padding=padding)
    assert kwargs[parameter].tolist() == given


def test_a_mask_parameter_gets_the_padding_and_the_causal_mask_combined() -> None:
    from mha_tui.config import Source
    from mha_tui.examples.course import MultiHeadAttention  # forward(x, mask)
    from mha_tui.load.modules import forward_inputs
    from mha_tui.pipeline import run_trace

    padding = torch.tensor(Config("I love AI !", batch=("the cat",)).padding)
    _, kwargs = forward_inputs(MultiHeadAttention(4, 2), torch.zeros(2, 4, 4), causal=True,
                               padding=padding)
    mask = kwargs["mask"]
    assert mask.shape == (2, 1, 4, 4)
    assert mask[1, 0, 0].tolist() == [False, True, True, True]  # causal and padded keys
    assert mask[0, 0, 3].tolist() == [False] * 4  # row 0: nothing padded, the last token sees all
    trace = run_trace(Config("I love AI !", batch=("the cat",)), Source(model="course"))
    assert "the 2 padded keys of row 1 (2, 3) are blocked for every query" in trace.stage("mask").explanation


@pytest.mark.parametrize("cls", ["HFPaddedAttention", "KeyPaddingAttention"])
def test_padding_in_each_convention_is_said_row_by_row(cls: str) -> None:
    trace = _padded_trace(cls)
    mask = trace.stage("mask")
    assert "the 2 padded keys of row 1 (2, 3) are blocked for every query" in mask.explanation
    assert any(c.label == "row 1: padded keys 2, 3 blocked for every query" and c.ok for c in mask.checks)
    assert "Padded queries (row 1's queries 2, 3)" in trace.stage("softmax").explanation
    # the weights of row 1 give the padded keys nothing, computed by the module
    weights = trace.stage("softmax").tensors[-1].values
    assert np.all(weights[1, :, :, 2:] == 0.0) and not np.all(weights[0, :, :, 2:] == 0.0)


def test_padding_on_the_query_axis_is_said_as_such() -> None:
    mask = _padded_trace("PaddingOnQueries").stage("mask")
    assert "blocked as queries (whole rows), not as keys" in mask.explanation
    assert any(c.label.startswith("row 1: padded keys") and c.ok is False for c in mask.checks)


def test_an_inverted_padding_mask_is_said_as_such() -> None:
    mask = _padded_trace("PaddingInverted").stage("mask")
    assert "Row 0 has no padding, yet its keys 0, 1, 2, 3 are blocked for every query" in mask.explanation
    assert "row 1's padded keys 2, 3 are NOT blocked" in mask.explanation


def test_the_transcript_draws_every_batch_row_with_its_tokens() -> None:
    result = run_cli("explain", "I love AI !", "--batch", "the cat", "--model", "course", "--dump", "-")
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "B=2 T=4" in text and "batch the cat" in text
    assert "batch row 1  the cat <pad> <pad>" in text
    assert "scores[1, 0]" in text


def test_batch_refuses_a_module_without_a_padding_parameter(tmp_path) -> None:
    result = run_cli("explain", "I love AI !", "--batch", "the cat", "--dump", str(tmp_path / "t.txt"))
    assert result.returncode == 2
    err = result.stderr.decode().strip()
    assert "has no parameter for a padding mask" in err and "\n" not in err
    assert not (tmp_path / "t.txt").exists()


def _check_padded(cls: str, causal: bool = False):
    from mha_tui.config import Source
    from mha_tui.pipeline import check_source

    return check_source(Config("I love AI !", batch=("the cat",), causal=causal),
                        Source(module=PADDED.format(cls), init=(("embed_dim", 4),)))


@pytest.mark.parametrize("cls", ["HFPaddedAttention", "KeyPaddingAttention", "SDPAPaddedAttention",
                                 "TorchKeyPadding", "SeqFirstKeyPadding", "FairseqEncoderAttention"])
def test_a_right_padding_mask_is_equivalent(cls: str) -> None:
    verdict = _check_padded(cls)
    assert verdict.equivalent, verdict.diagnosis
    assert any(v.kind == "mask" and v.ok and "padded keys" in v.checked for v in verdict.stages)
    # no causal mask was asked for: no row says one was checked
    assert not [v.checked for v in verdict.stages if "causal" in v.checked]


@pytest.mark.parametrize("cls", ["PaddingOnQueriesAndKeys", "SDPAPaddingBothAxes"])
def test_a_mask_blocking_the_padded_queries_too_is_equivalent(cls: str) -> None:
    """mask[:, None, None, :] * mask[:, None, :, None] (DeBERTa's way): the padded queries'
    rows are blocked too; nothing a real token sees changes, so it is equivalent, and said
    (also inside F.scaled_dot_product_attention, which gives those rows 0)."""
    verdict = _check_padded(cls)
    assert verdict.equivalent, verdict.diagnosis
    mask = next(v for v in verdict.stages if v.kind == "mask")
    assert mask.ok and "blocks the padded queries' rows too" in mask.checked
    assert "padded positions' own rows are not compared" in verdict.end_to_end.checked


def test_padded_queries_rows_of_minus_inf_are_named_for_their_nan() -> None:
    """Blocking a padded query's whole row with -inf makes it NaN, which the next layer's
    0 * NaN carries to the real tokens: named at the mask's line, its row said by batch row
    and head (the scores are (B, h, T, T): row 1's padding, not "head 2")."""
    verdict = _check_padded("PaddingRowsOfMinusInf")
    assert not verdict.equivalent and verdict.diagnosis.kind == "padding_nan"
    assert "row 2 of head 0 in batch row 1 is fully masked" in verdict.diagnosis.message
    with open(verdict.diagnosis.file) as source:
        assert 'float("-inf"))' in source.read().splitlines()[verdict.diagnosis.line - 1]


def test_a_real_key_blocked_is_named_with_its_entry() -> None:
    verdict = _check_padded("PaddingBlocksARealKey")
    assert not verdict.equivalent and verdict.diagnosis.kind == "padding_wrong"
    assert "batch row 0, head 0, query 0 has key 0 (a token) blocked" in verdict.diagnosis.message
    with open(verdict.diagnosis.file) as source:
        assert "keep[:, None, None, :] == 0" in source.read().splitlines()[verdict.diagnosis.line - 1]
    assert "not compared" not in verdict.end_to_end.checked


@pytest.mark.parametrize(("cls", "kind", "line"), [
    ("PaddingOnQueries", "padding_on_queries", "key_padding_mask[:, None, :, None]"),
    ("PaddingInverted", "padding_inverted", "attn_weights = attn_weights + extended"),
    ("SDPAPaddingOnQueries", "padding_on_queries", "attention_mask[:, None, :, None].bool()"),
    ("SDPAPaddingInverted", "padding_inverted", "attention_mask[:, None, None, :] == 0")])
def test_the_classic_padding_bugs_are_named_at_their_line(cls: str, kind: str, line: str) -> None:
    verdict = _check_padded(cls)
    assert not verdict.equivalent and verdict.diagnosis is not None
    assert verdict.diagnosis.kind == kind
    with open(verdict.diagnosis.file) as source:
        assert line in source.read().splitlines()[verdict.diagnosis.line - 1]


@pytest.mark.parametrize("cls", ["SDPAPaddedAttention", "FairseqEncoderAttention"])
def test_a_padding_mask_inside_the_fused_op_is_titled_padding_not_causal(cls: str) -> None:
    """The expansion of F.scaled_dot_product_attention names what its attn_mask blocks: the
    padded keys, not a causal mask it does not have."""
    from mha_tui.config import Source
    from mha_tui.pipeline import run_trace

    trace = run_trace(Config("I love AI !", batch=("the cat",), causal=False),
                      Source(module=PADDED.format(cls), init=(("embed_dim", 4),)))
    mask = trace.stage("mask")
    assert mask.title.startswith("Padding: keys blocked for every query (row 0: none; row 1: 2, 3)")
    assert "earlier tokens" not in mask.explanation and "Causal" not in mask.title


@pytest.mark.parametrize("cls", ["KeyPaddingAttention", "SDPAPaddedAttention"])
def test_why_on_a_padded_row_names_its_own_tokens_and_the_padding(cls: str) -> None:
    """Row 1 ("the cat <pad> <pad>") is labelled with its own tokens, not row 0's, and a
    blocked padded key is said as padding, not as a causal mask (there is none)."""
    from mha_tui.config import Source
    from mha_tui.pipeline import run_trace
    from mha_tui.why import why

    trace = run_trace(Config("I love AI !", batch=("the cat",), causal=False),
                      Source(module=PADDED.format(cls), init=(("embed_dim", 4),)))
    blocked = why(trace, "mask", (1, 0, 1, 2))
    assert blocked.where == "head 0, query cat (row 1), key <pad> (column 2)"
    assert any("is padding in batch row 1" in note for note in blocked.notes)
    assert not any("causal mask hides the future" in note for note in blocked.notes)
    assert why(trace, "softmax", (0, 0, 1, 2)).where == "head 0, query love (row 1), key AI (column 2)"
    if cls == "KeyPaddingAttention":  # key_padding_mask[:, None, None, :]: its entry [1, 0, 0, 2]
        assert blocked.terms[1].label.startswith("mask[1, 0, 0, 2] = True")


def test_check_batch_with_the_causal_mask_combined_from_the_command_line() -> None:
    result = run_cli("check", "--model", "course", "--batch", "the cat")
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert "blocks the causal entries and each row's padded keys" in " ".join(result.stdout.decode().split())


async def test_the_app_moves_between_batch_rows_with_r() -> None:
    """r draws the next batch row: its own tokens and its own numbers (scores[1, h])."""
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.stage_view import StageView
    from mha_tui.config import Source
    from mha_tui.pipeline import run_trace

    trace = run_trace(Config("I love AI !", batch=("the cat",)), Source(model="course"))
    app = ExplainApp(trace.config, trace=trace, start="mask")
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        shown = app.query_one(StageView).plain
        assert "scores[0, 0]" in shown and "scores[1, 0]" not in shown
        await pilot.press("r")
        await pilot.pause()
        assert app.view.row == 1
        shown = app.query_one(StageView).plain
        assert "scores[1, 0]" in shown and "<pad>" in shown
        await pilot.press("r")
        assert app.view.row == 0


async def test_the_row_key_is_hidden_without_a_batch() -> None:
    from .test_app import make_app

    app = make_app()
    async with app.run_test(size=(100, 32)):
        assert app.check_action("batch_row", (1,)) is False


# ---------------------------------------------------------------- one decode step (Python API)


def test_one_decode_step_against_a_cache_is_traced_and_drawn() -> None:
    """Raschka's style (the cache kept in the module, use_cache, reset_cache): after a
    prefill of 4 tokens, the 5th token's step is traced; its (1, 5) scores are drawn with the
    new token on the row and the cache's positions on the columns, and its output equals row
    4 of the full, uncached forward."""
    from .fixtures.kv_caches import CachedMultiHeadAttention

    torch.manual_seed(0)
    module = CachedMultiHeadAttention(4, 4, 16, 2).eval()
    x = torch.randn(1, 5, 4)
    with torch.no_grad():
        full = module(x)  # (1, 5, 4), no cache
        module.reset_cache()
        module(x[:, :4], use_cache=True)  # prefill
    trace = mha_tui.trace(module, x[:, 4:], ["sat"], call=lambda m, inp: m(inp, use_cache=True))
    assert not trace.failed, trace.raised
    step = trace.recording.snapshot(trace.recording.output).values  # (1, 1, 4)
    np.testing.assert_allclose(step[0, 0], full[0, 4].numpy(), atol=1e-6)
    scores = trace.stage("scores")
    assert scores.dims_out == ("B", "h", "T", "T_k") and scores.tensors[-1].values.shape == (1, 2, 1, 5)
    assert "1 new query looks at 5 keys, 4 from the cache and 1 just made" in scores.explanation
    per_token = 2 * module.d_out * torch.finfo(torch.float32).bits // 8  # K and V, d_out floats each
    assert any(f"= {5 * per_token} bytes, {per_token} bytes per token" in c.label
               for c in scores.checks)
    matrix = tensor_matrices(trace.stage("softmax").tensors[-1], trace.config, RenderOptions())[0]
    assert matrix.rows.labels == ["sat"] and matrix.cols.labels == [f"t{i}" for i in range(5)]
    text_of(trace)  # every stage draws


# ---------------------------------------------------------------- grading a class with them

_TORCH_CROSS = '''from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model, nhead):
        super().__init__()
        self.nhead = nhead
        self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)

    def forward(self, x, context):
        out, _ = self.attn(x, context, context, need_weights=False)
        return out
'''

_PADDED = '''import math

from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model, nhead):
        super().__init__()
        self.nhead = nhead
        self.W_q = nn.Linear(d_model, d_model, bias=False)
        self.W_k = nn.Linear(d_model, d_model, bias=False)
        self.W_v = nn.Linear(d_model, d_model, bias=False)
        self.W_o = nn.Linear(d_model, d_model)

    def heads(self, t):
        B, T, C = t.shape
        return t.view(B, T, self.nhead, C // self.nhead).transpose(1, 2)  # (B, h, T, d_h)

    def forward(self, x, key_padding_mask=None):
        q, k, v = self.heads(self.W_q(x)), self.heads(self.W_k(x)), self.heads(self.W_v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, T)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        weights = scores.softmax(dim=-1)
        return self.W_o((weights @ v).transpose(1, 2).reshape(x.shape))
'''


def _graded(folder, *options: str) -> dict[str, dict]:
    result = run_cli("check", str(folder), "--class", "Attention", "--init", "d_model=4",
                     "--init", "nhead=2", *options, "--format", "json", "--sandbox", "off",
                     timeout=300)
    assert result.returncode == 1, result.stderr.decode()  # the worst verdict: NOT equivalent
    return {report["module"].rpartition("/")[2].split(".py")[0]: report
            for report in json.loads(result.stdout)}


def test_grading_a_class_with_context_judges_each_submission_across_two_sequences(tmp_path) -> None:
    """`check FOLDER --class Attention --context ...`: the option reaches every submission's
    judgement (each in its worker, through the Request): the right one is equivalent, keys
    from the query sequence are named at the learner's line."""
    (tmp_path / "right.py").write_text(_TORCH_CROSS)
    wrong = _TORCH_CROSS.replace("self.attn(x, context, context,", "self.attn(x, x, context,")
    (tmp_path / "keys_from_x.py").write_text(wrong)
    graded = _graded(tmp_path, "--context", "le chat est sur le tapis")
    assert graded["right"]["verdict"] == "equivalent"
    assert "keys and values from the context" in json.dumps(graded["right"])
    diagnosis = graded["keys_from_x"]["diagnosis"]
    assert diagnosis["kind"] == "wrong_sequence"
    assert diagnosis["line"] == wrong.splitlines().index(
        "        out, _ = self.attn(x, x, context, need_weights=False)") + 1


def test_grading_a_class_with_batch_names_each_padding_bug(tmp_path) -> None:
    """`check FOLDER --class Attention --batch ...`: the right padding mask is equivalent; one
    on the query axis and an inverted one are named, each at its line."""
    (tmp_path / "right.py").write_text(_PADDED)
    on_queries = _PADDED.replace("key_padding_mask[:, None, None, :]",
                                 "key_padding_mask[:, None, :, None]")
    (tmp_path / "on_queries.py").write_text(on_queries)
    inverted = _PADDED.replace("masked_fill(key_padding_mask[", "masked_fill(~key_padding_mask[")
    (tmp_path / "inverted.py").write_text(inverted)
    graded = _graded(tmp_path, "--batch", "the cat", "--no-causal")
    assert graded["right"]["verdict"] == "equivalent"
    line = on_queries.splitlines().index(
        "            scores = scores.masked_fill(key_padding_mask[:, None, :, None], "
        "float(\"-inf\"))") + 1
    assert graded["on_queries"]["diagnosis"]["kind"] == "padding_on_queries"
    assert graded["on_queries"]["diagnosis"]["line"] == line
    assert graded["inverted"]["diagnosis"]["kind"] == "padding_inverted"
    assert graded["inverted"]["diagnosis"]["line"] == line


# ---------------------------------------------------------------- the quiz on two sequences


def test_the_quiz_asks_about_context_tokens_in_cross_attention() -> None:
    """The keys are the context's tokens: the score asked about names its key from the
    context, and "which token does the query weigh most" is answered with a context token
    (typed as its word, read against the context's tokens, not the sentence's)."""
    from mha_tui.config import Source
    from mha_tui.pipeline import run_trace
    from mha_tui.quiz import Quiz
    from mha_tui.write.dump import worksheet_json

    trace = run_trace(Config("I love AI !", context="le chat est sur le tapis"),
                      Source(model="cross"))
    quiz = Quiz.of(trace)
    score = next(q for q in quiz.questions if q.stage == "scores")
    assert "against key le·0 (column 0)" in score.text  # "le" occurs twice in the context
    top = next(q for q in quiz.questions if q.asks == "most_attended")
    assert top.answer == "key" and "context token" in top.text and "context" in top.how
    position = top.expected[0]
    word = trace.config.key_tokens[position]
    assert top.shown.startswith(word)
    while quiz.current is not top:  # answer the others with their keys
        quiz, _ = quiz.answer(quiz.current.shown.split(" (")[0])
    typed = word if trace.config.key_tokens.count(word) == 1 else f"{word}·{position}"
    _, marked = quiz.answer(typed)
    assert marked.outcome == "right", marked.message
    number = quiz.questions.index(top) + 1
    answers = json.loads(worksheet_json(trace, quiz.questions))["answers"]
    assert answers[number - 1]["tokens"] == [word]


def test_the_quiz_asks_about_padded_keys_and_real_queries_in_a_padded_batch() -> None:
    """--batch: the mask's question counts the padded row's padded keys (blocked for every
    query); the score and the weights are asked of row 0's last real token, not of a pad."""
    from mha_tui.config import Source
    from mha_tui.pipeline import run_trace
    from mha_tui.quiz import questions

    trace = run_trace(Config("I love", batch=("the cat sat on",), causal=False),
                      Source(module=PADDED.format("KeyPaddingAttention")))
    asked = questions(trace)
    assert trace.config.padding[0] == (False, False, True, True)  # row 0 is the padded one
    keys = next(q for q in asked if q.asks == "padded_keys")
    assert keys.expected == 2 and "2 (<pad>), 3 (<pad>)" in keys.source
    assert "Batch row 0" in keys.text
    for question in asked:
        if question.asks in ("value", "row_sum", "most_attended"):
            assert "(row 1)" in question.text or "row 1 of" in question.text, question.text
    assert "of batch row 0" in next(q for q in asked if q.asks == "blocked").text
    assert not any(q.asks == "head_role" for q in asked)  # pad queries would skew it


# ---------------------------------------------------------------- baddbmm's ignored input


class _EmptyHoldsNaN(ts.DiffusersAttention):
    """diffusers' scores with the bytes torch.empty may hand back: NaN and a huge negative
    number (torch ignores the input when beta = 0)."""

    def get_attention_scores(self, query, key, attention_mask=None):
        baddbmm_input = torch.full((query.shape[0], query.shape[1], key.shape[1]), float("nan"))
        baddbmm_input[..., 0] = -3.0e38
        attention_scores = torch.baddbmm(
            baddbmm_input, query, key.transpose(-1, -2), beta=0, alpha=self.scale
        )
        return attention_scores.softmax(dim=-1)


@pytest.mark.parametrize("make", [lambda: ts.DiffusersAttention(4, heads=2, dim_head=2),
                                  lambda: _EmptyHoldsNaN(4, heads=2, dim_head=2)])
def test_diffusers_scores_ignore_the_empty_input_of_baddbmm(make) -> None:
    """beta = 0: whatever torch.empty held is never read; the scores are alpha * q @ k^T, a
    scores stage (not a mask, not a bias), every cell explained, and check says equivalent."""
    from .test_why_sweep import problems

    torch.manual_seed(0)
    module = make().eval()
    x, context = torch.randn(1, 3, 4), torch.randn(1, 5, 4)
    trace = mha_tui.trace(module, x, ["a", "b", "c"], context=context)
    kinds = [s.kind for s in trace.stages]
    assert "scores" in kinds and "mask" not in kinds and "pos_bias" not in kinds, kinds
    assert not [s for s in trace.stages if s.kind == "op"]
    found, asked = problems(trace)
    assert found == [] and asked
    judged = mha_tui.check(module, x, context=context, heads=2)
    assert judged.equivalent, judged.verdict.diagnosis


# ---------------------------------------------------------------- two attentions in one forward


def test_a_decoder_layer_of_two_attentions_is_refused_with_context_naming_both(tmp_path) -> None:
    """nn.TransformerDecoderLayer runs self_attn, then multihead_attn on its output: --context
    explains one cross-attention, so it is refused in one line that names both (the first
    would be shown under the cross-attention's name), in explain, check and the Python API."""
    from mha_tui.load.learner import LoadError

    said = ("TransformerDecoderLayer.forward runs two attentions, one after the other: "
            "self_attn, then multihead_attn on its output")
    out = tmp_path / "out.txt"
    init = ("--init", "d_model=4", "--init", "nhead=2", "--init", "batch_first=True")
    for args in (("explain", "I love AI !", "--module", "torch.nn:TransformerDecoderLayer", *init,
                  "--context", "le chat est sur le tapis", "--dump", str(out)),
                 ("check", "torch.nn:TransformerDecoderLayer", *init, "--context", "le chat")):
        done = run_cli(*args)
        err = done.stderr.decode()
        assert done.returncode == 2 and err.count("\n") == 1 and said in err, err
        assert not out.exists()
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(4, 2, dim_feedforward=8, batch_first=True).eval()
    with pytest.raises(LoadError, match="multihead_attn on its output"):
        mha_tui.trace(layer, torch.randn(1, 3, 4), context=torch.randn(1, 5, 4))
    # its cross-attention alone, called as the layer calls it, is explained
    trace = mha_tui.trace(ts.DecoderCrossAttention(4, 2).eval(), torch.randn(1, 3, 4),
                          context=torch.randn(1, 5, 4))
    assert trace.config.cross and not trace.failed


def test_the_annotated_decoders_source_attention_with_its_src_mask(tmp_path) -> None:
    """`self.src_attn(x, m, m, src_mask)`: src_mask is a mask parameter (no padding in one
    context: none is needed), the keys come from memory, check says equivalent and names no
    per-head modules (clones(Linear, 4) is one Q, one K, one V and W_O); --batch with
    --context is refused in one line (the padding would be the queries', the keys the
    context's)."""
    module = "tests/fixtures/two_sequences.py:AnnotatedSrcAttention"
    init = ("--init", "h=2", "--init", "d_model=4")
    done = run_cli("check", module, *init, "--context", "le chat est sur le tapis")
    out = " ".join(done.stdout.decode().split())
    assert done.returncode == 0, out + done.stderr.decode()
    assert "K and V from the context (memory)" in out and "own module" not in out
    dump = tmp_path / "out.txt"
    done = run_cli("explain", "I love AI", "--module", module, *init, "--context", "le chat",
                   "--batch", "hello", "--dump", str(dump))
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1 and not dump.exists()
    assert "--batch with --context is not built" in err


def test_heads_as_modules_are_still_said_as_such() -> None:
    """The per-head word is kept where the heads are modules (many-eyes: a ModuleList of
    heads, each with its own Q, K and V)."""
    done = run_cli("check", "--model", "many-eyes")
    assert done.returncode == 0
    assert "runs each of the 2 heads as its own module" in " ".join(done.stdout.decode().split())


@pytest.mark.parametrize("command", ["explain", "check"])
@pytest.mark.parametrize("given", [("--context", "le chat est sur le tapis"),
                                   ("--batch", "the cat sat down")])
@pytest.mark.parametrize("module", [("--model", "blueprint"),
                                    ("--module", "tests/fixtures/numpy_attn.py:NumpyAttention")])
def test_numpy_code_refuses_a_second_sequence_in_one_line(tmp_path, command, given, module) -> None:
    """NumPy code is given one sentence's x: with a context or batch rows it would have shown
    (and check judged "equivalent") self-attention on the sentence alone, under a
    cross-attention header."""
    out = tmp_path / "t.txt"
    if command == "explain":
        result = run_cli("explain", "I love AI !", *given, *module, "--dump", str(out))
    else:  # check takes a module file as its argument
        result = run_cli("check", *(module if module[0] == "--model" else module[1:]), *given)
    err = result.stderr.decode().strip()
    assert result.returncode == 2 and result.stdout == b"", err
    assert err.startswith(f"mha-tui: error: {given[0]} needs a torch module") and "\n" not in err
    assert "is NumPy code" in err and not out.exists()


@pytest.mark.parametrize("module,init", [
    ("tests/fixtures/two_sequences.py:SDCrossAttention", "context_dim=8"),  # CompVis' spelling
    ("torch.nn:MultiheadAttention", "kdim=6")])
def test_a_context_of_another_width_is_refused_in_one_line(tmp_path, module, init) -> None:
    """--context is embedded at C; a module built to read a context of another width failed
    inside its own product ("mat1 and mat2 shapes cannot be multiplied"), as if its code were
    wrong. Refused before it runs, naming the argument; at C it runs."""
    name, value = init.split("=")
    out = tmp_path / "t.txt"
    result = run_cli("explain", "I love AI !", "--context", "le chat", "--module", module,
                     "--init", init, "--dump", str(out))
    err = result.stderr.decode().strip()
    assert result.returncode == 2 and "\n" not in err and not out.exists(), err
    assert f"({init}) reads a context {value} wide" in err and f"--init {name}=4" in err
    fixed = run_cli("explain", "I love AI !", "--context", "le chat", "--module", module,
                    "--init", f"{name}=4", "--dump", str(out))
    assert fixed.returncode == 0 and "T_k=2" in out.read_text(), fixed.stderr.decode()
