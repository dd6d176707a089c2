"""Quiz mode in the app (issue 20, item 4): a stage's numbers stay hidden until its question
is answered; right, wrong and unreadable answers; hostile text; every question kind; the
score; a snapshot of a question screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Input

from mha_tui.app.explain import ExplainApp
from mha_tui.app.widgets import StageRail
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
        assert "[embed] ✓ right: 3" in text_of(app, "#quiz-mark")  # which question it marks
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
        assert "[embed] ✗ you answered 0; the answer is 3: ids[3] = 3: the token's id, recorded" \
            in " ".join(mark.split())
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


async def test_a_wrong_answer_is_repeated_literally_and_short() -> None:
    """The mark repeats what was typed: as text (never markup, no control character), its
    blanks as one, cut at 40 cells."""
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await answer(pilot, "  7   ")
        mark = " ".join(text_of(app, "#quiz-mark").split())
        assert "✗ you answered 7; the answer is 3" in mark
    from mha_tui.kinds._parts.quizzing import Marked
    from mha_tui.write.quiz_view import GIVEN_CELLS, mark_text

    long = mark_text(Marked("wrong", "the answer is 3", "1" * 100 + "\x1b[31m")).plain
    assert "1" * (GIVEN_CELLS - 1) + "…;" in long and "\x1b" not in long
    markup = mark_text(Marked("wrong", "the answer is 3", "[bold]7[/bold]\x1b[31m")).plain
    assert "you answered [bold]7[/bold]" in markup and "\x1b" not in markup


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


def rail_marks(app: ExplainApp) -> dict[str, str]:
    """Each stage's entry on the rail, as drawn: its mark (the character before its name)."""
    rail = app.query_one(StageRail)
    marks = {}
    for index in range(rail.option_count):
        option = rail.get_option_at_index(index)
        if option.id in app.stage_ids:
            prompt = str(option.prompt)
            marks[option.id] = prompt[:-len(option.id)].split()[1:] or [" "]
    return {stage: mark[0] for stage, mark in marks.items()}


def counts(app: ExplainApp) -> str:
    """The score line's counts of right, wrong and open questions, by the rail's marks."""
    return " ".join(text_of(app, "#quiz-score").split()).split("right ", 1)[1]


async def walk_to(pilot, stage: str) -> None:  # type: ignore[no-untyped-def]
    """Answer every question before `stage`'s right, stepping with the keys."""
    app = pilot.app
    while app.quiz.current is not None and app.quiz.current.stage != stage:
        question = app.quiz.current
        while app.stage_ids[app.stage_index] != question.stage:
            app.set_focus(None)
            await pilot.press("right")
        await answer(pilot, right_answer(question))
    app.set_focus(None)
    while app.stage_ids[app.stage_index] != stage:
        await pilot.press("right")
    await pilot.pause()


async def test_the_rail_marks_each_stage_right_wrong_or_open_as_answers_come() -> None:
    """The rail, like --check's: ? on every stage with a question still open, ✓ once all its
    questions are right, ✗ once one is wrong (softmax asks two: open after the first right
    one, ✗ after a wrong second); the score line counts the questions right, wrong and open
    with the same marks."""
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        n = len(app.quiz.questions)
        asked = {q.stage for q in app.quiz.questions}
        assert rail_marks(app) == {stage: "?" for stage in app.stage_ids if stage in asked}
        assert counts(app) == f"✓ 0 right ✗ 0 wrong ? {n} open"
        await answer(pilot, right_answer(app.quiz.current))
        assert rail_marks(app)["embed"] == "✓" and rail_marks(app)["project"] == "?"
        assert counts(app) == f"✓ 1 right ✗ 0 wrong ? {n - 1} open"
        app.set_focus(None)
        await pilot.press("right")
        await answer(pilot, "(4, 4)")  # project's shape, wrong
        assert rail_marks(app)["project"] == "✗"
        assert counts(app) == f"✓ 1 right ✗ 1 wrong ? {n - 2} open"
        await walk_to(pilot, "softmax")
        assert [q.asks for q in app.quiz.asked_at("softmax")] == ["row_sum", "most_attended"]
        await answer(pilot, right_answer(app.quiz.current))
        assert rail_marks(app)["softmax"] == "?"  # its second question still open
        await answer(pilot, "I")
        assert app.quiz.marks[-1].outcome == "wrong"
        marks = rail_marks(app)
        assert marks["softmax"] == "✗" and marks["mask"] == "✓" and marks["attend"] == "?"
        answered = len(app.quiz.marks)
        assert counts(app) == f"✓ {answered - 2} right ✗ 2 wrong ? {n - answered} open"
        assert app.query_one(StageRail).highlighted == app.stage_index  # still where we are


async def test_the_rail_marks_in_ascii() -> None:
    trace = default_trace()
    app = ExplainApp(trace.config, trace=trace, quiz=True, ascii_only=True)
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        await answer(pilot, right_answer(app.quiz.current))
        assert rail_marks(app)["embed"] == "+" and rail_marks(app)["project"] == "?"
        assert counts(app).startswith("+ 1 right x 0 wrong ? ")


def test_the_rail_mid_quiz(snap_compare) -> None:
    """Quiz mode at 100x32 after embed right and project wrong: ✓ and ✗ on the rail, ? on
    the stages still asking; view's question below, the score and its counts."""

    async def answer_two(pilot) -> None:  # type: ignore[no-untyped-def]
        await pilot.pause()
        pilot.app.query_one("#quiz-answer", Input).cursor_blink = False  # a blink is a timing
        await answer(pilot, right_answer(pilot.app.quiz.current))
        pilot.app.set_focus(None)
        await pilot.press("right")
        await answer(pilot, "(4, 4)")
        pilot.app.set_focus(None)
        await pilot.press("right")
        await pilot.pause()

    assert snap_compare(quiz_app(), terminal_size=(100, 32), run_before=answer_two)
