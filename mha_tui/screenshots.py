"""`python -m mha_tui.screenshots DIR`: the SVGs of the README and the docs, from the app's own export.

Deterministic: the same trace, terminal size, theme and key presses every time.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .app.explain import ExplainApp
from .config import Config, Source
from .pipeline import comparison as compare
from .pipeline import traced
from .records import Trace
from .records.request import Request


@dataclass(frozen=True)
class TinyHf:
    """A shot of `explain --hf NAME`: a tiny random checkpoint of one family, built offline
    by tests/hf_families.py into a temporary folder and loaded from there as NAME."""

    family: str
    name: str


TINY_BERT = TinyHf("bert", "tiny-bert")


def _hf_app(shot: TinyHf) -> ExplainApp:
    import contextlib
    import tempfile

    from tests.hf_families import SENTENCE, build

    from .load.hf import load
    from .pipeline.hf import Session

    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        build(shot.family, Path(folder) / shot.name)
        session = Session(load(shot.name), SENTENCE)  # the header names it as given
        trace = session.trace(0)
    return ExplainApp(trace.config, trace=trace, layers=session)


@dataclass(frozen=True)
class Trained:
    """A shot of `explain --model induction --layer L` on a repeated sentence, at its softmax
    stage, focused on the head the scores label `label` (found from the run, never typed in);
    or, with heads=True, of `mha-tui heads` with the cursor on that head."""

    layer: int
    label: str
    heads: bool = False
    size: tuple[int, int] = (100, 32)


TRAINED_SENTENCE = "a b c d e f g h a b c d e f g h"


def _trained_app(shot: Trained) -> Any:
    from .app.heads import HeadsApp
    from .load import trained
    from .pipeline.heads import model_view
    from .pipeline.hf import Session

    loaded = trained.load("induction", TRAINED_SENTENCE)
    view = model_view(loaded, TRAINED_SENTENCE)
    role = view.labelled(shot.label)
    head = role.head if role is not None else 0
    if shot.heads:
        return HeadsApp(view, selected=(shot.layer, head))
    session = Session(loaded, TRAINED_SENTENCE)
    trace = session.trace(shot.layer)
    return ExplainApp(trace.config, trace=trace, layers=session, start="softmax", focus=head)


@dataclass(frozen=True)
class Against:
    """A shot of `explain --module MODULE --against REFERENCE` (the comparison app)."""

    module: str
    reference: str = "mygpt"


@dataclass(frozen=True)
class Quizzed:
    """A shot of `explain --quiz` (mygpt): the first `answered` questions answered on their
    stage with the answer key's own answer, or with the text `wrong` gives for them."""

    answered: int = 0
    wrong: tuple[tuple[int, str], ...] = ()
    size: tuple[int, int] = (80, 32)  # two side by side in the README: 80 wide reads well


async def _answer(pilot: Any, shot: Quizzed) -> None:
    """Type the shot's answers as a learner would: on the question's stage, then enter."""
    app = pilot.app
    await pilot.pause()
    answer_line = app.query_one("#quiz-answer")
    answer_line.cursor_blink = False  # a blink is a timing
    wrong = dict(shot.wrong)
    for number in range(shot.answered):
        question = app.quiz.current
        app.stage_index = app.stage_ids.index(question.stage)
        await pilot.pause()
        key = question.shown.split(" (")[0] if question.answer in ("token", "key") \
            else question.shown
        answer_line.value = wrong.get(number, key)
        answer_line.focus()
        await pilot.press("enter")
        await pilot.pause()


SIZE = (100, 32)
# A module written in a public model's style (issue 17's mechanisms), run the way
# `--module FILE:Class` runs it, on a sentence and sizes where its mechanism shows.
MECHANISMS = "tests/fixtures/mechanisms/"
MECHANISM_CONFIG = Config("the cat sat on the mat", embed_dim=16, num_heads=4)
# (file name, key presses from the first stage[, --model NAME or --module FILE:Class]); the
# default model is mygpt
SHOTS: list[tuple[str, list[str]] | tuple[str, list[str], str | Against | TinyHf | Quizzed | Trained]] = [
    ("01-embed.svg", []),
    ("02-project.svg", ["2"]),
    ("03-view.svg", ["3"]),
    ("04-transpose.svg", ["4"]),
    ("04b-transpose-wrong-view.svg", ["4", "w"]),
    ("07-mask.svg", ["7"]),
    ("08-softmax.svg", ["8"]),
    ("08b-softmax-head-1.svg", ["8", "tab", "tab"]),
    ("10-concat.svg", ["0"]),
    ("11-w_o.svg", ["end"]),
    ("12-why-scores.svg", ["5", "enter", "down", "down", "right", "tab"]),
    ("13-why-softmax.svg", ["8", "enter", "down", "down", "right", "tab"]),
    ("20-raschka-mask-before-scale.svg", ["6"], "raschka"),
    ("21-many-eyes-softmax-per-head.svg", ["6"], "many-eyes"),
    ("30-rotary.svg", ["5"], MECHANISMS + "llama_rotary.py:LlamaAttention"),
    ("31-shared-kv-heads.svg", ["6"], MECHANISMS + "llama_rotary.py:LlamaAttention"),
    ("32-against-no-scale-mask.svg", ["right"],
     Against("tests/fixtures/mistakes/no_scale.py:MultiHeadAttention")),
    ("33-encoder-softmax.svg", ["7", "e"], TINY_BERT),
    ("40-induction-head.svg", [], Trained(1, "induction")),
    ("41-previous-token-head.svg", [], Trained(0, "previous-token")),
    ("42-heads.svg", [], Trained(1, "induction", heads=True, size=(100, 44))),
    # six answers (project's wrong), mask's question asked; then answered wrong: revealed
    ("14-quiz-asked.svg", ["right"], Quizzed(6, ((1, "4, 4"),))),
    ("15-quiz-answered.svg", [], Quizzed(7, ((1, "4, 4"), (6, "10")))),
]


async def shoot(directory: Path) -> list[Path]:
    traces: dict[str, Trace] = {}
    written = []
    for name, keys, *model in SHOTS:
        which = model[0] if model else "mygpt"
        app: Any
        if isinstance(which, Trained):
            app = _trained_app(which)
        elif isinstance(which, Quizzed):
            trace = traces.setdefault("mygpt", traced(Request(Config("I love AI !"), Source(model="mygpt"))))
            app = ExplainApp(trace.config, trace=trace, quiz=True)
        elif isinstance(which, TinyHf):
            app = _hf_app(which)
        elif isinstance(which, Against):  # opens at the row where the two part
            from .app.compare import CompareApp

            comparison = compare(Request(Config("I love AI !"), Source(module=which.module),
                                         against=Source(model=which.reference)))
            app = CompareApp(comparison.mine.config, comparison=comparison)
        else:
            if which not in traces:
                traces[which] = traced(Request(MECHANISM_CONFIG, Source(module=which))
                                       if ".py:" in which
                                       else Request(Config("I love AI !"), Source(model=which)))
            trace = traces[which]
            app = ExplainApp(trace.config, trace=trace)
        async with app.run_test(size=which.size if isinstance(which, Quizzed | Trained) else SIZE) as pilot:
            if isinstance(which, Quizzed):
                await _answer(pilot, which)
            await pilot.press(*keys)
            # Settle: background rendering done, then the frames it asked for (the footer
            # recomposes once the keys' enabled states are known).
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.pause()
            written.append(Path(app.save_screenshot(name, path=str(directory))))
    return written


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(shoot(directory)):
        print(path)


if __name__ == "__main__":
    main()
