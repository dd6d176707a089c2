"""`mha-tui heads --dump`: the model view in every transcript format, drawn by render.heads;
each writer is the `heads` column of its row in `write.FORMATS`.

Text, SVG, HTML and Markdown print the same renderables (`render.heads.heads_view`) the app's
heads screen shows; JSON holds the numbers: every head's weights, scores, the entries each
score averages, its label, the predictions and the ablation. Deterministic, like every
transcript (a private Console that ignores the environment). Never import torch, textual or
typer here.
"""

from __future__ import annotations

import html
import io
from typing import Any

import orjson

from ..render.heads import heads_view
from ..render.options import ASCII_GLYPHS, RenderOptions
from ..roles import KINDS, LABEL_THRESHOLD, ModelView, Predictions
from .dump import transcript_console
from .pictures import _PAGE, APP_THEME, SVG_FORMAT, fenced, html_fragment, picture_console, plain_text

TITLE = "mha-tui heads"


def to_text(view: ModelView, opts: RenderOptions, width: int = 100, color: bool = False,
            selected: tuple[int, int] | None = None) -> str:
    buffer = io.StringIO()
    transcript_console(buffer, width, color).print(heads_view(view, opts, selected))
    text = "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"
    if opts.ascii:
        text = text.translate(ASCII_GLYPHS).encode("ascii", "backslashreplace").decode("ascii")
    return text


def to_svg(view: ModelView, opts: RenderOptions, width: int = 100, color: bool = False,
           selected: tuple[int, int] | None = None) -> str:
    console = picture_console(width)
    console.print(heads_view(view, opts, selected))
    svg = console.export_svg(title=TITLE, theme=APP_THEME, code_format=SVG_FORMAT)
    return svg.translate(ASCII_GLYPHS) if opts.ascii else svg


def to_html(view: ModelView, opts: RenderOptions, width: int = 100, color: bool = False,
            selected: tuple[int, int] | None = None) -> str:
    body = html_fragment(picture_console(width), [heads_view(view, opts, selected)], opts)
    return _PAGE.format(title=html.escape(TITLE), background=APP_THEME.background_color.hex,
                        foreground=APP_THEME.foreground_color.hex, body=body)


def to_markdown(view: ModelView, opts: RenderOptions, width: int = 100, color: bool = False,
                selected: tuple[int, int] | None = None) -> str:
    return "\n\n".join(["# mha-tui heads",
                        "Every head of every layer, scored from this run's own attention weights.",
                        fenced(plain_text([heads_view(view, opts, selected)], opts, width), "text")]
                       ) + "\n"


def _predictions(p: Predictions | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"loss": p.loss, "top": list(p.top), "top_words": list(p.top_words),
            "top_probability": list(p.top_probability), "copyable": list(p.copyable),
            "accuracy": p.accuracy}


def document(view: ModelView) -> dict[str, Any]:
    """The model view as plain JSON data: what every number on screen was made from."""
    first = view.roles[0][0] if view.roles and view.roles[0] else None
    return {
        "model": view.name, "class": view.class_name, "tokens": list(view.tokens),
        "ids": list(view.ids), "layers": view.n_layers, "heads": view.num_heads,
        "repeated": view.repeated, "label_threshold": LABEL_THRESHOLD,
        "scores": {score.kind: {"formula": score.formula,
                                "entries": [[i, list(keys)] for i, keys in score.entries]}
                   for score in (first.scores if first else ())},
        "roles": [{"layer": role.layer, "head": role.head, "label": role.label,
                   "attention": view.sources[role.layer],
                   "scores": {kind: role.score(kind).value for kind in KINDS},
                   "weights": view.weights[role.layer][role.head].tolist()}
                  for layer in view.roles for role in layer],
        "predictions": _predictions(view.predictions),
        "ablation": None if view.ablation is None else {
            "layer": view.ablation.layer, "head": view.ablation.head,
            "method": view.ablation.method, "projection": view.ablation.projection,
            "after": _predictions(view.ablation.after)},
    }


def to_json(view: ModelView, opts: RenderOptions, width: int = 100, color: bool = False,
            selected: tuple[int, int] | None = None) -> str:
    if opts.ascii:  # every non-ASCII character as a \u escape: orjson writes UTF-8 only
        import json

        return json.dumps(document(view), indent=2, ensure_ascii=True) + "\n"
    return orjson.dumps(document(view), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"

