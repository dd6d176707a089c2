"""Quiz mode (`explain --quiz`): each stage's numbers stay hidden until every question about
them (`mha_tui.quiz`, made from this trace's records) has a mark.

`QuizBar` is the line under the stage: the question, an `Input` for the answer, the last mark
and the score; it posts `QuizBar.Answered` with the typed text and marks nothing itself.
`Quizzing` is mixed into `ExplainApp` (explain.py): the quiz is its `quiz` reactive, replaced
by each mark; the watcher redraws the stage (hidden or revealed) and the bar. Questions and
answers enter Rich as `Text` (render through `quiz_view`), never as markup.
Never import typer, torch or the CLI here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Static

from .widgets import StageRail

if TYPE_CHECKING:
    from ..records import Trace


class QuizBar(Vertical):
    """The question about the stage on screen, the answer line, the last mark, the score."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "leave_answer", "Keys", tooltip="Leave the answer line: the keys "
                "step through the stages again (the line comes back at the question's stage)",
                id="quiz.leave"),
    ]

    class Answered(Message):
        """The learner pressed enter on an answer: the text as typed."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def compose(self) -> ComposeResult:
        yield Static(id="quiz-question")
        yield Input(placeholder="your answer, then enter", id="quiz-answer", max_length=200)
        yield Static(id="quiz-mark")
        yield Static(id="quiz-score")

    def show(self, question: RenderableType | None, mark: RenderableType | None,
             score: RenderableType, *, asking: bool) -> None:
        """Draw the question (None: nothing left to ask), the last mark and the score; the
        answer line is there only while `asking` about the stage on screen."""
        self.query_one("#quiz-question", Static).update(question or "")
        self.query_one("#quiz-mark", Static).update(mark or "")
        self.query_one("#quiz-score", Static).update(score)
        self.query_one("#quiz-answer", Input).display = asking

    def action_leave_answer(self) -> None:
        """`esc` on the answer line: the app's keys again."""
        self.screen.set_focus(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Answered(event.value))
        event.input.clear()


class Quizzing:
    """The quiz's state in the app: hiding stages, the bar, marking an answer."""

    def _new_quiz(self, trace: Trace) -> None:
        """Quiz mode: the questions about this trace (a new sentence or layer: new ones)."""
        if self._quizzing:
            from ..quiz import Quiz

            self._last_mark = None
            self._last_asked = None
            self._asked_on = None
            self.set_class(True, "-quizzing")
            self.set_reactive(type(self).quiz, Quiz.of(trace))
            self._mark_rail()

    def _quiz_rail_mark(self, stage_id: str) -> tuple[Text, ...]:
        """Quiz mode: the stage's mark on the rail (right, wrong, open, or a blank)."""
        if self.quiz is None:
            return ()
        from ..write.quiz_view import rail_mark

        return (rail_mark(self.quiz.stage_state(stage_id), self._ascii), Text(" "))

    def _mark_rail(self) -> None:
        """The rail again, with each stage's quiz mark (a mark given)."""
        if self.trace is None:
            return
        rail = self.query_one(StageRail)
        rail.set_options(self._rail_options())
        rail.highlighted = self.stage_index

    def _hidden(self, stage_id: str) -> bool:
        """Quiz mode: the stage's numbers wait for an answer."""
        return self.quiz is not None and not self.quiz.revealed(stage_id)

    def watch_quiz(self) -> None:
        self._mark_rail()
        self._show()

    def _hidden_screen(self, trace: Trace, index: int) -> RenderableType:
        from ..write.quiz_view import hidden_stage

        return hidden_stage(trace, trace.stages[index], self.quiz.current, self.view)

    def _show_quiz(self) -> None:
        """The bar under the stage: the question about this stage (its answer line focused
        on arrival), or where the next one is; the last mark; the score."""
        if self.quiz is None or self.trace is None:
            return
        from ..write.quiz_view import how_text, mark_text, question_text, score_text

        stage_id = self.stage_ids[self.stage_index]
        current = self.quiz.current
        asking = current is not None and current.stage == stage_id
        question: RenderableType | None = None
        if current is not None and asking:
            question = Group(question_text(current), how_text(current))
        elif current is not None:
            question = Text.assemble(("next question: at ", "dim"), (current.stage, "bold"))
        bar = self.query_one(QuizBar)
        mark = None
        if self._last_mark is not None and self._last_asked is not None:
            # Which question it marks: after a mark, the screen is often at the next one.
            mark = Text.assemble((f"[{self._last_asked.stage}] ", "dim"),
                                 mark_text(self._last_mark, self._ascii))
        bar.show(question, mark, score_text(self.quiz, self._ascii), asking=asking)
        if asking and self._asked_on != stage_id:
            self._asked_on = stage_id
            self.call_after_refresh(bar.query_one("#quiz-answer", Input).focus)
        elif not asking:
            self._asked_on = None

    def on_quiz_bar_answered(self, message: QuizBar.Answered) -> None:
        """An answer typed: marked against the current question (mha_tui.quiz)."""
        if self.quiz is None or self.quiz.current is None:
            return
        self._last_asked = self.quiz.current
        quiz, self._last_mark = self.quiz.answer(message.text)
        if quiz is self.quiz:  # unreadable: no mark, the same question
            self._show_quiz()
            return
        self.quiz = quiz
        if quiz.done:
            self.notify(quiz.score, title="quiz done")
