"""Quiz mode (issue 20, item 4): questions made from a trace's own records, each answer checked
here against an independent computation; how typed answers are read and marked; the quiz's
state (marks, reveals, the score); the worksheet from the command line, as golden text and
as JSON, for --model, --module, NumPy and --hf."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from mha_tui.config import Config, Source
from mha_tui.kinds._parts.quizzing import HOW, LONGEST_ANSWER, Question, mark, read
from mha_tui.pipeline import run_trace
from mha_tui.quiz import KINDS, Quiz, questions
from mha_tui.records import Trace

from .conftest import ROOT, run_cli, split_figures
from .test_families import _families_root  # noqa: F401  (the session's checkpoint folder)

MECHANISMS = Path(ROOT) / "tests" / "fixtures" / "mechanisms"


@cache
def trace_of(model: str = "mygpt", embed_dim: int = 4, heads: int = 2,
             sentence: str = "I love AI !") -> Trace:
    return run_trace(Config(sentence, embed_dim=embed_dim, num_heads=heads), Source(model=model))


@cache
def mechanism_trace(ref: str) -> Trace:
    return run_trace(Config("the cat sat on the mat", embed_dim=16, num_heads=4),
                     Source(module=str(MECHANISMS / ref)))


def by_asks(trace: Trace) -> dict[str, list[Question]]:
    found: dict[str, list[Question]] = {}
    for question in questions(trace):
        found.setdefault(question.asks, []).append(question)
    return found


def _softmax(rows: np.ndarray) -> np.ndarray:
    shifted = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("model", ["mygpt", "course", "raschka"])
@pytest.mark.parametrize(("embed_dim", "heads", "sentence"), [
    (4, 2, "I love AI !"), (8, 4, "the cat sat on the mat")])
def test_every_answer_matches_an_independent_computation(model: str, embed_dim: int, heads: int,
                                                         sentence: str) -> None:
    """The answers, recomputed here with NumPy from x and the weights alone (the tutorial's
    formulas): ids, shapes, strides of a contiguous (B, T, h, d_h) tensor transposed, one score,
    sqrt(d_h), the causal mask's T(T-1)/2 blocked entries, a softmax row's sum and argmax."""
    trace = trace_of(model, embed_dim, heads, sentence)
    config = trace.config
    T, C, h, d_h = len(config.tokens), embed_dim, heads, embed_dim // heads
    asks = by_asks(trace)
    assert asks["lookup"][0].expected == config.ids[T - 1]
    shapes = {q.stage: q.expected for q in asks["shape"]}
    assert shapes == {"project": (1, T, C), "view": (1, T, h, d_h), "attend": (1, h, T, d_h),
                      "concat": (1, T, C), "w_o": (1, T, C)}
    # A contiguous (B, T, h, d_h) with its axes 1 and 2 swapped: strides (T·C, d_h, C, 1).
    assert asks["strides"][0].expected == (T * C, d_h, C, 1)
    # One score, from the projection's weights and x.
    x = trace.stage("embed").tensor("x").values.astype(np.float64)[0]
    project = trace.stage("project")
    weights = [r.values.astype(np.float64) for r in project.tensors if r.dims == ("C_out", "C_in")]
    biases = [r.values.astype(np.float64) for r in project.tensors if r.dims == ("C",)]
    q, k, _ = (x @ w.T + (b if biases else 0) for w, b in zip(weights, biases or [0] * 3,
                                                              strict=True))
    if model == "raschka":  # W_key, W_query, W_value: the stage shows them in that order
        q, k = k, q
    qh, kh = (m.reshape(T, h, d_h).transpose(1, 0, 2) for m in (q, k))
    scores = qh @ kh.transpose(0, 2, 1)
    head = min(1, h - 1)
    (score,) = asks["value"]
    assert score.expected == pytest.approx(scores[head, T - 1, 0], rel=1e-5, abs=1e-6)
    assert asks["divisor"][0].expected == pytest.approx(math.sqrt(d_h), rel=1e-5)
    assert asks["blocked"][0].expected == T * (T - 1) // 2
    assert asks["row_sum"][0].expected == pytest.approx(1.0, abs=1e-6)
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)
    weights_ = _softmax(np.where(causal, -np.inf, scores / math.sqrt(d_h)))
    row = weights_[head, T - 1]
    expected = tuple(int(j) for j in np.flatnonzero(np.isclose(row, row.max(), rtol=1e-6)))
    assert asks["most_attended"][0].expected == expected


def test_every_question_kind_is_asked_and_each_kind_has_its_generator_in_its_module() -> None:
    """Across the tutorials and the mechanisms, every kind of question turns up; each stage
    kind's questions come from its own module (the registry's kind modules)."""
    from mha_tui.kinds import kv_repeat, position_bias, rotary, softmax

    assert KINDS["softmax"] is softmax.quiz and KINDS["rotary"] is rotary.quiz
    assert KINDS["kv_repeat"] is kv_repeat.quiz and KINDS["pos_bias"] is position_bias.quiz
    seen = set(by_asks(trace_of()))
    seen |= set(by_asks(mechanism_trace("llama_rotary.py:LlamaAttention")))
    seen |= set(by_asks(mechanism_trace("alibi.py:BloomAttention")))
    assert seen == {"lookup", "shape", "strides", "value", "divisor", "blocked", "row_sum",
                    "most_attended", "angle", "kv_head", "channel"}


def test_a_fused_split_asks_where_a_head_starts_and_a_residual_its_shape() -> None:
    """BLOOM keeps (h, 3, d_h) per head in its fused output: v's head 1 starts at
    1 · 3 · 4 + 2 · 4 = 20 (C 16, 4 heads); BERT's post-norm output is (1, T, C)."""
    split = [q for q in questions(mechanism_trace("alibi.py:BloomAttention")) if q.asks == "channel"]
    assert [(q.stage, q.expected) for q in split] == [("qkv_split", 20)]
    assert "V head 1 start" in split[0].text
    residual = [q for q in questions(mechanism_trace("post_norm.py:BertAttention"))
                if q.stage == "residual"]
    assert [(q.asks, q.expected) for q in residual] == [("shape", (1, 6, 16))]


def test_mechanism_answers_match_an_independent_computation() -> None:
    """Rotary: pair 0 turns by 1 radian per position (10000^0); shared heads: the last query
    head of 4 reads K/V head 1 of 2; ALiBi: BLOOM's bias is slope × key position, head 1's
    slope 2^(-8·2/4), the key before the last query at position T - 2 = 4."""
    llama = by_asks(mechanism_trace("llama_rotary.py:LlamaAttention"))
    assert llama["angle"][0].expected == pytest.approx(1.0, abs=1e-6)
    assert llama["kv_head"][0].expected == 3 // 2
    alibi = by_asks(mechanism_trace("alibi.py:BloomAttention"))
    bias = next(q for q in alibi["value"] if q.stage == "pos_bias")
    assert bias.expected == pytest.approx(2 ** (-8 * 2 / 4) * 4, rel=1e-6)


# ---------------------------------------------------------------- reading and marking


SHAPE = Question("view", "shape", "What shape?", "shape", (1, 4, 2, 2), "(1, 4, 2, 2)", "recorded")
NUMBER = Question("scores", "value", "What score?", "number", 0.83994, "0.8399", "recorded")
COUNT = Question("mask", "blocked", "How many?", "integer", 6, "6", "counted")
TOKEN = Question("softmax", "most_attended", "Which token?", "token", (4,), "the·4", "row")
TOKENS = ("the", "cat", "sat", "on", "the", "mat")


@pytest.mark.parametrize("text", ["1, 4, 2, 2", "(1,4,2,2)", " [1 4 2 2] ", "1x4x2x2",
                                  "torch.Size([1, 4, 2, 2])", "(1, 4, 2, 2,)", "1×4×2×2"])
def test_a_shape_is_read_however_it_is_spelled(text: str) -> None:
    assert mark(SHAPE, text).outcome == "right"


@pytest.mark.parametrize(("question", "text"), [
    (SHAPE, "1, 4, 4"), (SHAPE, "(1, 2, 4, 2)"), (NUMBER, "0.84"), (NUMBER, "0.8398"),
    (COUNT, "10"), (TOKEN, "cat"), (TOKEN, "1"), (TOKEN, "the·0")])
def test_a_wrong_answer_gives_the_right_one_and_where_it_comes_from(question: Question,
                                                                    text: str) -> None:
    marked = mark(question, text, TOKENS)
    assert marked.outcome == "wrong"
    assert marked.message == f"the answer is {question.shown}: {question.source}"


@pytest.mark.parametrize(("question", "text"), [
    (NUMBER, "0.8399"), (NUMBER, ".8399"), (NUMBER, "0.83994"), (NUMBER, "8.3994e-1 "),
    (COUNT, "6"), (COUNT, "6.0"), (TOKEN, "the"), (TOKEN, "4"),
    (TOKEN, "the·4"), (TOKEN, "the.4")])
def test_right_answers_to_the_precision_shown(question: Question, text: str) -> None:
    assert mark(question, text, TOKENS).outcome == "right"


def test_a_number_is_right_to_four_decimals_and_no_further() -> None:
    one = Question("softmax", "row_sum", "Sum?", "number", 0.99999994, "1.0000", "summed")
    assert mark(one, "1").outcome == "right" and mark(one, "1.0000").outcome == "right"
    assert mark(one, "0.9999").outcome == "wrong" and mark(one, "1.0001").outcome == "wrong"
    minus = Question("scores", "value", "?", "number", -0.5, "-0.5000", "recorded")
    assert mark(minus, "\u22120.5").outcome == "right"  # a typographic minus


@pytest.mark.parametrize("text", [
    "", "   ", "four", "1,,4", "(1, 4, 2, 2", "1; 4", "[bold]1, 4[/bold]", "\x1b[31m6", "6\x07",
    "1" * (LONGEST_ANSWER + 1), "nan", "2/3"])
def test_unreadable_text_gets_no_mark_and_says_what_to_type(text: str) -> None:
    for question in (SHAPE, NUMBER, COUNT, TOKEN):
        if question is SHAPE and text in ("(1, 4, 2, 2",):
            continue  # a missing bracket is forgiven: the numbers are all there
        marked = mark(question, text, TOKENS)
        assert marked.outcome == "unreadable", (question.answer, text)
        assert marked.message == f"could not read that as {HOW[question.answer]}; type " \
                                 f"{HOW[question.answer]}"
        assert text not in marked.message or not text.strip()


def test_a_token_is_its_word_or_its_position_never_an_unknown_word() -> None:
    assert read(TOKEN, "the", TOKENS) == (0, 4)
    assert read(TOKEN, "mat", TOKENS) == (5,)
    assert read(TOKEN, "5", TOKENS) == 5
    assert read(TOKEN, "6", TOKENS) is None and read(TOKEN, "dog", TOKENS) is None
    assert read(TOKEN, "THE", TOKENS) is None  # tokens are case-sensitive, as the model sees them


# ---------------------------------------------------------------- the quiz's state


def test_a_quiz_marks_reveals_and_scores() -> None:
    """Right, wrong and unreadable answers walk the quiz; a stage is revealed once each of its
    questions has a mark; the score counts the right ones."""
    quiz = Quiz.of(trace_of())
    first = quiz.current
    assert first is not None and first.stage == "embed" and not quiz.revealed("embed")
    assert quiz.revealed("nope")  # a stage without questions is never hidden
    same, marked = quiz.answer("??")
    assert marked.outcome == "unreadable" and same is quiz
    quiz, marked = quiz.answer(str(first.expected))
    assert marked.outcome == "right" and quiz.revealed("embed") and not quiz.revealed("project")
    quiz, marked = quiz.answer("9, 9, 9")
    assert marked.outcome == "wrong" and quiz.revealed("project")
    assert quiz.score == f"1 of {len(quiz.questions)} right"
    while quiz.current is not None:
        quiz, _ = quiz.answer(quiz.current.shown.split(" (")[0] if quiz.current.answer == "token"
                              else quiz.current.shown)
    assert quiz.done and quiz.right == len(quiz.questions) - 1
    assert all(quiz.revealed(stage.id) for stage in trace_of().stages)
    with pytest.raises(ValueError, match="the quiz is over"):
        quiz.answer("1")


# ---------------------------------------------------------------- the worksheet


WORKSHEETS = {
    "quiz-default": ("I love AI !",),
    "quiz-llama": ("the cat sat on the mat", "-C", "16", "-H", "4", "--module",
                   "tests/fixtures/mechanisms/llama_rotary.py:LlamaAttention"),
}


@pytest.mark.parametrize("name", list(WORKSHEETS))
def test_the_worksheet_is_the_golden_text(name: str) -> None:
    """`explain --quiz --dump -`: the questions, then the answer key (make golden writes it)."""
    result = run_cli("explain", *WORKSHEETS[name], "--quiz", "--dump", "-")
    assert result.returncode == 0, result.stderr
    golden = Path(ROOT) / "tests" / "golden" / f"{name}.txt"
    assert result.stdout.decode("utf-8") == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("trace", [trace_of, lambda: mechanism_trace("llama_rotary.py:LlamaAttention")],
                         ids=["mygpt", "llama"])
def test_a_worksheet_question_never_wraps_inside_an_index_or_a_shape(trace) -> None:
    """`scores[0, 1, 3, 0]` or `shape (1, 2, 4, 2)` stays on one line at any width (at 100
    columns the index was split after `scores[0, 1,`)."""
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import worksheet_text

    t = trace()
    asked = questions(t)
    for width in (*range(60, 131, 3), 100):
        text = worksheet_text(t, asked, RenderOptions(), width=width)
        assert split_figures(text) == [], (width, split_figures(text)[:3])


def test_the_json_worksheet_holds_the_same_questions_and_answers(tmp_path: Path) -> None:
    out = tmp_path / "sheet.json"
    result = run_cli("explain", "I love AI !", "--quiz", "--dump", str(out))
    assert result.returncode == 0, result.stderr
    result = run_cli("explain", "I love AI !", "--quiz", "--dump", str(out))  # .json: JSON
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    asked = questions(trace_of())
    assert [q["question"] for q in data["questions"]] == [q.text for q in asked]
    assert [a["shown"] for a in data["answers"]] == [q.shown for q in asked]
    assert [a["answer"] for a in data["answers"]] == [
        list(q.expected) if isinstance(q.expected, tuple) else q.expected for q in asked]
    token = [a for a in data["answers"] if "tokens" in a]
    assert token and token[0]["tokens"] == ["love"]


def test_hostile_tokens_stay_literal_in_the_worksheet() -> None:
    """Rich markup and control characters in the sentence: shown as text, never obeyed."""
    result = run_cli("explain", "[bold]x[/bold] \x1b[31mred q", "--quiz", "--dump", "-")
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert "[bold]x[/bold]" in out and "\x1b" not in out and "\u241b[31mred" in out


def test_the_markdown_worksheet_is_a_numbered_list_of_questions_then_the_key(tmp_path: Path
                                                                           ) -> None:
    """`--quiz --dump sheet.md` for course notes: CommonMark with one list item per question
    (its stage, its text, what to type) and one per answer (the answer, its source), the
    same questions and answers as the text worksheet; the golden file is `make golden`'s."""
    from markdown_it import MarkdownIt

    out = tmp_path / "sheet.md"
    result = run_cli("explain", "I love AI !", "--quiz", "--dump", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text(encoding="utf-8")
    assert text == (Path(ROOT) / "tests" / "golden" / "quiz-default.md").read_text("utf-8")
    asked = questions(trace_of())
    tokens = MarkdownIt("commonmark").parse(text)
    lists = [t for t in tokens if t.type == "ordered_list_open"]
    items = [t for t in tokens if t.type == "list_item_open"]
    assert len(lists) == 2 and len(items) == 2 * len(asked)
    html = MarkdownIt("commonmark").render(text)
    for q in asked:
        assert f"<code>{q.stage}</code>" in html and f"<strong>{q.shown}</strong>" in html
    assert html.index("<h2>Questions</h2>") < html.index("<h2>Answer key</h2>")


def test_hostile_tokens_stay_literal_in_the_markdown_worksheet(tmp_path: Path) -> None:
    """Markdown, HTML and control characters in the sentence: shown as text in the rendered
    worksheet, never a link, a tag or emphasis."""
    from markdown_it import MarkdownIt

    out = tmp_path / "sheet.md"
    result = run_cli("explain", "<b>x</b> [a](b) *c* `d` \x1b[31mq", "--quiz", "--dump", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text(encoding="utf-8")
    assert "\x1b" not in text
    html = MarkdownIt("commonmark").render(text)
    assert "<b>" not in html and "<a " not in html and "<em>c</em>" not in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "[a](b)" in html and "*c*" in html


def test_a_numpy_worksheet_never_imports_torch() -> None:
    from .test_numpy import _explain_without_torch

    done = _explain_without_torch("I love AI !", "--model", "blueprint", "--quiz", "--dump", "-")
    assert done.returncode == 0, done.stderr.decode()
    assert b"TORCH False" in done.stderr
    assert b"What are the strides of" in done.stdout and b"(in bytes)" in done.stdout


def test_an_hf_worksheet_asks_about_the_models_own_layer(tmp_path_factory) -> None:
    pytest.importorskip("transformers")
    from .hf_models import save_tiny_gpt2

    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-quiz"))
    result = run_cli("explain", "The cat sat on the mat.", "--hf", str(folder), "--quiz",
                     "--dump", "-", "--format", "json")
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads(result.stdout)
    asks = {q["asks"] for q in data["questions"]}
    assert {"shape", "value", "row_sum", "blocked"} <= asks
    shape = [a for a, q in zip(data["answers"], data["questions"], strict=True)
             if q["stage"] == "view"]
    assert shape and shape[0]["answer"][-2:] == [4, 4]  # 4 heads of 4


@pytest.mark.parametrize(("args", "message"), [
    (("--why", "softmax[0, 1, 2, 1]"), "--quiz and --why both say what to write"),
    (("--format", "svg"), "--quiz writes a worksheet as text, JSON or Markdown, not svg"),
    (("--stage", "softmax", "--only"), "--only does not apply"),
    (("--check",), "--quiz hides the numbers that --check judges"),
])
def test_quiz_refusals_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = run_cli("explain", "I love AI !", "--quiz", "--dump", "-", *args)
    assert result.returncode == 2 and result.stdout == b""
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_an_hf_quiz_says_whose_numbers_and_ids_it_asks_about() -> None:
    """BLOOM's scores are mha-tui's expansion of baddbmm's product times alpha: the question
    says times alpha and the key says mha-tui computed it (the answer is the recorded
    expansion, Q·K × alpha, checked here in float64); a tokenizer's ids are not numbered
    by first appearance."""
    from mha_tui.kinds.scores import baddbmm_factors

    from .test_families import hf_trace

    trace = hf_trace("bloom", 0)
    score = next(q for q in questions(trace) if q.stage == "scores" and q.asks == "value")
    assert "times alpha = " in score.text
    assert score.source.startswith("mha-tui's expansion's") and "× alpha" in score.source
    op = next(op for op in trace.stage("scores").ops if op.name == "baddbmm")
    alpha, _ = baddbmm_factors(op)
    q, k = (np.asarray(trace.recording.snapshot(ref).values, np.float64) for ref in op.inputs[1:3])
    head, row = 1, q.shape[-2] - 1
    assert math.isclose(score.expected, alpha * float(q[head, row] @ k[head, :, 0]),
                        rel_tol=1e-5, abs_tol=1e-6)
    lookup = next(q for q in questions(hf_trace("llama", 0)) if q.asks == "lookup")
    assert "the tokenizer's id" in lookup.source and "first appearance" not in lookup.source
    default = next(q for q in questions(trace_of()) if q.asks == "lookup")
    assert "first appearance" in default.source
