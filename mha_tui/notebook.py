"""mha-tui in a Jupyter notebook: a trace, one stage, or a verdict, shown as HTML.

`mha_tui.trace(...)` returns a `Trace` from here (a `records.Trace` that knows how to show
itself); `mha_tui.show(...)` traces and displays; `mha_tui.check(...)` judges a module and
returns a `Checked` that displays its verdict table. Every picture is `mha_tui.write.pictures`'
HTML: Rich's export of the very renderables the app and the transcripts draw.

With ipywidgets installed and a kernel running, a trace shows a stage chooser (a dropdown
and previous/next buttons); the same output also carries every stage as plain HTML, which is
what a notebook viewer without widgets (or a saved notebook) shows.

Importing this module is cheap: Rich, ipywidgets, IPython and torch load only when something
is drawn or run. Never import textual or typer here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from . import records

if TYPE_CHECKING:
    from .config import Config
    from .judge import Verdict
    from .records.request import Request
    from .render.options import RenderOptions

WIDTH = 100  # columns the pictures are drawn at (a notebook's output area holds about this)
DEFAULT_SENTENCE = "I love AI !"
# Where a module keeps its width C, as the loader fills constructor arguments by name.
_WIDTH_NAMES = ("embed_dim", "d_model", "d_in", "n_embd", "d_out")


def _options() -> RenderOptions:
    from .render.options import RenderOptions

    return RenderOptions()


def _mimebundle(html_text: str, plain: str) -> dict[str, str]:
    return {"text/html": html_text, "text/plain": plain}


@dataclass(frozen=True, eq=False, repr=False)
class Stage(records.Stage):
    """One stage that shows itself in Jupyter (with its place in the trace)."""

    shown_in: records.Trace | None = field(default=None, compare=False)

    def _repr_html_(self) -> str:
        from .write.pictures import picture_console, stage_section

        assert self.shown_in is not None
        plain = self.shown_in.stages[self.shown_in.index(self.id)]
        return stage_section(self.shown_in, plain, _options(), picture_console(WIDTH))

    def __repr__(self) -> str:
        return f"<mha_tui stage {self.id}: {self.title}  {self.transition}>"


@dataclass(frozen=True, eq=False, repr=False)
class Trace(records.Trace):
    """A trace that shows itself in Jupyter: every stage in order, or a stage chooser."""

    @classmethod
    def of(cls, trace: records.Trace) -> Trace:
        """The same trace (the same records, nothing copied) as a Trace that shows itself."""
        if isinstance(trace, cls):
            return trace
        return cls(**{f.name: getattr(trace, f.name) for f in fields(records.Trace)})

    def stage(self, stage_id: str) -> Stage:
        """The stage with this id, or the first of this kind (`trace.stage("softmax")`)."""
        found = next((s for s in self.stages if s.id == stage_id), None) or next(
            (s for s in self.stages if s.kind == stage_id), None)
        if found is None:
            raise KeyError(f"{stage_id!r}: this trace's stages are "
                           f"{', '.join(s.id for s in self.stages)}")
        values = {f.name: getattr(found, f.name) for f in fields(records.Stage)}
        return Stage(**values, shown_in=self)

    def stage_html(self, index: int) -> str:
        """Stage `index` (from 0) as an HTML section."""
        from .write.pictures import picture_console, stage_section

        return stage_section(self, self.stages[index], _options(), picture_console(WIDTH))

    def head_html(self) -> str:
        from .write.pictures import head_section, picture_console

        return head_section(self, _options(), picture_console(WIDTH))

    def _repr_html_(self) -> str:
        """The header, then every stage in order."""
        from .write.pictures import head_section, picture_console, stage_section

        console, opts = picture_console(WIDTH), _options()
        parts = [head_section(self, opts, console)]
        parts += [stage_section(self, stage, opts, console) for stage in self.stages]
        return f'<div class="mha-tui-trace">{"".join(parts)}</div>'

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """A stage chooser where widgets can run, and every stage as HTML for everything else."""
        bundle = _mimebundle(self._repr_html_(), repr(self))
        chooser = stage_chooser(self)
        if chooser is not None:
            widget_bundle = chooser._repr_mimebundle_(include=include, exclude=exclude) or {}
            bundle.update({k: v for k, v in widget_bundle.items() if k != "text/plain"})
        return bundle

    def __repr__(self) -> str:
        what = self.module.class_name if self.module else "a module"
        return (f"<mha_tui trace of {what}: {len(self.stages)} stages "
                f"({', '.join(s.id for s in self.stages)})>")


def trace_of(module: Any, x: Any, tokens: Sequence[str] | None = None, *, context: Any = None,
             context_tokens: Sequence[str] | None = None, decode: int = 0,
             config: Config | None = None, **options: Any) -> Trace:
    """`mha_tui.trace`: the module given, as a `Request` (its source a `Given`), traced by
    the pipeline (`pipeline.traced`: load -> trace -> recognise) and returned as a `Trace`
    that shows itself in a notebook. `show` traces through here too."""
    from . import pipeline

    return Trace.of(pipeline.traced(_request(module, x, tokens, context=context,
                                             context_tokens=context_tokens, decode=decode,
                                             config=config, options=options)))


def _request(module: Any, x: Any, tokens: Sequence[str] | None, *, context: Any = None,
             context_tokens: Sequence[str] | None = None, decode: int = 0,
             config: Config | None = None, options: dict[str, Any] | None = None,
             causal: bool | None = None) -> Request:
    """The Request for a module given in Python: its sizes `config` (by default read from the
    module and x, `pipeline.given_config`), a `Given` source, `decode` steps."""
    from .pipeline import given_config
    from .records.request import Given, Request

    options = options or {}
    given = Given(module, x, None if tokens is None else tuple(tokens), context=context,
                  context_tokens=None if context_tokens is None else tuple(context_tokens),
                  options=options, causal=causal)
    if config is None:
        config = given_config(module, x, tokens, embedding=options.get("embedding"),
                              ids=options.get("ids"))
    return Request(config, given, steps=decode)


def _in_kernel() -> bool:
    """A Jupyter kernel is running this code (widgets need one to talk to)."""
    import sys

    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def stage_chooser(trace: Trace) -> Any:
    """An ipywidgets box: a dropdown of stages, previous/next, and the chosen stage's HTML.
    None when ipywidgets is not installed or no kernel runs (then every stage is shown)."""
    if not _in_kernel():
        return None
    try:
        import ipywidgets as widgets
    except ImportError:
        return None
    from .render.stage import stage_heading

    labels = [(stage_heading(trace, stage).plain, index) for index, stage in enumerate(trace.stages)]
    cache: dict[int, str] = {}

    def section(index: int) -> str:
        if index not in cache:
            cache[index] = trace.stage_html(index)
        return cache[index]

    chooser = widgets.Dropdown(options=labels, value=0, description="stage",
                               layout=widgets.Layout(width="60%"))
    previous = widgets.Button(description="◀ previous", layout=widgets.Layout(width="auto"))
    following = widgets.Button(description="next ▶", layout=widgets.Layout(width="auto"))
    view = widgets.HTML(value=section(0))

    def changed(change: dict[str, Any]) -> None:
        view.value = section(change["new"])

    def step(by: int) -> None:
        chooser.value = min(max(chooser.value + by, 0), len(labels) - 1)

    chooser.observe(changed, names="value")
    previous.on_click(lambda _button: step(-1))
    following.on_click(lambda _button: step(1))
    return widgets.VBox([widgets.HTML(value=trace.head_html()),
                         widgets.HBox([previous, chooser, following]), view])


def display(obj: Any) -> None:
    """IPython's display in a notebook; elsewhere the object's text."""
    import sys

    if "IPython" in sys.modules:
        from IPython import get_ipython
        from IPython.display import display as ipython_display

        if get_ipython() is not None:
            ipython_display(obj)
            return
    print(text_of(obj))


def text_of(obj: Any) -> str:
    """What a terminal shows for a trace, a stage or a verdict: the text transcript's drawing."""
    from .write.dump import to_text

    if isinstance(obj, Trace):
        return to_text(obj, _options())
    if isinstance(obj, Stage) and obj.shown_in is not None:
        index = obj.shown_in.index(obj.id)
        return to_text(obj.shown_in, _options(), first=index, last=index + 1)
    if isinstance(obj, Checked):
        from .write.pictures import plain_text

        return plain_text([obj.renderable()], _options(), WIDTH)
    return repr(obj)


# ---------------------------------------------------------------- check


@dataclass(frozen=True)
class Checked:
    """A module's verdict (`mha_tui.check`), shown as the table `mha-tui check` prints."""

    verdict: Verdict
    trace: Trace

    @property
    def equivalent(self) -> bool:
        return self.verdict.equivalent

    def renderable(self) -> Any:
        from .judge.report import verdict_renderable

        return verdict_renderable(self.verdict)

    def _repr_html_(self) -> str:
        from .write.pictures import html_fragment, picture_console

        return html_fragment(picture_console(WIDTH), [self.renderable()], _options())

    def __repr__(self) -> str:
        state = "equivalent" if self.verdict.equivalent else "NOT equivalent"
        return f"<mha_tui check of {self.verdict.module}: {state}>"


def _width_of(module: Any) -> int:
    """The module's width C: an attribute named as the loader's constructor arguments, else
    the input width of its first torch linear layer."""
    for name in _WIDTH_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    for layer in getattr(module, "modules", lambda: ())():
        value = getattr(layer, "in_features", None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"{type(module).__name__}: give x, the input to judge the module on "
                     f"(no attribute {', '.join(_WIDTH_NAMES)} nor a linear layer says its width C)")


def _words(tokens: Sequence[str] | None, sentence: str) -> list[str]:
    return list(tokens) if tokens is not None else sentence.split()


def check(module: Any, x: Any = None, tokens: Sequence[str] | None = None, *,
          heads: int | None = None, causal: bool = True, seed: int = 0,
          sentence: str = DEFAULT_SENTENCE, context: Any = None,
          context_tokens: Sequence[str] | None = None, decode: int = 0) -> Checked:
    """Judge `module` stage by stage, as `mha-tui check` does (the same `pipeline` judging),
    and return the verdict.

    x: its input, (B, T, C) for torch, (T, C) for NumPy; by default the tokens of `sentence`
    looked up in a random table drawn from `seed` (for NumPy the blueprint's table, as
    `mha-tui check` draws it), C read from the module's `embed_dim`, `d_model`, `d_in`,
    `n_embd` or `d_out`, else from its first linear layer. A forward parameter named `mask` or
    `attn_mask` gets the causal mask (none with causal=False), and (query, key, value)
    get x three times, as the CLI calls a module. heads: the number of heads h the verdict
    expects (as `--heads`); by default the module's `num_heads`, `n_head`, `n_heads`, `nhead`
    or `h`, else 1. The module is run, never edited. context: cross-attention's second
    sequence (B, T_k, C), given to the forward's parameter for it and to the reference, which
    then takes its keys and values from it (no causal mask across two sequences);
    context_tokens label it. decode: generate the last `decode` tokens one at a time against
    the module's KV cache (as `check --decode N`): each step must equal the full forward's
    row, and a second run after the module's reset the first; the Checked's trace is the
    first step's, its `steps` every step's.
    """
    words = _words(tokens, sentence)
    options: dict[str, Any] = {}
    if x is None:  # the sentence's tokens, looked up in a table drawn from seed (global RNG untouched)
        x, options = _sentence_input(module, words, seed)
    labels = _labels(words, tokens, x)
    if not _is_torch_module(module):  # NumPy code: one sequence, one forward
        context = context_tokens = None
        decode = 0
    request = _request(module, x, labels, context=context, context_tokens=context_tokens,
                       decode=decode, config=_config(x, labels, heads, seed), options=options,
                       causal=causal)
    from .pipeline import checked

    traced, judged = checked(request)
    trace = traced(request.config)
    return Checked(judged(trace), Trace.of(trace))


def _sentence_input(module: Any, words: list[str], seed: int) -> tuple[Any, dict[str, Any]]:
    """x for `check` when none is given: the words' ids looked up in a table drawn from seed
    (NumPy code: the blueprint's table, as `mha-tui check` draws it), C the module's width;
    and the lookup, for the tracer to show (torch: embedding and ids; NumPy: table and ids)."""
    from .config import Config

    if not _is_torch_module(module):
        import numpy as np

        from .load.numpy_modules import embedding_table

        config = Config(" ".join(words), embed_dim=_width_of(module), num_heads=1, seed=seed)
        table, ids = embedding_table(config), np.array(config.ids)  # as the blueprint builds x
        return table[ids], {"table": table, "ids": ids}  # x: (T, C)
    import torch

    config = Config(" ".join(words), embed_dim=_width_of(module), num_heads=1)
    table = torch.randn(len(config.vocab), config.embed_dim,
                        generator=torch.Generator().manual_seed(seed))  # (V, C)
    embedding = torch.nn.Embedding.from_pretrained(table)
    ids = torch.tensor([config.ids])  # (1, T)
    with torch.no_grad():
        x = embedding(ids)  # (1, T, C)
    return x, {"embedding": embedding, "ids": ids}


def _config(x: Any, labels: Sequence[str] | None, heads: int | None, seed: int) -> Config | None:
    """The run's sizes when heads is given (otherwise `pipeline.given_config` reads them from
    the module and x)."""
    if heads is None:
        return None
    from .config import Config

    T, C = int(x.shape[-2]), int(x.shape[-1])
    words = list(labels) if labels is not None else [f"t{i}" for i in range(T)]
    sentence = " ".join(w if w.strip() and not any(c.isspace() for c in w) else "_" for w in words)
    return Config(sentence, embed_dim=C, num_heads=heads, seed=seed, max_seq_len=max(64, T))


def _labels(words: list[str], tokens: Sequence[str] | None, x: Any) -> list[str] | None:
    """The T axis's labels: the tokens given (one per position of x, else refused), or the
    sentence's words when they fit x, else t0, t1, ..."""
    if len(words) == x.shape[-2]:
        return words
    if tokens is not None:
        from .config import check_token_count

        check_token_count(words, tuple(x.shape))  # raises ConfigError: they do not fit
    return None


def _is_torch_module(module: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(module, torch.nn.Module)


def show(module: Any, x: Any, tokens: Sequence[str] | None = None, **options: Any) -> None:
    """Trace `module` on `x` (as `mha_tui.trace`) and display it: in a notebook every stage
    (or a stage chooser with ipywidgets), elsewhere the text transcript."""
    display(trace_of(module, x, tokens, **options))
