"""Quiz mode in the app (issue 20, item 4): a stage's numbers stay hidden until its question
is answered; right, wrong and unreadable answers; hostile text; every question kind; the
score; a snapshot of a question screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from mha_tui.app.explain import ExplainApp
from mha_tui.config import Config, Source
from mha_tui.pipeline import run_trace
from mha_tui.quiz import Question

from .conftest import default_trace
from .test_app import text_of

MECHANISMS = Path(__file__).parent / "fixtures" / "mechanisms"


def quiz_app(trace=None) -> ExplainApp:  # type: ignore[no-untyped-def]
    trace = trace or default_trace()
    return ExplainApp(trace.config, trace=trace, quiz=True)


def right_answer(question: Question) -> str:
    """What a learner who read the numbers types: the key's answer, as shown."""
    if question.answer == "token":
        return question.shown.split(" (")[0].split("·")[0]
    return question.shown


async def answer(pilot, text: str) -> None:  # type: ignore[no-untyped-def]
    answer_line = pilot.app.query_one("#quiz-answer", Input)
    answer_line.value = text
    answer_line.focus()
    await pilot.press("enter")
    await pilot.pause()


async def test_a_stage_is_hidden_until_its_question_is_answered_right() -> None:
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        shown = text_of(app)
        assert "Its numbers stay hidden until you answer the question below" in shown
        assert "embedding.weight" not in shown and "shape" not in shown
        assert app.focused is app.query_one("#quiz-answer")
        question = app.quiz.current
        assert question is not None and question.stage == "embed"
        assert "Which row of the embedding table" in text_of(app, "#quiz-question")
        await answer(pilot, right_answer(question))
        assert app.quiz.marks[-1].outcome == "right"
        assert "✓ right: 3" in text_of(app, "#quiz-mark")
        assert "embedding.weight" in text_of(app)  # revealed
        assert "1 answered, 1 of 12 right" in text_of(app, "#quiz-score")
        assert "next question: at project" in text_of(app, "#quiz-question")
        assert not app.query_one("#quiz-answer").display
        await pilot.press("right")  # the keys step again once the answer line is gone
        assert app.stage_ids[app.stage_index] == "project"
        assert "Its numbers stay hidden" in text_of(app)
        assert app.focused is app.query_one("#quiz-answer")


async def test_a_wrong_answer_shows_the_right_one_and_where_it_comes_from() -> None:
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await answer(pilot, "0")
        mark = text_of(app, "#quiz-mark")
        assert "✗ the answer is 3: ids[3] = 3: the token's id, recorded" in mark.replace("\n", " ")
        assert "embedding.weight" in text_of(app)  # revealed all the same
        assert "0 of 12 right" in text_of(app, "#quiz-score")


@pytest.mark.parametrize("text", ["three", "", "[bold red]3[/]", "3\x1b[31m", "1, 2"])
async def test_malformed_or_hostile_answers_get_no_mark_and_keep_the_stage_hidden(text: str) -> None:
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        before = app.quiz
        await answer(pilot, text)
        assert app.quiz is before and not app.quiz.marks
        assert "could not read that as a whole number" in text_of(app, "#quiz-mark")
        assert "Its numbers stay hidden" in text_of(app)
        assert app.query_one("#quiz-answer", Input).value == ""


async def test_the_cursor_cannot_open_a_hidden_stage() -> None:
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        app.set_focus(None)
        await pilot.press("enter")
        assert app.cursor is None
        assert not app.query_one("#why").display or "why this number" not in text_of(app, "#why-body")


@pytest.mark.parametrize("ref", [None, "llama_rotary.py:LlamaAttention", "alibi.py:BloomAttention"],
                         ids=["mygpt", "rotary-shared-kv", "alibi"])
async def test_every_question_answered_right_reveals_every_stage_and_a_full_score(ref) -> None:  # type: ignore[no-untyped-def]
    """Walk the whole quiz with the keys: each stage's question answered as its key says;
    every question kind of these traces is asked; the score is all right."""
    trace = default_trace() if ref is None else run_trace(
        Config("the cat sat on the mat", embed_dim=16, num_heads=4),
        Source(module=str(MECHANISMS / ref)))
    app = quiz_app(trace)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        asked = set()
        while app.quiz.current is not None:
            question = app.quiz.current
            while app.stage_ids[app.stage_index] != question.stage:
                app.set_focus(None)
                await pilot.press("right")
            asked.add(question.asks)
            await answer(pilot, right_answer(question))
            assert app.quiz.marks[-1].outcome == "right", (question, app.quiz.marks[-1])
        n = len(app.quiz.questions)
        assert f"quiz done: {n} of {n} right" in text_of(app, "#quiz-score")
        for index in range(len(trace.stages)):
            app.stage_index = index
            await pilot.pause()
            assert "stay hidden" not in text_of(app)
    expected = {None: {"lookup", "shape", "strides", "value", "divisor", "blocked", "row_sum",
                       "most_attended"},
                "llama_rotary.py:LlamaAttention": {"angle", "kv_head"},
                "alibi.py:BloomAttention": {"value", "blocked"}}[ref]
    assert expected <= asked


def test_the_question_screen(snap_compare) -> None:
    """Quiz mode at 100x32: the embed stage with its numbers hidden, its code, the question
    below with the answer line focused, the score."""

    async def still_cursor(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.pause()
        pilot.app.query_one("#quiz-answer", Input).cursor_blink = False  # a blink is a timing
        await pilot.pause()

    assert snap_compare(quiz_app(), terminal_size=(100, 32), run_before=still_cursor)


async def test_escape_leaves_the_answer_line_and_the_question_waits_where_it_is() -> None:
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await pilot.press("escape")
        assert app.focused is None
        await pilot.press("right")
        assert app.stage_ids[app.stage_index] == "project"
        assert "first answer the question at embed" in text_of(app)
        assert "next question: at embed" in text_of(app, "#quiz-question")
        await pilot.press("left")
        assert app.focused is app.query_one("#quiz-answer")
