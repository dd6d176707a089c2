"""The header: the sentence and its tokens, the sizes, the model's line (`--hf`) and the
module's line (class and file). Never import torch, textual or typer here.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.text import Text

from ..config import Config
from ..records import ModuleInfo, Trace
from .options import RenderOptions
from .text import label

# An --hf encoder (BERT, T5's encoder) in the header: its attention has no causal mask.
ENCODER = "encoder: every token sees every token"


def encoder_half(model_type: str) -> str:
    """What an encoder-decoder's header says without --context: which half is shown."""
    return (f"{model_type} is an encoder-decoder: this is its encoder, self-attention over the "
            f"sentence; --context SENTENCE shows its decoder's cross-attention")


def module_heads(trace: Trace) -> int | None:
    """The head count the module itself split into: the h axis of its first split into heads
    (the most heads there, for shared K/V heads), read from the recorded tensors; None
    when no stage splits into heads."""
    for stage in trace.stages:
        heads = [t.values.shape[t.dims.index("h")] for t in stage.tensors
                 if "h" in t.dims and t.values.ndim == len(t.dims)]
        if heads:
            return max(heads)
    return None


def drawn_config(trace: Trace) -> Config:
    """The trace's config with the module's own head count, as its tensors are labelled (a
    module with `self.h = 4` written in splits into 4 heads whatever --heads says)."""
    heads, config = module_heads(trace), trace.config
    if config.model is not None or heads is None or heads == config.num_heads or \
            config.embed_dim % heads:
        return config
    return replace(config, num_heads=heads)


_BLOCKS = {"causal": "causal", "padding": "padding mask",
           "causal+padding": "causal + padding mask", "none": "no mask",
           "other": "a mask (neither causal nor padding)"}


def masking(trace: Trace) -> str | None:
    """What the module did about masking, read from its stages (a mask stage's `blocks`: what
    the mask op wrote), never from --causal: `causal`, `padding mask`, `window mask
    (w = 3)`, `no mask`; with the flag's word where the module did otherwise. None for a
    trace that cannot say (no stages: the app's first frame)."""
    if not trace.stages:
        return None
    found = [s.blocks or "other" for s in trace.stages if s.kind == "mask"]
    did = next((b for b in found if b != "none"), "none" if found or not trace.failed else "")
    if not did:
        return "no mask before the error"
    word = (f"window mask (w = {did.split()[1]})" if did.startswith("window ")
            else _BLOCKS.get(did, "a mask"))
    causal_flag = trace.config.causal
    if did == "none" and causal_flag and not trace.config.cross:
        return f"{word} (the module applies none)"
    if did != "none" and not causal_flag and "causal" in did:
        return f"{word} (the module's own; --no-causal ignored)"
    return word


def _sizes(config: Config, batched: bool = True, asked: int | None = None,
           masked: str | None = None) -> Text:
    if config.model is not None:  # C, h and d_h are on the model's line
        lengths = (f"T_q={config.T_q} T_k={config.T_k} ({len(config.cached)} cached)"
                   if config.cached else
                   f"T_q={config.T_q} T_k={config.T_k} cross-attention"
                   if config.cross else f"T={config.seq_len}")  # cross: an encoder-decoder's decoder
        sizes = Text(f"{'B=1 ' if batched else ''}{lengths}", style="cyan", end="")
        if config.model.encoder:  # said where a toy module's header says causal or no mask
            sizes.append(f" {ENCODER}", style="bold cyan")
        if config.model.encoder_of:  # one half of an encoder-decoder: where the other is
            sizes.append(f" ({encoder_half(config.model.encoder_of)})", style="cyan")
        return sizes
    own = f" (the module's own; --heads {asked})" if asked not in (None, config.num_heads) else ""
    # Cross-attention: the queries' and the keys' lengths; no causal mask across sequences.
    lengths = (f"T_q={config.T_q} T_k={config.T_k}" if config.cross
               else f"T_q={config.T_q} T_k={config.T_k} ({len(config.cached)} cached)"
               if config.cached else f"T={config.seq_len}")
    flag = "causal" if config.causal else "no mask"
    mask = (f"cross-attention, {masked}" if config.cross and masked else "cross-attention"
            if config.cross else "decoding" if config.cached else masked or flag)
    B = len(config.rows)
    dtype = f" {config.dtype}" if config.dtype else ""  # --dtype: what the module ran in
    return Text(f"{f'B={B} ' if batched else ''}{lengths} C={config.embed_dim} h={config.num_heads} "
                f"d_h={config.head_dim}{own} seed={config.seed} {mask}{dtype}", style="cyan",
                end="")


def _token_list(config: Config, opts: RenderOptions, room: int) -> Text:
    """`the=0 cat=1 …`, as many tokens as fit in room cells, then how many are left out."""
    tokens = list(zip(config.tokens, config.ids, strict=True))
    gap = "..." if opts.ascii else "…"
    text = Text(no_wrap=True, end="")
    for i, (token, token_id) in enumerate(tokens):
        item = Text.assemble(label(token, ascii_only=opts.ascii, style="bold"),
                             (f"={token_id}", "dim"))
        rest = len(tokens) - i - 1
        marker = f" {gap} (+{rest})" if rest else ""
        need = text.cell_len + (1 if i else 0) + item.cell_len
        # Keep this token if it fits with the marker the tokens after it would need.
        if need + len(marker) > room and not (rest == 0 and need <= room):
            text.append(f"{' ' if i else ''}{gap} (+{len(tokens) - i})", style="dim")
            return text
        if i:
            text.append(" ")
        text.append_text(item)
    return text


def header(config: Config, opts: RenderOptions, width: int | None = None, *,
           batched: bool = True, max_lines: int = 3, asked: int | None = None,
           masked: str | None = None) -> RenderableType:
    """Sentence, tokens with their ids, and B, T, C, h, d_h, at most max_lines of width.

    The sizes are always shown whole; the sentence and the token list give way (cut with an
    ellipsis, tokens elided with a count). Without a width, the header is laid out at the
    width it is drawn at (the app's header follows the terminal's size). batched: False for
    a module whose x has no batch axis (NumPy's (T, C)): no B then. asked: --heads, when
    config (`drawn_config`) holds the module's own head count instead (said beside it).
    masked: what the module did about masking (`masking(trace)`); without it, what --causal
    asked (before a trace exists).
    """
    if width is None:
        return Header(config, opts, batched, max_lines, asked, masked)
    if config.model is None:
        return _sentence_and_sizes(config, opts, width, batched, max_lines, asked, masked)
    body = _sentence_and_sizes(config, opts, width, batched, max(1, max_lines - 1))
    return Text("\n").join([model_line(config, opts, width), body])


def model_line(config: Config, opts: RenderOptions, width: int | None = None) -> Text:
    """`--hf`: the model, its attention module, the layer shown and the model's sizes.

    When it does not fit the width, the layer and sizes come first and the names are cut."""
    model = config.model
    assert model is not None
    names = Text("model ", style="dim", end="")
    name = model.name
    if len(name) > 40:  # a long path: its end names the model
        names.append("..." if opts.ascii else "…", style="bold")
        name = name[-39:]
    names.append_text(label(name, max_cells=40, ascii_only=opts.ascii, style="bold"))
    names.append(f" ({model.class_name})", style="dim")
    if model.attention:
        names.append(f"  {model.attention}", style="dim")
    sizes = Text.assemble((f"layer {model.layer}", "bold"), (f" of 0-{model.n_layers - 1}", "dim"),
                          (f"  C={config.embed_dim} h={config.num_heads} d_h={config.head_dim} "
                           f"vocab={model.vocab_size} layers={model.n_layers}", "cyan"),
                          ("  ", ""), (model.dtype_words(), "bold cyan"), end="")
    line = Text.assemble(names, "  ", sizes, no_wrap=True, end="")
    if width is None or line.cell_len <= width:
        return line
    line = Text.assemble(sizes, "  ", names, no_wrap=True, end="")
    line.truncate(width, overflow="ellipsis")
    return line


def _sentence_and_sizes(config: Config, opts: RenderOptions, width: int, batched: bool,
                        max_lines: int, asked: int | None = None, masked: str | None = None
                        ) -> Text:
    sizes = _sizes(config, batched, asked, masked)
    sentence = Text("sentence ", style="dim", no_wrap=True, end="")
    sentence.append_text(label(config.sentence, max_cells=max(1, min(40, width - 9)),
                               ascii_only=opts.ascii))
    for row in config.batch:  # a padded batch's other rows (--batch)
        sentence.append("  batch ", style="dim")
        sentence.append_text(label(row, max_cells=max(1, min(40, width - 9)), ascii_only=opts.ascii))
    if config.cross:  # the keys' and values' sentence (its tokens label the T_k axes)
        sentence.append("  context ", style="dim")
        sentence.append_text(label(config.context or " ".join(config.key_tokens),
                                   max_cells=max(1, min(40, width - 9)), ascii_only=opts.ascii))
    tokens = Text("tokens ", style="dim", no_wrap=True, end="")
    tokens.append_text(_token_list(config, opts, max(1, width - 7)))
    one = Text.assemble(sentence, "   ", tokens, "   ", sizes, no_wrap=True)
    if one.cell_len <= width:
        return one
    lines = [sentence, tokens]
    if tokens.cell_len + 3 + sizes.cell_len <= width:
        lines[1] = Text.assemble(tokens, "   ", sizes, no_wrap=True, end="")
    elif sentence.cell_len + 3 + sizes.cell_len <= width:
        lines[0] = Text.assemble(sentence, "   ", sizes, no_wrap=True, end="")
    elif sizes.cell_len <= width:
        lines.append(sizes)
    else:  # the sizes need two lines: the token list already spells out the sentence
        lines = [tokens, sizes]
    if len(lines) > max_lines and lines[0] is sentence:
        lines = lines[1:]  # the token list already spells out the sentence
    return Text("\n").join(lines)


def trace_header(trace: Trace, opts: RenderOptions, width: int | None = None, *,
                 max_lines: int = 3, step: bool = True) -> RenderableType:
    """The header of a trace: its sizes as the module split them (`drawn_config`), with
    --heads beside them when the module's own head count differs; a decode step's line
    under it (step: False leaves it to the caller)."""
    drawn = header(drawn_config(trace), opts, width, batched=trace.batched, max_lines=max_lines,
                   asked=trace.config.num_heads, masked=masking(trace))
    if step and trace.step is not None:
        return Group(drawn, step_line(trace, opts))
    return drawn


def step_line(trace: Trace, opts: RenderOptions) -> Text:
    """`--decode`: which step this is, the new token and where it stands, and the cache."""
    step = trace.step
    assert step is not None
    line = Text()
    line.append(f"decode step {step.index + 1} of {step.steps}", style="bold")
    line.append("  new token ", style="dim")
    line.append_text(label(" ".join(trace.config.tokens), max_cells=20, ascii_only=opts.ascii,
                           style="bold"))
    line.append(f" at position {step.position}, after a prompt of {step.prefill} "
                f"token{'s' if step.prefill != 1 else ''}", style="dim")
    line.append(f"  {step.style}", style="cyan")
    return line


class Header:
    """The header laid out at the width it is given when drawn."""

    def __init__(self, config: Config, opts: RenderOptions, batched: bool = True,
                 max_lines: int = 3, asked: int | None = None, masked: str | None = None) -> None:
        self.config, self.opts, self.batched, self.max_lines = config, opts, batched, max_lines
        self.asked, self.masked = asked, masked

    def _text(self, width: int) -> RenderableType:
        return header(self.config, self.opts, width, batched=self.batched,
                      max_lines=self.max_lines, asked=self.asked, masked=self.masked)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._text(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._text(options.max_width))


@cache
def _installed_roots() -> list[str]:
    """The folders installed packages live in (site-packages), longest first."""
    import os
    import site
    import sysconfig

    roots = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    roots.update(getattr(site, "getsitepackages", list)())
    roots.add(site.getusersitepackages())
    return sorted((os.path.abspath(root) for root in roots if root), key=len, reverse=True)


def display_path(path: str) -> str:
    """A module's file as a reader finds it: inside mha-tui's package, inside an installed
    package (`transformers/models/bert/modeling_bert.py`, as the package names it, wherever it
    is installed), under the current folder, or absolute. Deterministic for the built-in
    modules wherever mha-tui is installed."""
    import os

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # mha_tui/
    absolute = os.path.abspath(path) if path else ""
    if absolute.startswith(package + os.sep):
        return "mha_tui/" + os.path.relpath(absolute, package).replace(os.sep, "/")
    for root in _installed_roots():
        if absolute.startswith(root + os.sep):
            return os.path.relpath(absolute, root).replace(os.sep, "/")
    cwd = os.getcwd()
    if absolute.startswith(cwd + os.sep):
        return os.path.relpath(absolute, cwd)
    return absolute


def module_line(info: ModuleInfo, opts: RenderOptions) -> Text:
    """Which module was explained: its class and the file its forward came from."""
    text = Text.assemble(("module ", "dim"), (info.class_name, "bold"), ("  file ", "dim"))
    text.append_text(label(display_path(info.file), max_cells=200, ascii_only=opts.ascii))
    if info.per_head_modules:
        text.append("  (each head ran as its own module)", style="dim")
    if info.weights:
        text.append("  weights ", style="dim")
        text.append_text(label(display_path(info.weights), max_cells=200, ascii_only=opts.ascii))
    return text
