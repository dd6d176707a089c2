"""`--hf`: a tiny GPT-2 and byte-level tokenizer built offline, found on disk or in a cache
laid out as the hub lays it out, run once, and explained with the model's own numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
from typer.testing import CliRunner

from mha_tui.cli import app
from mha_tui.load import hf
from mha_tui.pipeline.hf import Session
from mha_tui.tracing.hf_layers import run_forward

from .conftest import ROOT, run_cli
from .hf_models import SENTENCES, hub_cache_layout, save_tiny_gpt2, save_tiny_mamba

SENTENCE = "The cat sat on the mat."


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 (3 layers, C=16, 4 heads of 4) and its tokenizer, saved once."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> hf.Loaded:
    return hf.load(str(tiny_dir))


def _error(source: str) -> str:
    with pytest.raises(hf.HfError) as caught:
        hf.load(source)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- finding and loading


def test_load_from_a_directory(tiny: hf.Loaded, tiny_dir: Path) -> None:
    info = tiny.info
    assert (info.class_name, info.n_layers, info.embed_dim, info.num_heads, info.head_dim) == (
        "GPT2LMHeadModel", 3, 16, 4, 4)
    assert info.vocab_size == tiny.model.config.vocab_size == len(tiny.tokenizer)
    assert tiny.attention_path(2) == "transformer.h.2.attn"
    assert tiny.attention(2) is tiny.model.transformer.h[2].attn
    assert not tiny.model.training
    assert tiny.model.config._attn_implementation == "eager"


def test_cache_lookup_by_name(tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    snapshot = hub_cache_layout(cache, "tiny-org/tiny-gpt2", tiny_dir)
    monkeypatch.chdir(tmp_path)  # no directory of the same name beside us
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert hf.locate("tiny-org/tiny-gpt2") == snapshot
    # A bare name finds the one cached repo of that name whatever its owner (gpt2 is
    # cached as openai-community/gpt2).
    assert hf.locate("tiny-gpt2") == snapshot
    loaded = hf.load("tiny-gpt2")
    assert loaded.info.path == str(snapshot) and loaded.info.n_layers == 3
    # HF_HOME/hub is the default when HF_HUB_CACHE is unset.
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hf.hub_cache() == cache and hf.locate("tiny-org/tiny-gpt2") == snapshot
    # refs/main points at a snapshot that is not there: not found, not a crash.
    (cache / "models--tiny-org--tiny-gpt2" / "refs" / "main").write_text("f" * 40)
    assert "hf download tiny-org/tiny-gpt2" in _error("tiny-org/tiny-gpt2")


def test_missing_model_says_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    message = _error("gpt2")
    assert "not in the Hugging Face cache" in message and "`hf download gpt2`" in message
    assert "never downloads" in message
    assert "ORG/NAME" in _error("../no such/model dir")


def test_refusals_are_one_line(tiny_dir: Path, tmp_path: Path) -> None:
    no_tokenizer = save_tiny_gpt2(tmp_path / "no-tok", with_tokenizer=False)
    assert "has no tokenizer" in _error(str(no_tokenizer))
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in _error(str(tmp_path / "empty"))
    assert "is a file" in _error(str(tiny_dir / "config.json"))
    mamba = save_tiny_mamba(tmp_path / "mamba")
    assert "no recognisable self-attention" in _error(str(mamba))


def test_layer_out_of_range(tiny: hf.Loaded) -> None:
    hf.check_layer(tiny, 2)
    for layer in (3, -1):
        with pytest.raises(hf.HfError, match=r"--layer .* out of range: .* has 3 layers, 0 to 2"):
            hf.check_layer(tiny, layer)


def test_never_downloads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(hf.HfError):
        hf.load("openai-community/gpt2")
    assert os.environ["HF_HUB_OFFLINE"] == "1"


# ---------------------------------------------------------------- tokens


def test_tokens_are_the_tokenizers_made_readable(tiny: hf.Loaded) -> None:
    ids, tokens = hf.tokenize(tiny, "The cat sat")
    assert ids == tiny.tokenizer("The cat sat")["input_ids"]
    assert tokens == ("The", "␣cat", "␣sat")
    assert tiny.tokenizer.convert_ids_to_tokens(ids)[1] == "Ġcat"
    _, tokens = hf.tokenize(tiny, "The cat sat", ascii_only=True)
    assert tokens == ("The", "_cat", "_sat")


def test_byte_level_pieces_decode_where_they_form_text(tiny: hf.Loaded) -> None:
    ids, tokens = hf.tokenize(tiny, SENTENCES[3])
    assert len(tokens) == len(ids)
    joined = "".join(tokens).replace("␣", " ")
    assert "Café" in joined or "Caf" in joined
    # The emoji is cut into pieces that are not text on their own: shown as their bytes.
    assert any("\\xf0" in token for token in tokens)
    assert "\\xf0\\x9f\\x98\\x80" in joined.replace("␣", "")
    assert hf.readable_token("ĠðŁĺĢ", byte_level=True) == "␣😀"
    assert hf.readable_token("Ċ", byte_level=True) == "\n"  # render.text.printable shows it as ␊
    assert hf.readable_token("▁the", byte_level=False) == "␣the"


def test_sentence_longer_than_the_model_reads(tiny: hf.Loaded) -> None:
    with pytest.raises(hf.HfError, match="reads at most 64"):
        hf.tokenize(tiny, " ".join(["cat"] * 80))
    with pytest.raises(hf.HfError, match="no tokens"):
        hf.tokenize(tiny, "")


def test_too_many_tokens_refused_before_any_weight_loads(tiny_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    opened: list[object] = []

    def never(*args: object, **kwargs: object) -> None:
        opened.append(args)
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    long = " ".join(["cat"] * 80)
    with pytest.raises(hf.HfError, match=r"has 80 tokens but .* reads at most 64"):
        hf.load(str(tiny_dir), long)
    result = CliRunner().invoke(app, ["explain", long, "--hf", str(tiny_dir), "--dump", "-"])
    assert result.exit_code == 2
    assert "reads at most 64" in result.output
    assert opened == []
    # A sentence the model takes goes on to load the weights.
    with pytest.raises(hf.HfError, match="the weights were loaded"):
        hf.load(str(tiny_dir), "The cat")
    assert len(opened) == 1


# ---------------------------------------------------------------- the forward, hooked


def test_hooks_capture_the_models_own_tensors(tiny: hf.Loaded) -> None:
    ids, _ = hf.tokenize(tiny, SENTENCE)
    run = run_forward(tiny, ids, range(3))
    model = tiny.model
    batch = torch.tensor([ids])
    with torch.no_grad():
        reference = model(batch, output_attentions=True, output_hidden_states=True, use_cache=False)
    transformer = model.transformer
    # Every embedding the model called before block 0, in order: GPT-2's wte, then wpe.
    assert [(call.path, call.tokens) for call in run.embeddings] == [
        ("transformer.wte", True), ("transformer.wpe", False)]
    assert torch.equal(run.embeddings[0].output, transformer.wte.weight[batch])
    assert torch.equal(run.embeddings[1].output, transformer.wpe.weight[: len(ids)].unsqueeze(0))
    assert run.embedding_norms == ()  # GPT-2 normalises inside each block only
    assert torch.equal(run.embedded, reference.hidden_states[0])
    for layer in range(3):
        captured = run.layers[layer]
        assert captured.norm_name == "ln_1"
        assert torch.equal(captured.residual, reference.hidden_states[layer])
        with torch.no_grad():
            assert torch.equal(captured.attention_input, transformer.h[layer].ln_1(captured.residual))
            own_output, _ = transformer.h[layer].attn(captured.attention_input,
                                                      attention_mask=_causal(len(ids)))
        assert torch.equal(captured.weights, reference.attentions[layer])
        assert torch.allclose(captured.output, own_output, atol=1e-6)


def _causal(T: int) -> torch.Tensor:
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]


def test_all_layers_limit_follows_the_models_size(tiny: hf.Loaded) -> None:
    gpt2 = hf.ModelInfo("gpt2", "", "GPT2LMHeadModel", 12, 768, 12, 64, 50257, 1024)
    limit = hf.all_layers_limit(gpt2)
    assert hf.recorded_bytes(gpt2, limit) <= hf.ALL_LAYERS_BUDGET < hf.recorded_bytes(gpt2, limit + 1)
    assert 100 < limit < 300  # tens of tokens stay well inside it
    assert hf.all_layers_limit(tiny.info) > limit



@pytest.mark.parametrize("words", [6, 60])
def test_memory_estimate_counts_what_the_recorder_keeps(tiny: hf.Loaded, words: int) -> None:
    """recorded_bytes against the real thing: every snapshot the recordings of all layers
    hold (op outputs, parameters, constants), each counted once."""
    session = Session(tiny, " ".join(["cat"] * words))
    session.trace(0)
    assert session.all_layers
    kept, seen = 0, set()
    for layer in range(tiny.info.n_layers):
        for op in session._traces[layer].recording.ops:
            snaps = [*op.outputs, *(r.snapshot for r in op.inputs if r.snapshot is not None)]
            for snap in snaps:
                if id(snap) not in seen:
                    seen.add(id(snap))
                    kept += snap.values.nbytes
    params = sum(p.numel() for p in tiny.attention(0).parameters())
    assert tiny.info.attention_params == params
    estimate = hf.recorded_bytes(tiny.info, len(session.ids))
    assert abs(estimate - kept) <= 0.1 * kept, (estimate, kept)
    if words == 6:  # a short sentence: the parameters' copies are most of what is kept,
        # and an estimate without them misses by more than the tolerance
        assert kept - (estimate - 4 * params * tiny.info.n_layers) > 0.1 * kept


# ---------------------------------------------------------------- the command line


def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    """In process (loading torch once): exit 2, one line on stderr, nothing on stdout."""
    result = CliRunner(env=env).invoke(app, ["explain", SENTENCE, *args, "--dump", "-"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    stderr = result.stderr
    assert stderr.count("\n") == 1 and stderr.startswith("mha-tui: error: "), stderr
    return stderr


def test_cli_refusals_are_one_line_exit_2(tiny_dir: Path, tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path)}
    assert "`hf download gpt2`" in _refused("--hf", "gpt2", env=env)
    save_tiny_gpt2(tmp_path / "no-tok", with_tokenizer=False)
    assert "has no tokenizer" in _refused("--hf", str(tmp_path / "no-tok"))
    assert "--layer 3 is out of range" in _refused("--hf", str(tiny_dir), "--layer", "3")
    assert "--layer -1 is out of range" in _refused("--hf", str(tiny_dir), "--layer", "-1")
    save_tiny_mamba(tmp_path / "mamba")
    assert "no recognisable self-attention" in _refused("--hf", str(tmp_path / "mamba"))
    assert "use it with --hf" in _refused("--layer", "1")
    assert "--heads does not apply with --hf" in _refused("--hf", str(tiny_dir), "--heads", "4")


def test_a_missing_model_from_the_real_command(tmp_path: Path) -> None:
    """The installed command, as a learner runs it: one line, exit 2, no traceback."""
    result = run_cli("explain", SENTENCE, "--hf", "distilgpt2", "--dump", "-",
                     env={"HF_HUB_CACHE": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode() == (
        f"mha-tui: error: --hf distilgpt2: no such directory and not in the Hugging Face cache at "
        f"{tmp_path}; mha-tui never downloads: fetch it once with `hf download distilgpt2` "
        f"(or pass a directory made by save_pretrained)\n")


def test_without_transformers_says_what_to_install(tiny_dir: Path) -> None:
    # The extra is installed here; hide it the way a missing package looks to an import.
    code = ("import sys\nsys.modules['transformers'] = None\n"
            f"sys.argv = ['mha-tui', 'explain', 'hi', '--hf', {str(tiny_dir)!r}, '--dump', '-']\n"
            "from mha_tui.cli import main\nmain()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == ('mha-tui: error: --hf needs Hugging Face transformers, which is not '
                             'installed: pip install "mha-tui[hf]"\n')


# ---------------------------------------------------------------- traced layers


def _stage_of(trace, kind: str):
    return next(stage for stage in trace.stages if stage.kind == kind)


def _own_outputs(model: torch.nn.Module, ids: list[int]) -> tuple[object, list[torch.Tensor]]:
    """An independent forward: output_attentions, and each attention module's own output."""
    outputs: list[torch.Tensor] = []
    handles = [block.attn.register_forward_hook(lambda m, a, out: outputs.append(out[0]))
               for block in model.transformer.h]
    try:
        with torch.no_grad():
            reference = model(torch.tensor([ids]), output_attentions=True, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return reference, outputs


def test_every_layer_is_the_models_own_numbers(tiny: hf.Loaded) -> None:
    session = Session(tiny, SENTENCE)
    reference, own = _own_outputs(tiny.model, session.ids)
    h = tiny.info.num_heads
    for layer in range(tiny.info.n_layers):
        trace = session.trace(layer)
        assert trace.config.model is not None and trace.config.model.layer == layer
        assert trace.config.tokens == session.tokens
        weights = _stage_of(trace, "softmax").tensors[-1].values  # (B, h, T, T)
        assert weights.shape == (1, h, len(session.ids), len(session.ids))
        for head in range(h):
            assert torch.equal(torch.from_numpy(weights[0, head]), reference.attentions[layer][0, head])
        final = trace.stages[-1].tensors[-1].values  # (B, T, C)
        assert torch.equal(torch.from_numpy(final), own[layer])
        assert all(check.ok is not False for stage in trace.stages for check in stage.checks), [
            check.label for stage in trace.stages for check in stage.checks if check.ok is False]
        first = trace.stages[0]
        assert first.kind == "embed" and trace.stages[1].kind == "project"
        assert [r.name for r in first.tensors][-1] == "x = ln_1(hidden_states)"


def test_one_forward_records_every_layer_until_the_limit(tiny: hf.Loaded) -> None:
    calls = []
    handle = tiny.model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        session = Session(tiny, SENTENCE)
        assert session.all_layers
        for layer in (1, 0, 2, 1):
            session.trace(layer)
        assert len(calls) == 1
        # Beyond the limit: one forward per layer visited, only that layer kept.
        session = Session(tiny, SENTENCE)
        session.all_layers = False
        session.trace(2)
        assert session.recorded(2) and not session.recorded(0)
        session.trace(0)
        assert session.recorded(0) and not session.recorded(2)
        assert len(calls) == 3
    finally:
        handle.remove()


def test_transcript_of_one_layer(tiny_dir: Path, tmp_path: Path) -> None:
    """The real command (a transcript ends the process with os._exit: not in-process)."""
    result = run_cli("explain", "The cat sat on the mat \x1b[31m", "--hf", str(tiny_dir),
                     "--layer", "2", "--dump", "-", "--width", "200")
    assert result.returncode == 0, result.stderr
    text = result.stdout.decode()
    assert "\x1b" not in text  # the tokenizer's control byte is shown as a visible stand-in
    name = str(tiny_dir) if len(str(tiny_dir)) <= 40 else "…" + str(tiny_dir)[-39:]
    assert text.splitlines()[0] == (f"model {name} (GPT2LMHeadModel)  transformer.h.2.attn  "
                                    f"layer 2 of 0-2  C=16 h=4 d_h=4 vocab=300 layers=3  float32")
    assert "␣cat" in text and "Ġ" not in text
    assert "Where layer 2's input comes from" in text
    for kind in ("project", "scores", "softmax", "attend", "w_o"):
        assert f" {kind}  ·  " in text
    assert "✗" not in text
    target = tmp_path / "t.json"
    result = run_cli("explain", "The cat sat", "--hf", str(tiny_dir), "--ascii", "--dump", str(target),
                     "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(target.read_text())
    assert document["config"]["tokens"] == ["The", "_cat", "_sat"]
    assert document["config"]["model"]["layer"] == 0


def test_the_docs_state_the_limit_the_code_computes() -> None:
    gpt2 = hf.ModelInfo("gpt2", "", "GPT2LMHeadModel", 12, 768, 12, 64, 50257, 1024)
    page = (Path(ROOT) / "docs" / "hf.md").read_text(encoding="utf-8")
    assert f"which is\n  {hf.all_layers_limit(gpt2)} tokens for GPT-2 small" in page
    assert f"under {hf.ALL_LAYERS_BUDGET // 2**20} MiB" in page


# ---------------------------------------------------------------- the app


async def test_app_brackets_move_between_layers(tiny: hf.Loaded) -> None:
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.stage_view import StageView

    session = Session(tiny, SENTENCE)
    app = ExplainApp(session.config(1), loader=lambda config: session.trace(1), layers=session)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        while app.trace is None:
            await pilot.pause(0.05)
        await pilot.pause()
        softmax = next(i for i, stage in enumerate(app.trace.stages) if stage.kind == "softmax")
        app.stage_index = softmax
        await pilot.pause()
        shown = app.query_one(StageView).plain
        assert "softmax" in shown and "␣cat" in shown
        for key, layer in [("right_square_bracket", 2), ("right_square_bracket", 2),
                           ("left_square_bracket", 1), ("left_square_bracket", 0),
                           ("left_square_bracket", 0)]:
            await pilot.press(key)
            await pilot.pause()
            assert app.trace is session.trace(layer) and app.config.model.layer == layer
            assert app.stage_index == softmax  # the same stage of the other layer
        assert app.check_action("layer", (-1,)) is None and app.check_action("layer", (1,)) is True
        assert "layer 0 of 0-2" in text_of_header(app)
        at_layer_0 = app.query_one(StageView).plain
        assert at_layer_0 != shown  # layer 0's weights, not layer 1's
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert app.query_one(StageView).plain == shown and "layer 1 of 0-2" in text_of_header(app)


def text_of_header(app) -> str:
    from io import StringIO

    from rich.console import Console

    console = Console(file=StringIO(), width=200, color_system=None)
    console.print(app.query_one("#header").content)
    return console.file.getvalue()


async def test_app_without_a_model_hides_the_layer_keys() -> None:
    from mha_tui.app.explain import ExplainApp

    from .conftest import default_trace

    trace = default_trace()
    app = ExplainApp(trace.config, trace=trace)
    async with app.run_test(size=(100, 32)) as pilot:
        assert app.check_action("layer", (1,)) is False
        before = app.stage_index
        await pilot.press("right_square_bracket")
        assert app.stage_index == before


# ---------------------------------------------------------------- GPT-2's real shapes


LONG = ("The cat sat on the mat and the dog sat on the log, and the cat and the dog were friends, "
        "so the cat liked the mat and the dog liked the log.")


@pytest.fixture(scope="session")
def gpt2_shaped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2 small's attention shapes (C=768, 12 heads of 64) in two layers."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("gpt2-shaped"), n_layer=2, n_embd=768,
                          n_head=12, n_positions=128)


@pytest.mark.slow
def test_gpt2_shapes_keep_the_transcript_bounded(gpt2_shaped: Path) -> None:
    result = run_cli("explain", LONG, "--hf", str(gpt2_shaped), "--layer", "1", "--dump", "-")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    T = int(next(word for line in lines[:8] for word in line.split() if word.startswith("T="))[2:])
    assert T > 30
    # Elided to 12 rows, 10 columns and 4 of 12 heads per tensor: a few thousand lines at most,
    # never T x C or h x T x T numbers.
    assert len(lines) < 2500 and max(len(line) for line in lines) <= 100
    assert any("4 of 12 heads shown" in line for line in lines)
    assert "C=768 h=12 d_h=64" in lines[0]  # the sizes come first when the line is too long


@pytest.mark.slow
async def test_gpt2_shapes_step_through_the_app(gpt2_shaped: Path) -> None:
    from mha_tui.app.explain import ExplainApp
    from mha_tui.app.stage_view import StageView

    session = Session(hf.load(str(gpt2_shaped)), LONG)
    app = ExplainApp(session.config(0), loader=lambda config: session.trace(0), layers=session)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.trace is None:
            await pilot.pause(0.05)
        for _ in range(len(app.trace.stages) - 1):
            await pilot.press("right")
        assert app.stage_index == len(app.trace.stages) - 1
        softmax = next(i for i, stage in enumerate(app.trace.stages) if stage.kind == "softmax")
        await pilot.press("right_square_bracket", "home", *["right"] * softmax, "tab")
        assert app.config.model.layer == 1 and app.view.focus == 0
        assert app.trace.stages[app.stage_index].kind == "softmax"
        shown = app.query_one(StageView).plain
        # the focused head's matrix alone (the checks name every head's scores: roles.py)
        assert "\nhead 0  " in shown and "\nhead 1  " not in shown


def test_why_explains_a_cell_of_the_layer_shown(tiny: hf.Loaded, tiny_dir: Path) -> None:
    """--why with --hf: the cell of the layer --layer shows, recomputed and set beside the
    layer's own number (it was refused: "--why does not apply with --hf yet")."""
    session = Session(tiny, SENTENCE)
    shown = []
    for layer in (0, 1):
        result = run_cli("explain", SENTENCE, "--hf", str(tiny_dir), "--layer", str(layer),
                         "--dump", "-", "--why", "softmax[0, 1, 2, 1]")
        assert result.returncode == 0, result.stderr.decode()
        text = result.stdout.decode()
        assert text.startswith("why attn_weights[0, 1, 2, 1]  head 1, query ␣sat (row 2), "
                               "key ␣cat (column 1)"), text
        weights = _stage_of(session.trace(layer), "softmax").tensors[-1].values
        own = next(line for line in text.splitlines() if line.startswith("the module's own"))
        assert own.startswith(f"the module's own attn_weights[0, 1, 2, 1]: "
                              f"{float(weights[0, 1, 2, 1]):.4f}  ✓ equal"), own
        shown.append(own)
    assert shown[0] != shown[1]  # each layer's own number
    bad = run_cli("explain", SENTENCE, "--hf", str(tiny_dir), "--dump", "-", "--why",
                  "softmax[9, 9, 9, 9]")
    assert bad.returncode == 2 and bad.stdout == b""
    assert bad.stderr.decode().count("\n") == 1 and "outside attn_weights" in bad.stderr.decode()


def test_a_models_own_width_is_not_capped_by_the_tools_ceiling() -> None:
    """`--embed-dim` is capped at 4096 for a module built here; a `--hf` model's own C is
    not (Llama-3-70B's is 8192, 64 heads): the memory estimate decides whether it fits."""
    from mha_tui.config import Config, ConfigError, ModelSource

    model = ModelSource(name="llama-3-70b", class_name="LlamaForCausalLM", layer=40,
                        n_layers=80, vocab_size=128256, tokens=("a", "b"), ids=(1, 2))
    config = Config("a b", embed_dim=8192, num_heads=64, model=model)
    assert (config.embed_dim, config.num_heads) == (8192, 64)
    with pytest.raises(ConfigError, match="above this tool's ceiling of 4096"):
        Config("a b", embed_dim=8192, num_heads=64)
