"""mha-tui in Jupyter: a trace, one stage and a verdict shown as HTML; the walkthrough runs."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

import mha_tui
from mha_tui import notebook
from mha_tui.examples.blueprint import MultiHeadAttention as Blueprint
from mha_tui.examples.mygpt import MultiHeadAttention
from mha_tui.render.stage import stage_heading

from .conftest import ROOT, run_cli
from .fixtures.mistakes.scale_sqrt_c import MultiHeadAttention as ScaledByC

TOKENS = ["I", "love", "AI", "!"]
WALKTHROUGH = Path(ROOT) / "examples" / "walkthrough.ipynb"


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.sections: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self.sections.append(dict(attrs).get("data-stage"))

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def shown(page: str) -> _Text:
    parser = _Text()
    parser.feed(page)
    parser.close()
    return parser


def _module() -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(embed_dim=4, num_heads=2, max_seq_len=64, dropout=0.0).eval()


def test_import_mha_tui_stays_cheap() -> None:
    """`import mha_tui` loads none of torch, Rich, Textual, ipywidgets, IPython, NumPy."""
    code = ("import sys, mha_tui; heavy = {'torch', 'rich', 'textual', 'ipywidgets', 'IPython', "
            "'numpy'}; print(sorted({m.split('.')[0] for m in sys.modules} & heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_trace_shows_every_stage_as_html() -> None:
    trace = mha_tui.trace(_module(), torch.randn(1, 4, 4), TOKENS)
    assert isinstance(trace, notebook.Trace)
    page = shown(trace._repr_html_())
    assert page.sections == [stage.id for stage in trace.stages]
    text = "".join(page.parts).replace("\xa0", " ")
    for stage in trace.stages:
        assert stage_heading(trace, stage).plain in text
    bundle = trace._repr_mimebundle_()  # no kernel here: every stage, no widget
    assert bundle["text/html"] == trace._repr_html_()
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    assert repr(trace).startswith("<mha_tui trace of MultiHeadAttention: 10 stages")


def test_one_stage_shows_only_that_stage() -> None:
    trace = mha_tui.trace(_module(), torch.randn(1, 4, 4), TOKENS)
    softmax = trace.stage("softmax")
    assert softmax.kind == "softmax" and softmax.tensors == trace.stages[trace.index("softmax")].tensors
    page = shown(softmax._repr_html_())
    assert page.sections == ["softmax"]
    text = "".join(page.parts)
    assert "softmax" in text and "scores  ·" not in text
    weights = softmax.tensor("weights").values[0, 0]
    assert f"{weights[1, 0]:.4f}" in text  # the module's numbers
    with pytest.raises(KeyError, match="this trace's stages are"):
        trace.stage("rotary")


def test_stage_chooser_switches_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ipywidgets and a kernel: a dropdown, previous/next, and the chosen stage's HTML."""
    widgets = pytest.importorskip("ipywidgets", reason="ipywidgets is the [notebook] extra")
    monkeypatch.setattr(notebook, "_in_kernel", lambda: True)
    trace = mha_tui.trace(_module(), torch.randn(1, 4, 4), TOKENS)
    box = notebook.stage_chooser(trace)
    head, controls, view = box.children
    assert "tokens I=0 love=1 AI=2 !=3" in "".join(shown(head.value).parts).replace("\xa0", " ")
    previous, dropdown, following = controls.children
    assert isinstance(dropdown, widgets.Dropdown) and shown(view.value).sections == ["project"]
    dropdown.value = trace.index("softmax")
    assert shown(view.value).sections == ["softmax"]
    following.click()
    assert shown(view.value).sections == ["attend"]
    previous.click()
    previous.click()
    assert shown(view.value).sections == ["mask"]
    bundle = trace._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "text/html" in bundle


def test_show_outside_a_notebook_prints_the_text_transcript(capsys: pytest.CaptureFixture[str]) -> None:
    """No IPython shell: show() prints what `explain --dump -` would, from the same trace."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import to_text

    module, x = _module(), torch.randn(1, 4, 4)
    mha_tui.show(module, x, TOKENS)
    printed = capsys.readouterr().out
    assert printed == to_text(mha_tui.trace(module, x, TOKENS), RenderOptions()) + "\n"
    assert "7/10 softmax" in printed and "10/10 w_o" in printed


def test_user_text_is_literal_in_the_notebook() -> None:
    tokens = ["[bold]x[/bold]", "\x1b[31m", "<b>", "&lt;"]
    trace = mha_tui.trace(_module(), torch.randn(1, 4, 4), tokens)
    page = trace._repr_html_()
    assert "\x1b" not in page and "<b>" not in page
    text = "".join(shown(page).parts)
    for token in ["[bold]x[/bold]", "␛[31m", "<b>", "&lt;"]:
        assert token in text


def test_check_shows_the_verdict_of_a_wrong_module() -> None:
    torch.manual_seed(0)
    checked = mha_tui.check(ScaledByC(embed_dim=4, num_heads=2).eval())  # C from its first Linear
    assert not checked.equivalent
    assert checked.verdict.diagnosis is not None and checked.verdict.diagnosis.kind == "scaled_by_sqrt_C"
    text = "".join(shown(checked._repr_html_()).parts)
    assert "NOT equivalent" in text and "scaled_by_sqrt_C" in text
    assert mha_tui.check(_module()).equivalent  # and the right one is
    # The heads the verdict expects can be said, as with --heads: 4 heads of 1 is not this module.
    assert mha_tui.check(_module(), heads=2).equivalent
    assert not mha_tui.check(_module(), heads=4).equivalent


def test_check_of_numpy_code_matches_the_cli() -> None:
    """mha_tui.check(Blueprint(...)) judges exactly what `mha-tui check --model blueprint` does."""
    checked = mha_tui.check(Blueprint(4, 2, seed=0))
    assert "torch" not in checked.trace.recording.library
    result = run_cli("check", "--model", "blueprint", "--format", "json")
    assert result.returncode == 0, result.stderr
    cli = json.loads(result.stdout)
    from mha_tui.judge.report import verdict_json

    mine = verdict_json(checked.verdict)
    strip = [{k: row[k] for k in ("kind", "ok", "max_diff", "line", "checked")} for row in cli["stages"]]
    assert [{k: row[k] for k in ("kind", "ok", "max_diff", "line", "checked")}
            for row in mine["stages"]] == strip
    assert checked.equivalent
    # A NumPy trace shows itself too.
    trace = mha_tui.trace(Blueprint(4, 2, seed=0), np.ones((3, 4), dtype=np.float32))
    assert "head 1" in "".join(shown(trace.stage("softmax")._repr_html_()).parts)


def test_numpy_code_in_a_notebook_never_imports_torch() -> None:
    """Trace, show and check the blueprint in a fresh interpreter: torch stays out."""
    code = ("import sys, numpy as np, mha_tui\n"
            "from mha_tui.examples.blueprint import MultiHeadAttention\n"
            "module = MultiHeadAttention(4, 2, seed=0)\n"
            "trace = mha_tui.trace(module, np.ones((3, 4), dtype=np.float32))\n"
            "html = trace._repr_html_() + trace.stage('softmax')._repr_html_()\n"
            "checked = mha_tui.check(module)\n"
            "print('TORCH', 'torch' in sys.modules, checked.equivalent, 'softmax' in html)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["TORCH", "False", "True", "True"]


def test_the_walkthrough_notebook_runs() -> None:
    """examples/walkthrough.ipynb, executed by a real kernel: a stage chooser, every stage's
    title as HTML, one stage, and both verdicts."""
    nbformat = pytest.importorskip("nbformat", reason="the [notebook] extra is not installed")
    nbclient = pytest.importorskip("nbclient", reason="the [notebook] extra is not installed")
    pytest.importorskip("ipykernel", reason="the [notebook] extra is not installed")
    book = nbformat.read(WALKTHROUGH, as_version=4)
    nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": ROOT}}).execute()
    outputs = [out for cell in book.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    results = [out.data for out in outputs if out.output_type == "execute_result"]
    trace_out, stage_out, check_out, numpy_out = results
    assert "application/vnd.jupyter.widget-view+json" in trace_out
    page = shown(trace_out["text/html"])
    assert page.sections == ["project", "view", "transpose", "scores", "scale", "mask", "softmax",
                             "attend", "concat", "w_o"]
    text = "".join(page.parts)
    for title in ("Project to queries, keys and values", "Softmax: scores become weights",
                  "Output projection W_O"):
        assert title in text
    assert shown(stage_out["text/html"]).sections == ["softmax"]
    assert "equivalent to multi-head attention" in "".join(shown(check_out["text/html"]).parts)
    assert "equivalent to multi-head attention" in "".join(shown(numpy_out["text/html"]).parts)


def test_tokens_that_do_not_fit_x_are_refused_in_words() -> None:
    """Two labels for five positions: one clear error at the call, not an IndexError from
    deep inside the renderer when the notebook displays the trace (torch and NumPy alike);
    check(x=None, tokens) still builds x from the tokens."""
    said = (r"^2 tokens for the 5 positions of x, shape \(1, 5, 4\) \(T is the second-to-last "
            r"axis\): give one token per position$")
    x = torch.randn(1, 5, 4)
    for call in (lambda: mha_tui.trace(_module(), x, ["a", "b"]),
                 lambda: mha_tui.check(_module(), x, ["a", "b"]),
                 lambda: mha_tui.check(_module(), x, ["a", "b"], heads=2)):
        with pytest.raises(ValueError, match=said):
            call()
    with pytest.raises(ValueError, match=r"^2 tokens for the 5 positions of x, shape \(5, 8\)"):
        mha_tui.trace(Blueprint(8, 2, seed=0), np.ones((5, 8), dtype=np.float32), ["a", "b"])
    assert mha_tui.check(_module(), None, ["a", "b"]).verdict.equivalent


def test_the_notebook_enters_the_pipeline_through_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """mha_tui.trace and mha_tui.check build a Request whose source is the very module object
    given (a `Given`), and hand it to the pipeline's door (`traced`, `checked`), as the CLI does."""
    from mha_tui import pipeline
    from mha_tui.records.request import Given, Request

    seen: list[Request] = []
    for name in ("traced", "checked"):
        door = getattr(pipeline, name)
        monkeypatch.setattr(pipeline, name, lambda request, _door=door, **kw: (
            seen.append(request), _door(request, **kw))[1])
    module = _module()
    x = torch.randn(1, 4, 4, generator=torch.Generator().manual_seed(1))  # (B, T, C)
    mha_tui.trace(module, x, TOKENS)
    mha_tui.check(module, x, TOKENS, causal=False)
    assert [type(r.source) for r in seen] == [Given, Given]
    assert all(r.source.module is module and r.source.x is x for r in seen)
    assert seen[0].source.causal is None and seen[1].source.causal is False  # called as given; as the CLI
    assert seen[0].config.tokens == tuple(TOKENS) and seen[0].config.num_heads == 2  # read from the module


def test_a_given_module_is_judged_by_the_pipeline_as_the_notebook_judges_it() -> None:
    """pipeline.verdict on a hand-built Request of a Given module (what a caller other than the
    notebook would build) gives the notebook's verdict: a wrong scale found, a right module passed."""
    from mha_tui import pipeline
    from mha_tui.records.request import Given, Request

    x = torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(2))  # (B, T, C)
    for module in (ScaledByC(embed_dim=4, num_heads=2).eval(), _module()):
        given = Given(module, x, causal=True)
        verdict = pipeline.verdict(Request(pipeline.given_config(module, x), given))
        checked = mha_tui.check(module, x)
        assert verdict.equivalent == checked.equivalent
        assert [(r.kind, r.ok, r.max_diff) for r in verdict.stages] == \
            [(r.kind, r.ok, r.max_diff) for r in checked.verdict.stages]
    assert not pipeline.verdict(Request(pipeline.given_config(ScaledByC(4, 2), x),
                                        Given(ScaledByC(4, 2), x, causal=True))).equivalent
