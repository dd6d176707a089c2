"""Quiz mode drawn: a question, its mark, the score, and a stage whose numbers wait for an
answer. Pure Rich renderables, shared by the app and the worksheet (`explain --quiz --dump`).

Questions and marks hold tokens and the learner's own text: they enter as `Text` through
`printable`, never as markup. Never import textual, typer or torch here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.text import Text

from .render.code import code_block
from .render.options import RenderOptions
from .render.stage import stage_heading
from .render.text import printable
from .render.values import HEAD_COLORS

if TYPE_CHECKING:
    from .quiz import Marked, Question, Quiz
    from .records import Stage, Trace


def question_text(question: Question) -> Text:
    """The question, and which stage it is about."""
    return Text.assemble((f"[{question.stage}] ", "dim"), printable(question.text))


def how_text(question: Question) -> Text:
    return Text(f"answer: {question.how}", style="dim")


def answer_text(question: Question) -> Text:
    """The answer key's line: the right answer, then where it comes from."""
    return Text.assemble((printable(question.shown), "bold"), "\n",
                         (printable(question.source), "dim"))


def mark_text(marked: Marked, ascii_only: bool = False) -> Text:
    """✓ right, ✗ wrong with the right answer and its source, or what to type."""
    right, wrong = ("[ok]", "[X]") if ascii_only else ("✓", "✗")
    if marked.outcome == "right":
        return Text.assemble((f"{right} ", "bold green"), printable(marked.message))
    if marked.outcome == "wrong":
        return Text.assemble((f"{wrong} ", "bold red"), printable(marked.message))
    return Text(printable(marked.message), style="yellow")


def score_text(quiz: Quiz) -> Text:
    done = "quiz done: " if quiz.done else f"{len(quiz.marks)} answered, "
    return Text.assemble((done, "dim"), (quiz.score, "bold"))


def hidden_stage(trace: Trace, stage: Stage, waiting: Question | None, opts: RenderOptions
                 ) -> Group:
    """A stage whose numbers are hidden: its heading and code, no shape and no tensors, and
    what to answer first (the question below, or one at an earlier stage)."""
    if waiting is not None and waiting.stage == stage.id:
        said = Text("Its numbers stay hidden until you answer the question below.",
                    style="italic")
    else:
        said = Text.assemble(("Its numbers stay hidden: first answer the question at ",
                              "italic"), (waiting.stage if waiting else "?", "bold"),
                             (" (←).", "italic"))
    body = Group(Text("code", style="dim"), code_block(stage.code))
    return Group(
        stage_heading(trace, stage),
        Panel(body, border_style=HEAD_COLORS[0], box=box.ASCII if opts.ascii else box.ROUNDED,
              subtitle=Text("quiz", style="dim"), subtitle_align="right"),
        said,
    )


def worksheet_parts(questions: tuple[Question, ...]) -> tuple[RenderableType, RenderableType]:
    """The worksheet's two numbered lists: the questions, then the answer key."""
    from rich.table import Table

    def numbered(rows: list[Text]) -> Table:
        table = Table.grid(padding=(0, 1))
        table.add_column(justify="right", no_wrap=True)
        table.add_column(overflow="fold")
        for number, row in enumerate(rows, 1):
            table.add_row(f"{number}.", row)
        return table

    asked = numbered([Text("\n").join((question_text(q), how_text(q))) for q in questions])
    return asked, numbered([answer_text(q) for q in questions])
