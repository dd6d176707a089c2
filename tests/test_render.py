"""The renderers as a reader meets them: whole numbers, wrapped code, labels that say what
they are, at any width the transcript and the app allow."""

from __future__ import annotations

import re
from functools import cache
from io import StringIO

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console

from mha_tui.config import Config
from mha_tui.pipeline import run_trace
from mha_tui.records import TensorRecord, Trace
from mha_tui.render.header import header
from mha_tui.render.matrix import Axis, Matrix
from mha_tui.render.options import RenderOptions
from mha_tui.render.stage import stage_view
from mha_tui.render.tensor import TensorView
from mha_tui.render.text import label
from mha_tui.write.dump import to_text

from .conftest import default_trace

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A number printed by a table: sign, digits, a point and decimals; or inf/nan.
NUMBER = re.compile(r"-?\d+\.\d+")


@cache
def trace_of(embed_dim: int = 4, heads: int = 2, sentence: str = "I love AI !") -> Trace:
    return run_trace(Config(sentence, embed_dim=embed_dim, num_heads=heads,
                            max_seq_len=max(64, len(sentence.split()))))


def draw(renderable: object, width: int = 100, color: bool = False) -> str:
    console = Console(file=StringIO(), width=width, color_system="truecolor" if color else None,
                      force_terminal=color, no_color=not color, _environ={})
    console.print(renderable)
    return console.file.getvalue()


def table_lines(text: str) -> list[str]:
    """The lines of a transcript that hold values (a label, then numbers): not the lines of a
    stage's checks block (a long check, such as softmax's head scores, wraps onto lines that
    start with its words)."""
    return [line for line in outside_checks(text) if NUMBER.search(line) and "shape" not in line
            and "showing" not in line and not line.startswith(("✓", "·", "[", "raw"))]


def outside_checks(text: str) -> list[str]:
    """The transcript's lines but those of its stages' checks blocks."""
    lines, in_checks = [], False
    for line in text.splitlines():
        if line == "checks":
            in_checks = True
        elif not line.strip():
            in_checks = False
        if not in_checks:
            lines.append(line)
    return lines


# ---------------------------------------------------------------- item 4: whole numbers


@pytest.mark.parametrize("width", [40, 60, 100])
@pytest.mark.parametrize(("embed_dim", "heads"), [(4, 2), (16, 2), (768, 12)])
@pytest.mark.parametrize(("full", "ascii_only"), [(False, False), (True, False), (False, True)])
def test_a_number_is_printed_whole_or_left_out_never_cut(width: int, embed_dim: int,
                                                         heads: int, full: bool,
                                                         ascii_only: bool) -> None:
    if full and embed_dim == 768 and width != 100:
        pytest.skip("one GPT-2 --full run is enough")
    trace = trace_of(embed_dim, heads)
    text = to_text(trace, RenderOptions(full=full, ascii=ascii_only), width=width)
    if ascii_only:  # the same checks, on the ASCII stand-ins
        text = text.replace("...", "…")
    assert max(cell_len(line) for line in text.splitlines()) <= width
    for line in table_lines(text):
        # a cut number ends in the ellipsis: "-1.…", "0.8…", "-0…"; a cropped one is short
        assert not re.search(r"[\d.-]…", line), line
        values = re.findall(r"-?\d+\.\d+(?![\de])", line)  # not 1.19e-07 in a check
        assert all(re.fullmatch(r"-?\d+\.\d{4}", n) for n in values), line
    # every value row of every table: its label, then only whole numbers or the gap
    for line in text.splitlines():
        if re.search(r"\d\.\d{4}", line) and "…" in line:
            cells = line.split()
            assert all(NUMBER.fullmatch(c) or c in ("…", "-inf") for c in cells[-3:]), line


def _numbers_of_block_table(text: str, start: str, rows: int, cols: int) -> np.ndarray:
    """Read a matrix back from a transcript: the `columns a-b of n` blocks after start."""
    values: list[list[float]] = [[] for _ in range(rows)]
    blocks = re.split(r"columns (\d+)-(\d+) of \d+\n", text[text.index(start):])
    for first, last, body in zip(blocks[1::3], blocks[2::3], blocks[3::3], strict=False):
        lines = [li for li in body.splitlines() if NUMBER.search(li)][:rows]
        for row, line in zip(values, lines, strict=True):
            numbers = [float(x) for x in NUMBER.findall(line)]
            assert len(numbers) == int(last) - int(first) + 1, line
            row.extend(numbers)
        if int(last) == cols - 1:
            break
    return np.array(values)


def test_full_splits_wide_tables_into_column_blocks_holding_every_value() -> None:
    """--full at C=16: torch-style column blocks, and the numbers read back are the module's."""
    trace = trace_of(16, 2)
    text = to_text(trace, RenderOptions(full=True), width=100)
    assert "columns 0-9 of 16" in text and "columns 10-15 of 16" in text
    weight = trace.stage("embed").tensor("embedding.weight").values
    read = _numbers_of_block_table(text, "embedding.weight  shape", *weight.shape)
    assert np.array_equal(read, np.round(weight.astype(np.float64), 4))


def test_a_gap_column_says_how_many_columns_it_hides() -> None:
    text = to_text(trace_of(768, 12), RenderOptions(), width=100)
    block = text[text.index("embedding.weight  shape"):]
    block = block[:block.index("\n\n")]
    hidden = int(re.search(r"\+(\d+) ", block).group(1))
    shown = int(re.search(r"showing 4 of 4 rows, (\d+) of 768 columns", block).group(1))
    assert hidden + shown == 768
    # as many columns as the width holds: one more would not fit
    assert max(map(len, block.splitlines())) > 100 - 9


def test_columns_follow_the_width_they_are_given() -> None:
    """'7 of 8 columns' when 8 would fit: the number shown comes from the widest cell."""
    trace = trace_of(8, 2)
    record = trace.stage("embed").tensor("x")
    view = TensorView(record, trace.config, RenderOptions(max_cols=64))
    needed = max(cell_len(line) for line in draw(view, 400).splitlines()
                 if "strides" not in line and "shape" not in line)
    assert "showing" not in draw(view, needed) and "showing" in draw(view, needed - 1)


@pytest.mark.parametrize("numbers", [True, False])
@pytest.mark.parametrize("decimals", range(9))
def test_a_wider_pane_never_shows_fewer_columns(numbers: bool, decimals: int) -> None:
    """Issue 15, item 2: every token of an elided axis carries its position (`love·1`), so
    an elided window can be wider than the whole table; a width that holds every column
    shows every column, and one more cell of width never loses a column."""
    trace = trace_of()
    record = trace.stage("scores").tensor("scores")
    opts = RenderOptions(numbers=numbers, decimals=decimals, max_cols=64)
    matrix = Matrix(record.values[0, 0], record, Axis(list(trace.config.tokens), literal=True,
                                                      positions=True),
                    Axis(list(trace.config.tokens), literal=True, positions=True), None, opts)
    whole = max(cell_len(line) for line in draw(matrix, 400).splitlines())
    assert matrix.shown(whole) == (4, 4)
    shown = [matrix.shown(width)[1] for width in range(8, whole + 1)]
    assert shown == sorted(shown), shown


# ---------------------------------------------------------------- item 5: code wraps


@pytest.mark.parametrize("width", [40, 60])
def test_code_wraps_in_colour_as_in_plain_text(width: int) -> None:
    trace = default_trace()
    stage = trace.stage("transpose")
    plain = draw(stage_view(trace, stage, RenderOptions()), width)
    colour = ANSI.sub("", draw(stage_view(trace, stage, RenderOptions()), width, color=True))
    for text in (plain, colour):
        joined = " ".join(text.split())
        for line in stage.code.splitlines():
            assert " ".join(line.split()) in joined, line
        assert max(cell_len(line.rstrip()) for line in text.splitlines()) <= width


@pytest.mark.parametrize("width", [30, 40, 60, 76, 100])
@pytest.mark.parametrize("model", ["mygpt", "course", "raschka", "many-eyes"])
def test_code_wraps_between_tokens_and_keeps_a_shape_comment_whole(width: int,
                                                                   model: str) -> None:
    """Issue 15: code wrapped mid-expression (`# (B, h,` / `T, d_h)`). Every code line of
    every stage, wrapped: each piece fits, no piece starts or ends inside a comment that
    fits a line, a break falls where the line had a space (unless one token is wider than
    the line), and the pieces, joined, are the line."""
    from mha_tui.config import Source
    from mha_tui.render.code import wrap_code

    trace = run_trace(Config("I love AI !"), Source(model=model))
    for stage in trace.stages:
        for line in stage.code.splitlines():
            pieces = wrap_code(line, width).splitlines()
            assert all(cell_len(piece) <= width for piece in pieces), pieces
            assert "".join("".join(pieces).split()) == "".join(line.split()), pieces
            for piece in pieces[:-1]:  # a break where there was no space: a token too wide
                assert " ".join(piece.split()) + " " in " ".join(line.split()) + " " or (
                    cell_len(piece) >= width - 1), (piece, pieces)
            if "  # " in line:
                comment = line[line.index("  # ") + 2:]
                if cell_len(comment) <= width - 8:
                    assert any(comment in piece for piece in pieces), (comment, pieces)


def test_code_wrap_prefers_the_outer_brackets_and_no_stub() -> None:
    from mha_tui.render.code import wrap_code

    line = "q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, T, d_h)"
    assert wrap_code(line, 76).splitlines() == [
        "q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)",
        "    # (B, h, T, d_h)"]
    assert wrap_code(line, 60).splitlines() == [
        "q = q.view(B, T, self.num_heads,",
        "    self.head_dim).transpose(1, 2)  # (B, h, T, d_h)"]
    # inside a string only when nothing else fits; a `#` in a string starts no comment
    assert wrap_code("s = f('a # b c')  # note", 14).splitlines() == [
        "s =", "    f('a # b", "    c')", "    # note"]


# ---------------------------------------------------------------- item 9: numbers stay


def test_numbers_off_without_colour_keeps_the_numbers() -> None:
    trace = default_trace()
    stage = trace.stage("softmax")
    text = draw(stage_view(trace, stage, RenderOptions(numbers=False, color=False)))
    assert "0.5308" in text


def test_numbers_off_keeps_integer_ids_even_in_colour() -> None:
    trace = default_trace()
    ids = trace.stage("embed").tensor("ids")
    text = ANSI.sub("", draw(TensorView(ids, trace.config, RenderOptions(numbers=False)),
                             color=True))
    assert re.search(r"ids\s+0\s+1\s+2\s+3", text), text
    weights = trace.stage("softmax").tensor("weights")
    coloured = ANSI.sub("", draw(TensorView(weights, trace.config,
                                            RenderOptions(numbers=False)), color=True))
    assert "0.5308" not in coloured  # colour stands in for the probabilities


# ---------------------------------------------------------------- item 10: header


LONG = ("the quick brown fox jumps over the lazy dog while the cat watches from the warm "
        "window and the bird sings")


@pytest.mark.parametrize("width", [40, 60, 80, 100])
@pytest.mark.parametrize("sentence", ["I love AI !", LONG, " ".join(f"w{i}" for i in range(512))],
                         ids=["short", "long", "512-tokens"])
def test_header_fits_its_width_and_always_shows_the_sizes(width: int, sentence: str) -> None:
    config = Config(sentence, embed_dim=768, num_heads=12, max_seq_len=512)
    text = draw(header(config, RenderOptions()), width)
    lines = text.splitlines()
    assert len(lines) <= 3 and max(map(cell_len, lines)) <= width
    sizes = f"B=1 T={config.seq_len} C=768 h=12 d_h=64"
    assert sizes in text
    if len(config.tokens) > 5 and width <= 60:
        assert re.search(r"… \(\+\d+\)", text)  # the token list gives way, with a count


# ---------------------------------------------------------------- item 12: repeated tokens


def test_repeated_tokens_show_their_positions() -> None:
    trace = trace_of(4, 2, "the cat sat on the mat")
    text = to_text(trace, RenderOptions())
    assert "the·0" in text and "the·4" in text
    assert "cat·1" not in text  # only where a token repeats
    x = text[text.index("\nx  shape"):]
    rows = [line.split()[0] for line in x.splitlines()[5:11]]
    assert rows == ["the·0", "cat", "sat", "on", "the·4", "mat"]
    aside = trace.stage("transpose").aside[0]
    assert "the·0·h0" in aside.row_tags[0] and "the·4·h0" in aside.row_tags[1]


def test_an_elided_token_axis_shows_every_position() -> None:
    trace = trace_of(4, 2, " ".join(f"t{i % 7}" for i in range(40)))
    text = to_text(trace, RenderOptions())
    x = text[text.index("\nx  shape"):]
    x = x[:x.index("checks")]
    assert "t5·5" in x and "t4·39" in x and "⋮" in x


# ---------------------------------------------------------------- item 15: labels


def test_head_title_says_which_index_it_is() -> None:
    text = to_text(default_trace(), RenderOptions())
    assert "head 1  Q[0, 1]" in text and "head 0  weights[0, 0]" in text
    assert "  [0, 1]" not in text


def _record(values: np.ndarray, kind: str = "signed") -> TensorRecord:
    return TensorRecord(name="t", dims=("T", "T"), values=values, strides=(1, 1),
                        contiguous=True, kind=kind)  # type: ignore[arg-type]


def test_values_that_round_to_zero_have_no_sign() -> None:
    values = np.array([[-0.00001, 0.5], [-0.4, -0.00004]], dtype=np.float32)
    matrix = Matrix(values, _record(values), Axis(["a", "b"]), Axis(["x", "y"]), None,
                    RenderOptions())
    text = draw(matrix)
    assert "-0.0000" not in text and "0.0000" in text and "-0.4000" in text
    zero = draw(Matrix(values, _record(values), Axis(["a", "b"]), Axis(["x", "y"]), None,
                       RenderOptions(decimals=0)))
    assert not re.search(r"-0\b", zero)


def test_summary_of_a_masked_tensor_counts_minus_inf() -> None:
    trace = trace_of(4, 2, " ".join(f"t{i}" for i in range(20)))
    text = to_text(trace, RenderOptions())
    mask = text[text.index("7/11 mask"):]
    mask = " ".join(mask[:mask.index("checks")].split())  # summaries wrap in narrow columns
    summaries = re.findall(r"showing .*?(?= \S+ shape| head \d| \d of \d heads|$)", mask)
    assert len(summaries) == 3  # the mask, and two heads of the masked scores
    assert all("finite values: min" in s and "are -inf" in s for s in summaries), summaries
    masked = trace.stage("mask").tensor("causal_mask[:T, :T]").values
    assert f"{int(np.isneginf(masked).sum())} are -inf" in summaries[0]


def test_summary_of_integer_ids_has_no_decimals() -> None:
    trace = trace_of(4, 2, " ".join(f"t{i}" for i in range(40)))
    text = to_text(trace, RenderOptions(), width=60)
    ids = text[text.index("ids  shape"):]
    summary = re.search(r"showing .*", ids).group(0)
    assert "min 0  max 39" in summary and "0.0000" not in summary


@pytest.mark.parametrize("token", ["abcdefghij\x9bxyz", "abcdefghi\u202eevil",
                                   "abcdefgh\U000e0001tag", "ab\x9b\x9b\x9b\x9b\x9bcd"])
def test_an_escape_is_never_cut_in_the_middle(token: str) -> None:
    for ascii_only in (False, True):
        shown = label(token, ascii_only=ascii_only).plain
        assert cell_len(shown) <= 12
        body = shown.rstrip("…~")
        # every backslash starts a complete escape
        for match in re.finditer(r"\\", body):
            assert re.match(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})", body[match.start():]), shown


@pytest.mark.parametrize("width", [40, 60])
def test_narrow_transcripts_cut_no_title_and_no_summary_line(width: int) -> None:
    """Stage titles wrap above the rule; a summary's parts go on lines of their own."""
    trace = trace_of(16, 2, " ".join(f"t{i}" for i in range(20)))
    text = to_text(trace, RenderOptions(), width=width)
    joined = " ".join(text.split())
    for stage in trace.stages:
        assert stage.title in joined
    for line in text.splitlines():
        assert cell_len(line) <= width
    # a statistic's name and its value stay on one line (outside the checks blocks, whose
    # prose, such as softmax's head-score formulas, wraps as prose)
    for line in outside_checks(text):
        assert not re.search(r"\b(min|max|mean|of \d+)$", line), line


def test_full_heads_in_column_blocks_are_set_apart() -> None:
    """With --full, a head whose columns need several blocks ends with a blank line, so the
    next head's title does not run into its last block."""
    text = to_text(trace_of(32, 2), RenderOptions(full=True), width=100)
    assert "columns 10-15 of 16" in text
    assert "\n\nhead 1  Q[0, 1]\ncolumns 0-9 of 16\n" in text


# ---------------------------------------------------------------- the cursor where rows or columns are elided


def _long_trace():  # type: ignore[no-untyped-def]
    from mha_tui.config import Config, Source
    from mha_tui.pipeline import run_trace

    return run_trace(Config(" ".join(f"w{i}" for i in range(20)), embed_dim=8, num_heads=2),
                     Source(model="mygpt"))


@pytest.mark.parametrize(("row", "col"), [(10, 9), (2, 3), (19, 0), (0, 0)])
def test_the_cursor_is_drawn_where_the_matrix_would_elide_its_row_or_column(row: int,
                                                                           col: int) -> None:
    """A cell in the elided middle: its row and column are drawn (each gap says how many it
    stands for), and the cell is reversed; the other head keeps the plain window."""
    from io import StringIO

    from rich.console import Console
    from rich.text import Text

    from mha_tui.render.stage import stage_tensors

    trace = _long_trace()
    stage = trace.stage("scores")
    opts = RenderOptions(max_rows=8, max_cols=20, max_heads=4, width=70,
                         cursor=("scores", (0, 1, row, col)))
    console = Console(file=StringIO(), width=70, color_system="truecolor", force_terminal=True)
    console.print(stage_tensors(trace, stage, opts))
    out = console.file.getvalue()
    lines = Text.from_ansi(out).plain.splitlines()
    head1 = lines[next(k for k, line in enumerate(lines) if line.startswith("head 1")):]
    labels = [line.split()[0] for line in head1[3:12] if line.strip()]
    assert f"w{row}·{row}" in labels
    assert f"w{col}·{col}" in head1[1].split()
    value = f"{stage.tensors[0].values[0, 1, row, col]:.4f}"
    reversed_ = [seg.text.strip() for seg in console.render(stage_tensors(trace, stage, opts))
                 if seg.style is not None and seg.style.reverse]
    assert reversed_ == [value]
    gaps = [int(word[1:]) for word in head1[1].split() if word.startswith("+")]
    shown = [w for w in head1[1].split() if w.startswith("w")]
    assert sum(gaps) + len(shown) == 20
    head0 = lines[next(k for k, line in enumerate(lines) if line.startswith("head 0")):]
    assert "w10·10" not in [line.split()[0] for line in head0[3:12] if line.strip()]


FOUR_HEADS = '''
import math
import torch.nn as nn


class FourHeads(nn.Module):
    """Its head count is its own (4), whatever --heads says."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h, self.d = 4, embed_dim // 4
        self.q, self.k = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)
        self.v, self.o = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(B, T, self.h, self.d).transpose(1, 2)
        v = self.v(x).view(B, T, self.h, self.d).transpose(1, 2)
        w = (q @ k.transpose(-2, -1) / math.sqrt(self.d)).softmax(dim=-1)
        return self.o((w @ v).transpose(1, 2).contiguous().view(B, T, C))
'''


def test_a_module_whose_head_count_is_not_heads_is_drawn_as_it_is(tmp_path) -> None:
    """A learner's module with 4 heads hard-coded, run with --heads 2: the view stage's
    (B, T, h, d_h) tensor is drawn with its own 4 heads of 2 (it was a ValueError from a
    reshape to the configured h * d_h, a traceback instead of a transcript)."""
    from mha_tui.config import Source

    path = tmp_path / "four.py"
    path.write_text(FOUR_HEADS)
    trace = run_trace(Config("I love AI !", embed_dim=8, num_heads=2),
                      Source(module=f"{path}:FourHeads"))
    to_text(trace, RenderOptions(), width=100)  # every stage draws
    (view,) = [s for s in trace.stages if s.kind == "view"]
    q = view.tensors[0]
    assert q.dims == ("B", "T", "h", "d_h") and q.values.shape == (1, 4, 4, 2)
    text = draw(stage_view(trace, view, RenderOptions()))
    heads_row = next(line for line in text.splitlines() if line.strip().startswith("h0"))
    assert heads_row.split() == ["h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"]


def test_the_header_and_project_labels_say_the_heads_the_module_split_into(tmp_path) -> None:
    """Trial 18: `self.h = 4` written in, run with --heads 2. The header says h=4 d_h=2 (with
    --heads 2 beside it), and project's weight rows and output columns are labelled by the
    module's 4 heads of 2 channels, as its view splits them (they said h=2 d_h=4 and
    h0 h0 h0 h0 h1 h1 h1 h1, from --heads)."""
    from mha_tui.config import Source

    path = tmp_path / "four.py"
    path.write_text(FOUR_HEADS)
    trace = run_trace(Config("I love AI !", embed_dim=8, num_heads=2),
                      Source(module=f"{path}:FourHeads"))
    text = to_text(trace, RenderOptions(), width=120)
    assert "h=4 d_h=2 (the module's own; --heads 2)" in text
    assert "h=2" not in text.splitlines()[1]
    (project,) = [s for s in trace.stages if s.kind == "project"]
    drawn = draw(stage_view(trace, project, RenderOptions()))
    rows = [line.split()[:3] for line in drawn.splitlines() if re.match(r"out \d h\d", line)]
    assert rows[:8] == [["out", str(c), f"h{c // 2}"] for c in range(8)]
    heads_rows = [line.split() for line in drawn.splitlines() if line.strip().startswith("h0")]
    assert heads_rows and all(row == ["h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"]
                              for row in heads_rows)
    mygpt = to_text(run_trace(Config("I love AI !", embed_dim=8, num_heads=2)), RenderOptions())
    assert "h=2 d_h=4 seed" in mygpt.splitlines()[0] and "--heads" not in mygpt


def test_a_forward_that_returns_a_scalar_is_drawn(tmp_path) -> None:
    """`return x.sum()`: a 0-d tensor had no dims to name (IndexError in the recogniser's
    record, then in the generic table); now an op stage with one cell, in text and JSON."""
    import io
    import json

    from mha_tui.config import Source
    from mha_tui.write.dump import write_json

    path = tmp_path / "scalar.py"
    path.write_text("import torch.nn as nn\n\n\nclass Sum(nn.Module):\n"
                    "    def __init__(self, embed_dim, num_heads):\n        super().__init__()\n\n"
                    "    def forward(self, x):\n        return x.sum()\n")
    trace = run_trace(Config("I love AI !"), Source(module=f"{path}:Sum"))
    last = trace.stages[-1]
    assert last.kind == "op" and last.tensors[-1].values.shape == ()
    text = to_text(trace, RenderOptions(), width=100)
    total = float(trace.stages[0].tensors[-1].values.sum())
    assert f"{total:.4f}" in text.split("sum  shape ()")[1]
    out = io.BytesIO()
    write_json(trace, out)
    assert json.loads(out.getvalue())["stages"][-1]["tensors"]["sum"]["shape"] == []


def test_a_boolean_result_is_drawn_as_ones_and_zeros_not_as_floats(tmp_path) -> None:
    """`return self.l(x) > 0`: the text table wrote 1.0000 / 0.0000 for True / False; now 1
    and 0, said to be booleans, and the cells are the module's own comparison."""
    from mha_tui.config import Source

    path = tmp_path / "boolean.py"
    path.write_text("import torch.nn as nn\n\n\nclass Bool(nn.Module):\n"
                    "    def __init__(self, embed_dim, num_heads):\n        super().__init__()\n"
                    "        self.l = nn.Linear(embed_dim, embed_dim)\n\n"
                    "    def forward(self, x):\n        return self.l(x) > 0\n")
    trace = run_trace(Config("I love AI !"), Source(module=f"{path}:Bool"))
    result = trace.stages[-1].tensors[-1]
    assert result.values.dtype == bool and result.kind == "int"
    table = to_text(trace, RenderOptions(), width=100).split("gt  shape (1, 4, 4)")[1]
    assert "bool: 1 is True, 0 is False" in table and "1.0000" not in table
    rows = [line.split()[1:] for line in table.splitlines()[5:9]]
    assert rows == [[str(int(v)) for v in row] for row in result.values[0]]


def test_an_emoji_with_a_variation_selector_does_not_shift_the_columns() -> None:
    """#27: `❤️` is U+2764 and VARIATION SELECTOR-16. Rich counted it 2 cells, tmux 3.3 draws
    it in 1, and every column after it shifted in the app. Shown without the selector it is
    1 cell for both; an emoji already 2 wide (👍) stays 2."""
    from rich.cells import cell_len

    from mha_tui.render.text import label, printable

    assert printable("I ❤️ AI") == "I ❤ AI" and cell_len(label("❤️").plain) == 1
    assert printable("👍\ufe0f") == "👍" and cell_len(printable("👍\ufe0f")) == 2
    assert printable("\ufe0e") == "\ufe0e"  # the text-presentation selector is left alone
