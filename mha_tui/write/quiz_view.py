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

from ..render.code import code_block
from ..render.options import RenderOptions
from ..render.stage import stage_heading
from ..render.text import Unbroken, printable
from ..render.values import HEAD_COLORS

if TYPE_CHECKING:
    from ..quiz import Marked, Question, Quiz
    from ..records import Stage, Trace


def question_text(question: Question) -> Unbroken:
    """The question, and which stage it is about; a wrap never splits an index or a shape
    in it (`scores[0, 1, 3, 0]`)."""
    return Unbroken(Text.assemble((f"[{question.stage}] ", "dim"), printable(question.text)))


def how_text(question: Question) -> Text:
    return Text(f"answer with {question.how}", style="dim")


def answer_text(question: Question) -> Text:
    """The answer key's line: the right answer, then where it comes from."""
    return Text.assemble((printable(question.shown), "bold"), "\n",
                         (printable(question.source), "dim"))


GIVEN_CELLS = 40
"""A wrong answer is repeated in its mark up to this long."""


def mark_text(marked: Marked, ascii_only: bool = False) -> Text:
    """✓ right, ✗ wrong with the right answer and its source, or what to type (wrap it in
    `Unbroken` to lay it out: it holds indices and shapes)."""
    right, wrong = ("[ok]", "[X]") if ascii_only else ("✓", "✗")
    if marked.outcome == "right":
        return Text.assemble((f"{right} ", "bold green"), printable(marked.message))
    if marked.outcome == "wrong":
        given = " ".join(marked.given.split())
        given = given if len(given) <= GIVEN_CELLS else given[:GIVEN_CELLS - 1] + "…"
        return Text.assemble((f"{wrong} ", "bold red"), "you answered ",
                             (printable(given), "bold"), "; ", printable(marked.message))
    return Text(printable(marked.message), style="yellow")


RAIL_MARKS = {"right": ("✓", "green"), "wrong": ("✗", "bold red"), "open": ("?", "yellow")}
ASCII_RAIL_MARKS = {"right": ("+", "green"), "wrong": ("x", "bold red"), "open": ("?", "yellow")}


def rail_mark(state: str | None, ascii_only: bool = False) -> Text:
    """A stage's mark on the rail (`Quiz.stage_state`): ✓ every question about it right,
    ✗ one wrong, ? one still open; a blank for a stage with no question."""
    if state is None:
        return Text(" ")
    symbol, style = (ASCII_RAIL_MARKS if ascii_only else RAIL_MARKS)[state]
    return Text(symbol, style=style)


def counts_text(quiz: Quiz, ascii_only: bool = False) -> Text:
    """How many questions are right, wrong and open, with the marks the rail gives them."""
    marks = ASCII_RAIL_MARKS if ascii_only else RAIL_MARKS
    counts = {"right": quiz.right, "wrong": len(quiz.marks) - quiz.right,
              "open": len(quiz.questions) - len(quiz.marks)}
    text = Text()
    for k, (state, count) in enumerate(counts.items()):
        symbol, style = marks[state]
        text.append(("  " if k else "") + symbol, style=style)
        text.append(f" {count} {state}")
    return text


def score_text(quiz: Quiz, ascii_only: bool = False) -> Text:
    """The score, then the counts behind the rail's marks."""
    done = "quiz done: " if quiz.done else f"{len(quiz.marks)} answered, "
    return Text.assemble((done, "dim"), (quiz.score, "bold"), ("   ", "dim"),
                         counts_text(quiz, ascii_only))


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

    def numbered(rows: list[RenderableType]) -> Table:
        table = Table.grid(padding=(0, 1))
        table.add_column(justify="right", no_wrap=True)
        table.add_column(overflow="fold")
        for number, row in enumerate(rows, 1):
            table.add_row(f"{number}.", row)
        return table

    asked = numbered([Group(question_text(q), how_text(q)) for q in questions])
    return asked, numbered([Unbroken(answer_text(q)) for q in questions])
