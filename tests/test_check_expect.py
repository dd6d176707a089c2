"""`mha-tui check --expect MECHANISM` for the named mechanisms of 2024-26 models (issue 30):
soft-capping, cosine attention, q/k normalisation, attention sinks and relative position
terms. The reference grows each with the module's own parameters, so a correct module is
"equivalent to ... with <mechanism, parameters>"; a module whose mechanism is wrong, missing
or misplaced is named by the mechanism at its line; without `--expect`, the verdict infers
the mechanism and says which `--expect` to pass.

The correct modules are the installed transformers' own attention classes (Gemma 2, gpt-oss,
Qwen3, OLMo 2, Cohere, T5, DeBERTa-v2) and modules written in their authors' styles
(open_clip, nanochat, SAM, gpt-oss's reference `sdpa`). The buggy ones are those style
fixtures with one line replaced, written to a temporary folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.config import Config, Source
from mha_tui.records.request import Expect, Request

FIXTURES = Path(__file__).parent / "fixtures"
SOFTCAP = FIXTURES / "mechanisms" / "softcap.py"
SINKS = FIXTURES / "mechanisms" / "sinks.py"
CLIP = FIXTURES / "longtail" / "open_clip_attn.py"
NANOCHAT = FIXTURES / "longtail" / "nanochat_attn.py"
SAM = FIXTURES / "longtail" / "sam_attn.py"
DIFF = FIXTURES / "longtail" / "diff_attn.py"
HF = FIXTURES / "longtail" / "hf_installed.py"
SIZES = ("-H", "4", "-C", "16")
runner = CliRunner()


def check(spec: str, *options: str) -> tuple[int, dict]:
    """`mha-tui check SPEC --format json` (SPEC: FILE.py:Class, or --model): (exit code, the
    verdict)."""
    result = runner.invoke(app, ["check", spec, *SIZES, "--format", "json", *options])
    assert result.exit_code in (0, 1, 3), result.output
    return result.exit_code, json.loads(result.stdout)


def reference(verdict: dict) -> str:
    """What the verdict compared the output with, in words: its end-to-end row."""
    return next(row["checked"] for row in verdict["stages"] if row["kind"] == "end_to_end")


def planted(tmp_path: Path, fixture: Path, old: str, new: str) -> tuple[Path, int]:
    """The fixture with the one line holding `old` replaced by `new`: its path, the line."""
    lines = fixture.read_text().splitlines()
    found = [i for i, line in enumerate(lines) if old in line]
    assert len(found) == 1, (old, found)
    lines[found[0]] = lines[found[0]].replace(old, new)
    path = tmp_path / fixture.name
    path.write_text("\n".join(lines) + "\n")
    return path, found[0] + 1


def line_of(path: Path, text: str) -> int:
    return next(i + 1 for i, line in enumerate(path.read_text().splitlines()) if text in line)


# ---------------------------------------------------------------------------- correct modules

CORRECT = {
    "Gemma 2 soft-capping": (f"{SOFTCAP}:Gemma2Attention", ("--expect", "softcap"),
                             ("logit soft-capping (cap 0.5: 0.5 · tanh(scores / 0.5)",)),
    "Gemma 2 (transformers), rotary and soft-capping": (
        f"{HF}:Gemma2SelfAttention", ("--expect", "rotary", "--expect", "softcap"),
        ("rotary positions (full, base 10000, rotate_half)", "logit soft-capping (cap 0.5")),
    "gpt-oss sdpa sinks": (f"{SINKS}:AttentionBlock", ("--expect", "sinks"),
                           ("attention sinks (a learned logit per head", "h_kv 2")),
    "gpt-oss (transformers), rotary and sinks": (
        f"{HF}:GptOssSelfAttention",
        ("--expect", "rotary", "--rotary-base", "150000", "--expect", "sinks"),
        ("base 150000", "attention sinks (a learned logit per head")),
    "open_clip cosine attention": (
        f"{CLIP}:Attention", ("--expect", "cosine", "--no-causal"),
        ("cosine attention (q and k at unit length, the cosines times the learned scale 10, 10, "
         "10, 10)",)),
    "Qwen3 q/k RMSNorm per head": (
        f"{HF}:Qwen3SelfAttention",
        ("--expect", "rotary", "--rotary-base", "1000000", "--expect", "qk_norm"),
        ("RMSNorm on q and k (per head, the module's weights)",)),
    "OLMo 2 q/k RMSNorm over the projection": (
        f"{HF}:Olmo2SelfAttention",
        ("--expect", "rotary", "--rotary-base", "500000", "--expect", "qk_norm"),
        ("RMSNorm on q and k (over the whole projection",)),
    "Cohere q/k LayerNorm": (
        f"{HF}:CohereQKNormSelfAttention",
        ("--expect", "rotary", "--rotary-base", "500000", "--expect", "qk_norm"),
        ("interleaved pairs", "LayerNorm on q and k (per head")),
    "nanochat F.rms_norm after the rotary": (
        f"{NANOCHAT}:CausalSelfAttention", ("--expect", "rotary", "--expect", "qk_norm"),
        ("RMSNorm on q and k (per head after the rotary",)),
    "T5 buckets, unscaled": (
        f"{HF}:T5SelfAttention", ("--expect", "pos_bias", "--no-causal"),
        ("a relative position bias added to the scores", "not scaled, as T5's")),
    "SAM decomposed relative positions": (
        f"{SAM}:SamAttention", ("--expect", "pos_bias", "--no-causal"),
        ("relative position terms added to the scores before softmax, made from the queries",)),
    "Diff Transformer (unilm) differential attention": (
        f"{DIFF}:MultiheadDiffAttn", ("--expect", "differential"),
        ("differential attention (two softmax maps per head, the second times λ = 0.1771",
         "× (1 − λ_init) = 0.8")),
    "DiffLlama (transformers), rotary and differential": (
        f"{HF}:DiffLlamaSelfAttention", ("--expect", "rotary", "--expect", "differential"),
        ("rotary positions", "differential attention (two softmax maps per head")),
    "DeBERTa-v2 c2p and p2c": (
        f"{HF}:DebertaV2DisentangledOnly", ("--expect", "pos_bias", "--no-causal"),
        ("DeBERTa's disentangled attention", "every term divided by sqrt(3 d_h)")),
}


@pytest.mark.parametrize("name", list(CORRECT))
def test_a_correct_module_is_equivalent_with_its_mechanism_and_parameters(name: str) -> None:
    spec, options, words = CORRECT[name]
    code, verdict = check(spec, *options)
    assert code == 0 and verdict["equivalent"], verdict["diagnosis"]
    for said in words:
        assert said in reference(verdict), reference(verdict)


def test_without_expect_the_same_modules_are_not_equivalent() -> None:
    """The reference grows only what --expect asks for: the mechanism is a difference."""
    for spec, options in ((f"{SOFTCAP}:Gemma2Attention", ()), (f"{SINKS}:AttentionBlock", ()),
                          (f"{HF}:T5SelfAttention", ("--no-causal",))):
        code, verdict = check(spec, *options)
        assert code == 1 and not verdict["equivalent"], spec


# ---------------------------------------------------------------------------- inferred


@pytest.mark.parametrize(("spec", "options", "hint"), [
    (f"{SOFTCAP}:Gemma2Attention", (), "pass `--expect softcap` if that is the exercise"),
    (f"{SINKS}:AttentionBlock", (), "pass `--expect sinks` if that is the exercise"),
    (f"{HF}:Gemma2SelfAttention", ("--expect", "rotary"),
     "pass `--expect rotary --expect softcap` if that is the exercise"),
    (f"{CLIP}:Attention", ("--no-causal",), "pass `--expect cosine` if that is the exercise"),
    (f"{HF}:Qwen3SelfAttention", ("--expect", "rotary", "--rotary-base", "1000000"),
     "pass `--expect rotary --rotary-base 1000000 --expect qk_norm` if that is the exercise"),
    (f"{DIFF}:MultiheadDiffAttn", (), "pass `--expect differential` if that is the exercise"),
])
def test_without_expect_the_verdict_infers_the_mechanism_and_says_which_expect(
        spec: str, options: tuple[str, ...], hint: str) -> None:
    """The mechanism grown into the reference makes the output the reference's: said."""
    code, verdict = check(spec, *options)
    assert code == 1
    diagnosis = verdict["diagnosis"]
    assert diagnosis["kind"] == "mechanism", diagnosis
    assert hint in diagnosis["message"], diagnosis["message"]


def test_t5_is_told_that_its_unscaled_scores_go_with_its_bias() -> None:
    """T5 does not scale its scores (it folds 1/sqrt(d_h) into W_Q's initialisation): without
    --expect, not scaled, with its bias besides, and the --expect that makes it the reference."""
    code, verdict = check(f"{HF}:T5SelfAttention", "--no-causal")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "not_scaled", diagnosis
    assert diagnosis["message"].endswith("pass `--expect pos_bias` if that is the exercise")


def test_a_mechanism_that_does_not_explain_the_output_is_not_offered(tmp_path: Path) -> None:
    """Soft-capping, and a bug beside it: growing the cap does not make the output the
    reference's, so no --expect is offered."""
    path, _ = planted(tmp_path, SOFTCAP, "value = self.v_proj(hidden_states)",
                      "value = self.v_proj(hidden_states).relu()")
    code, verdict = check(f"{path}:Gemma2Attention")
    assert code == 1
    assert "--expect softcap" not in verdict["diagnosis"]["message"]


# ---------------------------------------------------------------------------- wrong modules


def test_soft_capping_after_softmax_is_named_at_its_line(tmp_path: Path) -> None:
    text = SOFTCAP.read_text()
    capping = ("        attn_weights = attn_weights / softcap\n"
               "        attn_weights = torch.tanh(attn_weights)\n"
               "        attn_weights = attn_weights * softcap  # every score now within "
               "(-softcap, softcap)\n")
    assert capping in text
    moved = text.replace(capping, "").replace(
        "        attn_output = torch.matmul(attn_weights, value)",
        "        attn_weights = torch.tanh(attn_weights / softcap) * softcap\n"
        "        attn_output = torch.matmul(attn_weights, value)")
    path = tmp_path / "softcap.py"
    path.write_text(moved)
    code, verdict = check(f"{path}:Gemma2Attention", "--expect", "softcap")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "softcap_after_softmax", diagnosis
    assert diagnosis["line"] == line_of(path, "torch.tanh(attn_weights / softcap)")
    assert "soft-capping after softmax" in diagnosis["message"]


def test_a_cap_that_divides_and_multiplies_by_different_numbers(tmp_path: Path) -> None:
    path, _ = planted(tmp_path, SOFTCAP, "attn_weights = attn_weights * softcap  #",
                         "attn_weights = attn_weights * 30.0  #")
    code, verdict = check(f"{path}:Gemma2Attention", "--expect", "softcap")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "softcap_cap", diagnosis
    assert diagnosis["line"] == line_of(path, "torch.tanh(attn_weights)")
    assert "divided by 0.5 and the tanh multiplied by 30" in diagnosis["message"]


def test_the_cap_softcap_asks_for() -> None:
    code, verdict = check(f"{SOFTCAP}:Gemma2Attention", "--expect", "softcap", "--softcap", "50")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "softcap_cap", diagnosis
    assert "soft-capping at 0.5 where --softcap 50 was expected" in diagnosis["message"]
    code, verdict = check(f"{SOFTCAP}:Gemma2Attention", "--expect", "softcap", "--softcap", "0.5")
    assert code == 0, verdict["diagnosis"]


def test_gpt_oss_sdpa_every_stage_is_named_and_judged() -> None:
    """gpt-oss's `sdpa`: the mask built by `Q.new_full(...)` (it reads only Q's dtype) is the
    mask stage, `QK *= sm_scale` on the 5-D scores is judged through the sink column's cat,
    and the merge of its (B, T, h_kv, q_mult, d_h) context is read as the concat."""
    code, verdict = check(f"{SINKS}:AttentionBlock", "--expect", "sinks")
    assert code == 0, verdict["diagnosis"]
    rows = {row["kind"]: row for row in verdict["stages"]}
    assert "op" not in rows, rows["op"]
    for kind in ("mask", "scale", "sinks", "concat"):
        assert rows[kind]["ok"] is True, rows[kind]
    assert rows["scale"]["line"] == line_of(SINKS, "QK *= sm_scale")
    assert "measured 0.5000" in rows["scale"]["checked"]


@pytest.mark.parametrize(("old", "new", "kind", "at"), [
    ("QK *= sm_scale", "QK /= sm_scale", "scale_inverted", "QK /= sm_scale"),
    ("return attn.reshape(B, n_tokens, -1)", "return attn.transpose(2, 3).reshape(B, n_tokens, -1)",
     "concat", "return attn"),
])
def test_gpt_oss_sdpa_a_wrong_scale_or_merge_is_named_at_its_line(
        tmp_path: Path, old: str, new: str, kind: str, at: str) -> None:
    path, _ = planted(tmp_path, SINKS, old, new)
    code, verdict = check(f"{path}:AttentionBlock", "--expect", "sinks")
    diagnosis = verdict["diagnosis"]
    assert code == 1, diagnosis
    assert kind in (diagnosis["kind"], diagnosis.get("stage")), diagnosis
    assert diagnosis["line"] == line_of(path, at), diagnosis


def test_a_sink_column_kept_and_a_key_dropped_instead(tmp_path: Path) -> None:
    path, line = planted(tmp_path, SINKS, "W = W[..., :-1]", "W = W[..., 1:]")
    code, verdict = check(f"{path}:AttentionBlock", "--expect", "sinks")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "sinks_not_dropped", diagnosis
    assert diagnosis["line"] == line
    assert "the sink column is not dropped" in diagnosis["message"]


def test_a_sink_column_never_dropped_is_named_before_the_crash(tmp_path: Path) -> None:
    path, _ = planted(tmp_path, SINKS, "W = W[..., :-1]", "pass")
    code, verdict = check(f"{path}:AttentionBlock", "--expect", "sinks")
    diagnosis = verdict["diagnosis"]
    assert code == 1  # the forward raised, and the mechanism says why: NOT equivalent
    assert diagnosis["kind"] == "sinks_not_dropped", diagnosis
    assert diagnosis["line"] == line_of(path, "QK = torch.cat([QK, S], dim=-1)")
    assert "never dropped after softmax" in diagnosis["message"]


def test_cosine_attention_normalised_over_the_wrong_axis(tmp_path: Path) -> None:
    path, line = planted(tmp_path, CLIP, "F.normalize(q, dim=-1)", "F.normalize(q)")
    code, verdict = check(f"{path}:Attention", "--expect", "cosine", "--no-causal")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "cosine_axis", diagnosis
    assert diagnosis["line"] == line
    assert "F.normalize's default is dim=1" in diagnosis["message"]


def test_qk_norm_on_one_side_only(tmp_path: Path) -> None:
    path, _ = planted(tmp_path, NANOCHAT, "q, k = norm(q), norm(k)", "q = norm(q)")
    code, verdict = check(f"{path}:CausalSelfAttention", "--expect", "rotary", "--expect",
                          "qk_norm")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "qk_norm_one_side", diagnosis
    assert "QK-norm on Q only" in diagnosis["message"]


def test_qk_norm_over_the_tokens(tmp_path: Path) -> None:
    path, line = planted(tmp_path, NANOCHAT, "q, k = norm(q), norm(k)",
                         "q, k = norm(q), k * torch.rsqrt(k.pow(2).mean(1, keepdim=True) + 1e-6)")
    code, verdict = check(f"{path}:CausalSelfAttention", "--expect", "rotary", "--expect",
                          "qk_norm")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "qk_norm_axis", diagnosis
    assert diagnosis["line"] == line
    assert "reduces k over axis 1 (the tokens)" in diagnosis["message"]


PADDED = ("--expect", "pos_bias", "--no-causal", "--batch", "the cat sat down", "--batch", "a dog")


def test_pos_bias_with_a_padded_batch_uses_every_rows_own_terms() -> None:
    """SAM's q · R terms are made from each row's own queries: with two rows of different
    lengths (the second padded), the stage keeps every row's terms and the reference adds
    each row's own, with its padded keys blocked: equivalent, pos_bias judged right."""
    from mha_tui.config import Config, Source
    from mha_tui.pipeline import checked

    code, verdict = check(f"{SAM}:SamPaddedAttention", *PADDED)
    assert code == 0, verdict["diagnosis"]
    assert "relative position terms added to the scores" in reference(verdict)
    rows = {row["kind"]: row for row in verdict["stages"]}
    assert rows["pos_bias"]["ok"] is True and rows["mask"]["ok"] is True, rows
    said = rows["pos_bias"]["checked"]  # the terms are the reference's: no advice to expect alibi
    assert "--expect pos_bias" in said and "not part of plain attention" not in said, said
    config = Config("the cat sat down", embed_dim=16, num_heads=4, causal=False,
                    batch=("a dog",))  # rows 1, ... after the sentence's row 0
    run, _ = checked(Request(config, Source(module=f"{SAM}:SamPaddedAttention"),
                             Expect(mechanisms=("pos_bias",))))
    terms = run(config).stage("pos_bias").tensors[0].values  # (B, h, T, T)
    assert terms.shape == (2, 4, 4, 4) and not np.allclose(terms[0], terms[1])


def test_deberta_blocking_the_padded_queries_too_is_equivalent() -> None:
    """DeBERTa's own mask (the installed transformers' get_attention_mask) blocks the padded
    queries' rows as well as the padded keys: no real token reads those rows, so the mask is
    judged right, said as the module's own choice, and the output compared on the real rows."""
    code, verdict = check(f"{HF}:DebertaV2Padded", *PADDED)
    assert code == 0, verdict["diagnosis"]
    rows = {row["kind"]: row for row in verdict["stages"]}
    assert rows["mask"]["ok"] is True and "padded queries' rows too" in rows["mask"]["checked"]
    assert "padded positions' own rows are not compared" in reference(verdict)


def test_pos_bias_with_a_padded_batch_names_padding_on_the_queries(tmp_path: Path) -> None:
    path, line = planted(tmp_path, SAM, "(self.num_heads, dim=0)[:, None, :]",
                         "(self.num_heads, dim=0)[:, :, None]")
    code, verdict = check(f"{path}:SamPaddedAttention", *PADDED)
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "padding_on_queries", diagnosis
    assert diagnosis["line"] == line + 1  # the masked_fill that uses it
    # its scores fold the batch into the heads, (B h, T, T): the NaN row is said by batch
    # row ("a dog", row 2, padded from token 2) and head, not as "head 8"
    assert "row 2 of head 0 in batch row 2 is fully masked" in diagnosis["message"], diagnosis


def test_differential_attention_adding_its_second_map(tmp_path: Path) -> None:
    """`first + λ second`: no difference of two maps is found, and the rows about the heads'
    layout (2 heads of 2 d_h values) are its consequences: the sign is named at its line."""
    path, line = planted(tmp_path, DIFF, "attn_weights[:, :, 0] - lambda_full",
                         "attn_weights[:, :, 0] + lambda_full")
    code, verdict = check(f"{path}:MultiheadDiffAttn", "--expect", "differential")
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "differential_sign", diagnosis
    assert diagnosis["line"] == line


@pytest.mark.parametrize(("mechanism", "words"), [
    ("softcap", "no soft-capping"), ("sinks", "no attention sinks"),
    ("cosine", "no cosine attention"), ("qk_norm", "no q/k normalisation"),
    ("pos_bias", "no position bias"), ("differential", "no differential attention")])
def test_a_mechanism_expected_and_missing_is_named(mechanism: str, words: str) -> None:
    code, verdict = check("--model=mygpt", "--expect", mechanism)
    diagnosis = verdict["diagnosis"]
    assert code == 1 and diagnosis["kind"] == "mechanism_missing", diagnosis
    assert diagnosis["message"].startswith(words)


# ---------------------------------------------------------------------------- the options


@pytest.mark.parametrize(("options", "message"), [
    (("--softcap", "50"), "--softcap CAP goes with --expect softcap"),
    (("--expect", "softcap", "--softcap", "-1"), "--softcap must be above 0, got -1"),
    (("--expect", "attention", "--expect", "sinks"), "--expect attention means plain"),
    (("--expect", "alibi", "--expect", "pos_bias"), "--expect alibi is a position bias"),
    (("--expect", "cosine", "--expect", "qk_norm"), "--expect cosine already normalises"),
])
def test_expect_refusals_are_one_line(options: tuple[str, ...], message: str) -> None:
    result = runner.invoke(app, ["check", "--model", "mygpt", *options])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_the_request_carries_the_mechanisms_to_a_grader_worker() -> None:
    request = Request(Config("I love AI !"), Source(),
                      Expect(rotary=True, mechanisms=("softcap", "qk_norm"), softcap=50.0))
    again = Request.from_json(json.loads(json.dumps(request.as_json())))
    assert again.expect == request.expect
    assert again.expect.mechanisms == ("qk_norm", "softcap")  # the forward's order
    with pytest.raises(ValueError, match="no such mechanism"):
        Expect(mechanisms=("tanh",))


def test_grading_a_folder_takes_expect(tmp_path: Path) -> None:
    """The grader's workers get check's Request: --expect softcap reaches every submission."""
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "alice.py").write_text(SOFTCAP.read_text())
    (folder / "bob.py").write_text(SOFTCAP.read_text().replace(
        "attn_weights = attn_weights * softcap  #", "attn_weights = attn_weights * 30.0  #"))
    files = [str(folder / "alice.py"), str(folder / "bob.py")]
    result = runner.invoke(app, ["check", *files, "--class", "Gemma2Attention", *SIZES,
                                 "--expect", "softcap", "--format", "json"])
    assert result.exit_code == 1, result.output
    alice, bob = json.loads(result.stdout)
    assert alice["equivalent"], alice["diagnosis"]
    assert "logit soft-capping (cap 0.5" in reference(alice)
    assert bob["diagnosis"]["kind"] == "softcap_cap"


def test_the_scale_before_a_soft_cap_is_judged_through_it(tmp_path: Path) -> None:
    """cap · tanh(scores / cap) lies between the scaled scores and softmax: the scale is
    judged through it (its / cap and * cap are no scaling), right or wrong, at its line."""
    code, verdict = check(f"{SOFTCAP}:Gemma2Attention", "--expect", "softcap")
    scale = next(row for row in verdict["stages"] if row["kind"] == "scale")
    assert code == 0 and scale["ok"] is True, scale
    path, _ = planted(tmp_path, SOFTCAP, "self.scaling = self.head_dim ** -0.5",
                      "self.scaling = self.head_dim ** -1.0")
    code, verdict = check(f"{path}:Gemma2Attention", "--expect", "softcap")
    diagnosis = verdict["diagnosis"]
    # d_h = C / h = 4 here: 1/d_h is 1/sqrt(C) too, and named so
    assert code == 1 and diagnosis["kind"] == "scaled_by_sqrt_C", diagnosis
    assert diagnosis["line"] == line_of(path, "* self.scaling")
