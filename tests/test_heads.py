"""`mha-tui heads`: every head of a whole model labelled from its own weights, the model view
in every format, ablation, and the same labels for the same model as a GPT-2 checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mha_tui.load import trained
from mha_tui.pipeline.heads import model_view
from mha_tui.roles import ModelView

from .conftest import run_cli, settle

LETTERS = "a b c d e f g h"
REPEATED = f"{LETTERS} {LETTERS}"


def _view(sentence: str = REPEATED, **options: object) -> ModelView:
    return model_view(trained.load("induction", sentence), sentence, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def view() -> ModelView:
    return _view()


def test_the_trained_model_has_a_previous_token_and_an_induction_head(view: ModelView) -> None:
    previous, induction = view.labelled("previous-token"), view.labelled("induction")
    assert previous is not None and previous.layer == 0
    assert previous.score("previous-token").value >= 0.9
    assert induction is not None and induction.layer == 1
    assert induction.score("induction").value >= 0.9
    assert view.predictions is not None
    assert view.predictions.copyable == tuple(range(8, 15))
    assert view.predictions.accuracy > 0.95


def test_removing_the_induction_head_breaks_copying_and_another_head_does_not(view: ModelView) -> None:
    induction = view.labelled("induction")
    assert induction is not None
    others = [role for role in view.roles[1] if role.head != induction.head]
    broken = _view(ablate=(1, induction.head))
    assert broken.ablation is not None and broken.predictions is not None
    assert broken.predictions.accuracy == view.predictions.accuracy  # the run without removal
    assert broken.ablation.after.accuracy <= view.predictions.accuracy - 0.5
    assert broken.ablation.after.loss > view.predictions.loss + 0.5
    assert broken.ablation.projection == "model.blocks.1.attn.W_O"
    kept = [_view(ablate=(1, role.head)).ablation for role in others]
    # some other head of the same layer can go without the copying breaking
    assert max(a.after.accuracy for a in kept if a is not None) >= 0.9


def test_mean_ablation_is_the_second_choice(view: ModelView) -> None:
    induction = view.labelled("induction")
    assert induction is not None
    mean = _view(ablate=(1, induction.head), method="mean").ablation
    zero = _view(ablate=(1, induction.head), method="zero").ablation
    assert mean is not None and zero is not None and mean.method == "mean"
    assert mean.after.loss != zero.after.loss
    assert mean.after.accuracy <= view.predictions.accuracy - 0.5


def test_every_format(tmp_path: Path) -> None:
    texts = {}
    for ext in ("txt", "json", "svg", "html", "md"):
        done = run_cli("heads", REPEATED, "--model", "induction", "--ablate", "1.0",
                       "--dump", str(tmp_path / f"view.{ext}"))
        assert done.returncode == 0, done.stderr
        texts[ext] = (tmp_path / f"view.{ext}").read_text("utf-8")
    document = json.loads(texts["json"])
    assert [role["label"] for role in document["roles"]] == [
        role.label for layer in _view().roles for role in layer]
    assert document["scores"]["induction"]["entries"][0] == [8, [1]]
    assert document["ablation"]["method"] == "zero"
    assert "head scores, from this run's weights" in texts["txt"]
    assert "without 1.0" in texts["txt"]
    assert texts["svg"].startswith("<svg") and "induction" in texts["svg"]
    assert texts["html"].startswith("<!DOCTYPE html>")
    assert texts["md"].startswith("# mha-tui heads")


def test_a_sentence_without_a_repeat_says_so_and_offers_repeat() -> None:
    done = run_cli("heads", LETTERS, "--model", "induction", "--dump", "-")
    assert done.returncode == 0
    text = done.stdout.decode("utf-8")
    assert "--repeat" in text and "need a repeat" in text
    again = run_cli("heads", LETTERS, "--model", "induction", "--repeat", "--dump", "-")
    assert "need a repeat" not in again.stdout.decode("utf-8")
    assert "ind 0.9" in again.stdout.decode("utf-8")


def test_a_long_sentence_is_pooled_and_says_so() -> None:
    words = " ".join(f"w{i}" for i in range(16))
    done = run_cli("heads", words, "--model", "induction", "--repeat", "--width", "80",
                   "--dump", "-")
    text = done.stdout.decode("utf-8")
    assert "pooled to fit: 32 tokens" in text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize(("args", "words"), [
    (["--ablate", "9.0"], "--layer 9 is out of range"),
    (["--ablate", "1.7"], "head 7 is out of range"),
    (["--ablate", "one"], "--ablate takes LAYER.HEAD"),
    (["--width", "20"], "--width must be between"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], words: str) -> None:
    done = run_cli("heads", REPEATED, "--model", "induction", *args, "--dump", "-")
    assert done.returncode == 2
    err = done.stderr.decode("utf-8")
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
    assert done.stdout == b""


def test_heads_needs_a_whole_model() -> None:
    for args in ([], ["--model", "mygpt"], ["--model", "induction", "--hf", "x"]):
        done = run_cli("heads", REPEATED, *args, "--dump", "-")
        assert done.returncode == 2 and b"Traceback" not in done.stderr


# ---------------------------------------------------------------- the same model as GPT-2


def _as_gpt2(directory: Path) -> Path:
    """The trained model written as a GPT-2 checkpoint: the same attention and norms, its MLPs
    zero (so each block adds only its attention), untied unembedding; a word-level tokenizer
    whose word tN is token N."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from mha_tui.models.induction import load_trained

    ours = load_trained()
    c = ours.config
    config = GPT2Config(vocab_size=c.vocab_size, n_positions=c.max_seq_len, n_embd=c.embed_dim,
                        n_layer=c.num_layers, n_head=c.num_heads, tie_word_embeddings=False,
                        layer_norm_epsilon=ours.ln_f.eps, bos_token_id=0, eos_token_id=0)
    gpt2 = GPT2LMHeadModel(config).eval()
    state = {name: torch.zeros_like(t) for name, t in gpt2.state_dict().items()}
    state["transformer.wte.weight"] = ours.tok_emb.weight
    state["transformer.wpe.weight"] = ours.pos_emb.weight
    state["transformer.ln_f.weight"], state["transformer.ln_f.bias"] = ours.ln_f.weight, ours.ln_f.bias
    state["lm_head.weight"] = ours.unembed.weight
    for layer, block in enumerate(ours.blocks):
        p, a = f"transformer.h.{layer}.", block.attn
        state[p + "ln_1.weight"], state[p + "ln_1.bias"] = block.ln.weight, block.ln.bias
        state[p + "ln_2.weight"] = torch.ones(c.embed_dim)
        # GPT-2's Conv1D keeps (in, out): the transposes of nn.Linear's weights
        state[p + "attn.c_attn.weight"] = torch.cat([a.W_Q.weight.T, a.W_K.weight.T, a.W_V.weight.T], 1)
        state[p + "attn.c_proj.weight"] = a.W_O.weight.T
    missing = {k for k in gpt2.state_dict() if k.endswith((".attn.bias", ".masked_bias"))}
    gpt2.load_state_dict({k: v for k, v in state.items() if k not in missing}, strict=False)
    gpt2.save_pretrained(directory)
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(c.vocab_size)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0").save_pretrained(directory)
    return directory


def test_the_same_model_as_a_gpt2_checkpoint_gets_the_same_labels(tmp_path: Path) -> None:
    directory = _as_gpt2(tmp_path / "gpt2-induction")
    words = " ".join(f"t{i}" for i in range(8))
    done = run_cli("heads", f"{words} {words}", "--hf", str(directory), "--dump", "-",
                   "--format", "json")
    assert done.returncode == 0, done.stderr.decode()
    theirs = json.loads(done.stdout)
    ours = _view()
    assert theirs["ids"] == list(ours.ids)
    assert [r["label"] for r in theirs["roles"]] == [r.label for layer in ours.roles for r in layer]
    for role in theirs["roles"]:
        mine = ours.role(role["layer"], role["head"])
        for kind, value in role["scores"].items():
            assert value == pytest.approx(mine.score(kind).value, abs=1e-4)
    assert theirs["predictions"]["accuracy"] == ours.predictions.accuracy
    assert theirs["roles"][0]["attention"] == "transformer.h.0.attn"


def test_gpt2_small_sized_grid_fits_120_columns(tmp_path: Path) -> None:
    """12 layers x 12 heads (GPT-2 small's grid, narrow channels to stay small) in 120 columns."""
    from .hf_models import save_tiny_gpt2

    directory = save_tiny_gpt2(tmp_path / "twelve", n_layer=12, n_head=12, n_embd=24)
    done = run_cli("heads", "The cat sat on the mat. The cat sat on the mat.", "--hf",
                   str(directory), "--width", "120", "--dump", "-")
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode("utf-8").splitlines()
    assert max(len(line) for line in lines) <= 120
    assert sum(line.startswith("L11") for line in lines) == 1
    assert "11.11" in done.stdout.decode("utf-8")


# ---------------------------------------------------------------- the app's heads screen


async def test_arrows_choose_a_head_and_enter_returns_it(view: ModelView) -> None:
    from mha_tui.app.heads import HeadsApp

    app = HeadsApp(view)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("right", "right", "down", "left", "enter")
    assert app.return_value == (1, 1)


async def test_x_removes_the_head_under_the_cursor_in_a_worker(view: ModelView) -> None:
    from mha_tui.app.heads import HeadsApp

    induction = view.labelled("induction")
    assert induction is not None
    asked: list[tuple[int, int, str]] = []

    def ablate(layer: int, head: int, method: str) -> ModelView:
        asked.append((layer, head, method))
        return _view(ablate=(layer, head), method=method)

    app = HeadsApp(view, selected=(1, induction.head), ablate=ablate)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("x")
        await settle(app, pilot)
        assert asked == [(1, induction.head, "zero")]
        assert app.model_view.ablation is not None
        assert app.model_view.ablation.after.accuracy <= 0.5
        await pilot.press("q")
    assert app.return_value is None


async def test_without_predictions_x_is_greyed_out(view: ModelView) -> None:
    from mha_tui.app.heads import HeadsApp

    app = HeadsApp(view)  # no ablate callable: nothing to run again
    async with app.run_test(size=(100, 40)) as pilot:
        assert app.check_action("ablate", ("zero",)) is None
        await pilot.press("q")


# ---------------------------------------------------------------- explain --model induction


def test_explain_a_layer_of_the_trained_model_labels_its_heads() -> None:
    done = run_cli("explain", REPEATED, "--model", "induction", "--layer", "1", "--stage",
                   "softmax", "--only", "--dump", "-")
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode("utf-8")
    assert "an induction head (its highest score, >= 0.5)" in text
    assert "induction = mean over repeated queries" in text and "w[8, 1]" in text
    assert "layer 1 of 0-1" in text


def test_the_quiz_asks_which_head_is_the_induction_head(view: ModelView) -> None:
    from mha_tui.load import trained as trained_models
    from mha_tui.pipeline.hf import Session
    from mha_tui.quiz import questions

    session = Session(trained_models.load("induction", REPEATED), REPEATED)
    asked = [q for q in questions(session.trace(1)) if q.asks == "head_role"]
    induction = view.labelled("induction")
    assert induction is not None
    assert len(asked) == 1 and "induction head" in asked[0].text
    assert asked[0].expected == induction.head


def test_explain_refuses_what_the_trained_model_brings_itself() -> None:
    for args, words in ((["--heads", "4"], "--heads does not apply with --model induction"),
                        (["--layer", "2"], "--layer 2 is out of range"),
                        (["--layer", "1", "--model", "mygpt"], "--layer picks a layer of a whole model")):
        done = run_cli("explain", REPEATED, *(args if "mygpt" in args else ["--model", "induction", *args]),
                       "--dump", "-")
        assert done.returncode == 2, (args, done.stderr)
        assert words in done.stderr.decode("utf-8")


def ablation_table() -> str:
    """docs/heads.md's table: every head removed in turn on the repeated sentence."""
    loaded = trained.load("induction", REPEATED)
    view = model_view(loaded, REPEATED)
    assert view.predictions is not None
    rows = ["| head removed | its label | loss (nats) | accuracy on the repeat | top predictions changed |",
            "| --- | --- | --- | --- | --- |",
            f"| none | | {view.predictions.loss:.3f} | {view.predictions.accuracy:.0%} | |"]
    for layer in range(view.n_layers):
        for head in range(view.num_heads):
            ablation = model_view(loaded, REPEATED, ablate=(layer, head)).ablation
            assert ablation is not None and ablation.after.accuracy is not None
            after = ablation.after
            changed = sum(a != b for a, b in zip(view.predictions.top, after.top, strict=True))
            rows.append(f"| {layer}.{head} | {view.role(layer, head).label} | {after.loss:.3f} | "
                        f"{after.accuracy:.0%} | {changed} of {len(after.top)} |")
    return "\n".join(rows)


def test_the_docs_ablation_table_is_what_the_model_gives_now() -> None:
    docs = (Path(__file__).parents[1] / "docs" / "heads.md").read_text("utf-8")
    assert ablation_table() in docs


if __name__ == "__main__":  # python -m tests.test_heads: the table for docs/heads.md
    print(ablation_table())


def test_ascii_json_escapes_every_other_character() -> None:
    done = run_cli("heads", "café naïve café naïve", "--model", "induction", "--ascii",
                   "--format", "json", "--dump", "-")
    assert done.returncode == 0, done.stderr.decode()
    done.stdout.decode("ascii")
    assert json.loads(done.stdout)["tokens"][:2] == ["café", "naïve"]
