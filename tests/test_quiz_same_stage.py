"""Quiz mode (issue 27, section 6): after an answer, when the next question is about the same
stage (softmax asks two), the answer line stays open and focused, and a digit typed next goes
to the answer, not to the stage keys (`2` would jump to stage 2)."""

from __future__ import annotations

from textual.widgets import Input

from .test_quiz_app import quiz_app, right_answer


async def test_the_answer_line_stays_for_the_next_question_at_the_same_stage() -> None:
    app = quiz_app()
    async with app.run_test(size=(100, 32)) as pilot:
        await pilot.pause()
        line = app.query_one("#quiz-answer", Input)
        while app.quiz.current is not None and app.quiz.current.stage != "softmax":
            question = app.quiz.current
            while app.stage_ids[app.stage_index] != question.stage:
                await pilot.press("right")
                await pilot.pause()
            line.value = right_answer(question)
            line.focus()
            await pilot.press("enter")
            await pilot.pause()
        while app.stage_ids[app.stage_index] != "softmax":
            await pilot.press("right")
            await pilot.pause()
        first = app.quiz.current
        assert app.focused is line
        await pilot.press("0", "full_stop", "5", "enter")  # typed, as a learner does
        await pilot.pause()
        assert len(app.quiz.marks) and app.quiz.current is not first
        assert app.quiz.current is not None and app.quiz.current.stage == "softmax"
        assert line.display and app.focused is line
        await pilot.press("2")
        await pilot.pause()
        assert app.stage_ids[app.stage_index] == "softmax" and line.value == "2"
