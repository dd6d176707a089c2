"""`mha-tui check SUBMISSION...`: is an attention module right? One module judged here, whole
report; several graded each in its own process (grade/), one row each and the tally.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import typer

from ..config import ConfigError, parse_module_ref
from ..records.request import Request
from . import options
from .options import (
    DEFAULT_SENTENCE,
    CheckFormat,
    SandboxMode,
    check_decode,
    source_of,
)
from .process import fail

if TYPE_CHECKING:
    from ..grade.options import GradingOutputs
    from ..grade.rubric import Rubric
    from ..judge import Verdict


def check(
    specs: options.Submissions = None,
    models: options.Models = None,
    class_name: options.ClassName = None,
    sentence: options.SentenceOption = DEFAULT_SENTENCE,
    heads: options.Heads = 2,
    embed_dim: options.EmbedDim = 4,
    seed: options.Seed = 0,
    causal: options.CausalJudged = True,
    max_seq_len: options.MaxSeqLen = 64,
    init: options.Init = None,
    weights: options.Weights = None,
    fmt: options.FormatCheck = CheckFormat.text,
    width: options.WidthTable = 100,
    ascii_only: options.AsciiTable = False,
    timeout: options.Timeout = 20.0,
    jobs: options.Jobs = None,
    memory: options.Memory = 2048,
    expect: options.ExpectChoice = None,
    rotary_base: options.RotaryBase = 10000.0,
    softcap: options.Softcap = None,
    window: options.Window = None,
    rubric: options.Rubric = None,
    feedback: options.Feedback = None,
    summary: options.Summary = None,
    results: options.Results = None,
    resume: options.Resume = False,
    sandbox: options.Sandbox = SandboxMode.auto,
    hf_source: options.HfRefused = None,
    batch: options.BatchJudged = None,
    context: options.ContextJudged = None,
    decode: options.DecodeJudged = 0,
    dtype: options.DtypeJudged = options.DtypeName.auto,  # type: ignore[attr-defined]
) -> None:
    """Is my attention module right? Judge every stage; name the first wrong line and why.

    Several modules (files, a folder, a glob, --model) are graded each in its own process,
    with --timeout and --memory, and summed up one row each.

    Exit code 0: equivalent (every module); 1: NOT equivalent (at least one); 3: could not
    judge (a forward that raised, a module that could not be built among several, or one
    that hung, exited or crashed); 2: usage error. Several modules exit with the worst.
    """
    if hf_source is not None:  # named, not "no such option": a user may well try it
        fail("check does not take --hf: it judges a module you give as FILE.py:Class or "
             "--model NAME; to look at a Hugging Face model's attention use "
             "mha-tui explain --hf PATH_OR_NAME")
    config = options.config_of(options.valid_text(sentence, "the sentence"), heads=heads,
                               embed_dim=embed_dim, seed=seed, causal=causal,
                               max_seq_len=max_seq_len, context=context, batch=batch,
                               dtype=dtype.value)
    if not 40 <= width <= 400:
        fail(f"--width must be between 40 and 400, got {width}")
    if not 0 < timeout <= 24 * 3600:
        fail(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be at least 1, got {jobs}")
    if memory < 64:
        fail(f"--memory must be at least 64 MB, got {memory}")
    wanted = options.expect_of(expect, window=window, rotary_base=rotary_base,
                                softcap=softcap)
    from ..grade import GradeError, Submission, find_submissions, is_batch

    if class_name is not None and not all(part.isidentifier() for part in class_name.split(".")):
        fail(f"--class takes the name of a class; {class_name!r} is not one")
    try:
        submissions = find_submissions(specs or [], class_name)
    except GradeError as error:
        fail(str(error))
    for submission in submissions:  # a malformed spec, --init or --weights: exit 2 now
        try:  # the module is check's argument here, not --module
            parse_module_ref(submission.module, taker="check")
        except ConfigError as error:
            fail(str(error))
        source_of(None, submission.module, init or [], weights)
    for model in models or []:
        source_of(model, None, init or [], weights)
        submissions.append(Submission(shown=model, model=model))
    if not submissions:
        fail("give the module to check: FILE.py:Class (or package.module:Class), "
             "or --model NAME; e.g. mha-tui check my_attn.py:MultiHeadAttention")
    # What every submission is judged with; each one's own module replaces the source's.
    request = Request(config, source_of(None, None, init or [], weights), wanted, steps=decode)
    from ..grade.options import grading_outputs
    from ..judge.outcome import EXIT_CODES, worst

    try:
        outputs = grading_outputs(rubric=rubric, feedback=feedback, summary=summary,
                                  results=results, resume=resume, fmt=fmt.value,
                                  count=len(submissions))
    except GradeError as error:
        fail(str(error))
    verdict = None
    lms = fmt in (CheckFormat.gradescope, CheckFormat.prairielearn)
    check_decode(decode, config)
    if len(submissions) > 1 or is_batch(specs or []) or lms or outputs.grading:
        reports = _grade(request, submissions, timeout=timeout, jobs=jobs, memory=memory,
                         sandbox=sandbox, outputs=outputs.session)
        if summary is not None:
            from ..grade.options import write_summary

            write_summary(summary, reports, outputs.session.rubric)
    else:  # one module, judged here: the whole report
        from ..judge.report import verdict_json
        from ..load.learner import LoadError
        from ..pipeline import verdict as verdict_of

        one = submissions[0]
        try:
            verdict = verdict_of(request.of_module(one.model, one.module))
        except LoadError as error:
            # here the module is an argument, not --module
            fail(str(error).removeprefix("--module: ").removeprefix("--module "))
        reports = [verdict_json(verdict)]
    _write_verdicts(reports, verdict, fmt, width=width, ascii_only=ascii_only,
                    rubric=outputs.session.rubric)
    raise typer.Exit(EXIT_CODES[worst(report["verdict"] for report in reports)])


def _grade(request: Request, submissions: list, *, timeout: float, jobs: int | None,
           memory: int, sandbox: SandboxMode, outputs: GradingOutputs) -> list[dict]:
    """Each submission in its own process (grade/pool.py), judged with the request, its
    module replaced by the submission's; a progress bar on stderr while they run, when
    stderr is a terminal."""
    from ..grade import Limits, sandbox_or_why, watched_folders

    sandboxed, why = sandbox_or_why(sandbox.value)
    if why is not None and sandbox is SandboxMode.required:
        fail(f"--sandbox required: {why}")
    if why is not None and sandbox is SandboxMode.auto:
        sys.stderr.write(f"mha-tui: warning: grading WITHOUT a sandbox ({why}): each "
                         "submission can read, write and reach what you can. Install "
                         "bubblewrap, or pass --sandbox off to grade so without this warning.\n")
    watched = watched_folders(submissions)
    from ..grade.session import grade_class

    limits = Limits(request, timeout=timeout, memory=memory << 20)
    jobs = jobs or max(1, min(os.cpu_count() or 1, 4))
    if not (sys.stderr is not None and sys.stderr.isatty()):
        return grade_class(submissions, limits, outputs, jobs=jobs, sandbox=sandboxed,
                           watched=watched)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}", markup=False), console=Console(stderr=True),
                  transient=True) as progress:
        task = progress.add_task("", total=len(submissions))

        def done(graded) -> None:  # type: ignore[no-untyped-def]
            from ..render.text import printable  # a file name is the learner's text

            progress.update(task, advance=1, description=f"{printable(graded.submission.shown)}: "
                                                         f"{graded.outcome}")

        return grade_class(submissions, limits, outputs, jobs=jobs, sandbox=sandboxed,
                           watched=watched, progress=done)


def _write_verdicts(reports: list[dict], verdict: Verdict | None, fmt: CheckFormat, *,
                    width: int, ascii_only: bool, rubric: Rubric) -> None:
    """One module: its whole report (`verdict`); several: one row each and the tally."""
    from ..judge.report import summary_table, tally, to_json, verdict_renderable

    if fmt is CheckFormat.json:
        sys.stdout.buffer.write(to_json(reports).encode("utf-8"))
        return
    if fmt in (CheckFormat.csv, CheckFormat.gradescope, CheckFormat.prairielearn):
        from ..grade.options import write_gradebook

        write_gradebook(sys.stdout, reports, fmt.value, rubric)
        return
    import io

    from rich.console import Console

    tty = sys.stdout.isatty()
    # Not a terminal (a file, a pipe, course notes): drawn into a buffer first, so that the
    # table's padding leaves no trailing spaces on its lines, as the transcripts have none.
    console = Console(file=sys.stdout if tty else io.StringIO(), width=None if tty else width,
                      highlight=False, soft_wrap=False, no_color=not tty or None, emoji=False,
                      markup=False, force_terminal=tty or None)
    if verdict is not None:
        console.print(verdict_renderable(verdict, ascii_only=ascii_only))
    else:
        from ..grade.summary import class_summary, summary_renderable

        console.print(summary_table(reports, ascii_only=ascii_only))
        console.print(tally(reports))
        console.print()
        console.print(summary_renderable(class_summary(reports, rubric)))
    if not tty:
        drawn = console.file.getvalue()  # type: ignore[attr-defined]
        sys.stdout.write("".join(line.rstrip() + "\n" for line in drawn.splitlines()))
