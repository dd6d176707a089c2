"""One tensor drawn: its matrices (one per head shown, or one), the axes from the run's
tokens and sizes, its meta line, and the cursor's place in it (`matrix_cell`,
`tensor_index`). Never import torch, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rich.columns import Columns
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from ..config import Config
from ..records import TensorRecord
from .matrix import Axis, Matrix
from .options import RenderOptions
from .text import Unbroken
from .values import DIM_STYLE, head_style

# The keys' axis in cross-attention (recognise.builder.KEYS: render never imports recognise).
KEYS = "T_k"
# A slot of a KV cache allocated up front that holds no token of this run yet.
UNUSED = "<unused>"

if TYPE_CHECKING:
    import numpy as np  # NumPy arrives with torch; the app's first frame must not wait for it


# ---------------------------------------------------------------- one tensor


def _channel_axis(n: int, d_h: int | None, prefix: str = "c") -> Axis:
    if d_h is None:
        return Axis([f"{prefix}{c}" for c in range(n)])
    heads = [c // d_h for c in range(n)]
    return Axis([f"{prefix}{c}" for c in range(n)], heads=heads, sub=[f"h{h}" for h in heads])


def _token_axis(config: Config, tags: Sequence[str] | None = None,
                tag_heads: Sequence[int] | None = None, *, n: int | None = None,
                keys: bool = False, row: int = 0) -> Axis:
    """A T axis labelled by its tokens: the queries' (the sentence's), or with keys the
    keys' (the context's, in cross-attention). n: the axis's length; an axis whose length
    is not its tokens' count (one decode step's query) is labelled by position."""
    if tags is not None:  # rows that are not tokens (the wrong view): already unambiguous
        return Axis(list(tags), heads=tag_heads, literal=True)
    tokens = list(config.key_tokens if keys else config.row_tokens(row) if config.batch
                  else config.tokens)
    if keys and config.cached and n is not None and n > len(tokens):
        # a decode step's KV cache allocated up front (gpt-fast's): the slots after the
        # tokens written so far
        tokens = tokens + [UNUSED] * (n - len(tokens))
    elif n is not None and n != len(tokens):
        other = list(config.tokens if keys else config.key_tokens)
        tokens = other if n == len(other) else [f"t{i}" for i in range(n)]
    return Axis(tokens, literal=True, positions=True)


def _head_title(record: TensorRecord, head: int, opts: RenderOptions, batched: bool = True,
                kv: bool = False, row: int = 0) -> Text:
    dim = opts.focus is not None and head != opts.focus
    # The index that selects this matrix from the tensor: batch 0, head `head` (a K/V head
    # of K or V before the heads are shared out).
    return Text.assemble((f"{'K/V ' if kv else ''}head {head}", head_style(head, dim)),
                         (f"  {record.name}[{row}, {head}]" if batched else f"  {record.name}[{head}]",
                          DIM_STYLE if dim else "dim"))


# Dims of a tensor with no batch axis (NumPy's (T, C)): drawn as the batched layout's one
# batch entry, labelled without the B.
_UNBATCHED = {("T",), ("T", "C"), ("T", "h", "d_h"), ("h", "T", "d_h"), ("h", "T", "T")}


def _batch_row(record: TensorRecord, opts: RenderOptions) -> int:
    """The batch row drawn: the options' (the app's key), within the tensor's batch."""
    batch = record.values.shape[0] if record.dims[:1] == ("B",) and record.values.ndim else 1
    return min(opts.row or 0, batch - 1)


def batch_rows(record: TensorRecord) -> int:
    """How many batch rows the tensor has (1 without a batch axis)."""
    return record.values.shape[0] if record.dims[:1] == ("B",) and record.values.ndim else 1


def _heads_shown(h: int, opts: RenderOptions) -> list[int]:
    if opts.full or h <= opts.max_heads:
        return list(range(h))
    if opts.focus is not None:
        return [opts.focus]
    return [*range(opts.max_heads - 1), h - 1]


def tensor_matrices(record: TensorRecord, config: Config, opts: RenderOptions) -> list[Matrix]:
    """The 2-D slices a learner reads for this tensor, labelled by what its axes mean."""
    matrices = _tensor_matrices(_as_drawn(record), config, opts, batched=not _unbatched(record),
                                kv="h_kv" in record.dims, keys=_key_axes(record))
    if opts.cursor is not None and opts.cursor[0] == record.name:
        _place_cursor(matrices, record, opts.cursor[1])
    return matrices


# Axes drawn as another's: K's and V's h_kv heads as heads; K/V's h_kv*d_h channels and a
# fused projection's q | k | v channels as channels (no head blocks: their order is the
# module's own).
_AS_HEADS = {"h_kv": "h"}
_AS_CHANNELS = {"h_kv*d_h", "3C", "(h+2*h_kv)*d_h", "qkv"}


def _canonical(dims: tuple[str, ...]) -> tuple[str, ...]:
    """The layout drawn: the keys' T_k (cross-attention) is a T axis labelled by the keys'
    tokens (_key_axes)."""
    return tuple(_AS_HEADS.get(d, "C" if d in _AS_CHANNELS else "T" if d == KEYS else d)
                 for d in dims)


def _key_axes(record: TensorRecord) -> tuple[bool, ...]:
    """Per axis of the record as drawn (_as_drawn), whether it is the keys' T_k."""
    keys = tuple(d == KEYS for d in record.dims)
    spread = _spread_axis(record)
    if spread is not None:
        keys = keys[:spread] + keys[spread + 1:]
    return (False, *keys) if _unbatched(record) else keys


def _spread_axis(record: TensorRecord) -> int | None:
    """A size-1 axis the tensor is spread over by broadcasting (dims `1`: HF's (B, 1, T, T)
    mask over the heads): drawn without it."""
    dims, shape = record.dims, record.values.shape
    if "1" in dims and len(dims) == len(shape) and shape[dims.index("1")] == 1:
        return dims.index("1")
    return None


def _unbatched(record: TensorRecord) -> bool:
    """Without a batch axis (NumPy's (T, C)): drawn as the batched layout's one batch entry."""
    return _canonical(record.dims) in _UNBATCHED and record.values.ndim == len(record.dims)


def _as_drawn(record: TensorRecord) -> TensorRecord:
    """The record as tensor_matrices draws it: its axes read as the layouts drawn (h_kv heads
    as heads), a spread axis of 1 left out, a tensor without a batch axis as batch 0."""
    dims, values = _canonical(record.dims), record.values
    spread = _spread_axis(record)
    if spread is not None:
        values = values[(slice(None),) * spread + (0,)]
        dims = dims[:spread] + dims[spread + 1:]
    if _unbatched(record):
        values, dims = values[None], ("B", *dims)
    if dims == record.dims and values is record.values:
        return record
    return replace(record, values=values, dims=dims)


def _drawn_index(record: TensorRecord, index: tuple[int, ...]) -> tuple[int, ...] | None:
    """A tensor index as the drawn record's (None when it is outside the tensor)."""
    shape = record.values.shape
    if len(index) != len(shape) or not all(0 <= i < n for i, n in zip(index, shape, strict=True)):
        return None
    spread = _spread_axis(record)
    if spread is not None:
        index = index[:spread] + index[spread + 1:]
    return (0, *index) if _unbatched(record) else index


def _tensor_index(record: TensorRecord, drawn: tuple[int, ...]) -> tuple[int, ...]:
    """The drawn record's index as the tensor's own: _drawn_index's inverse."""
    index = drawn[1:] if _unbatched(record) else drawn
    spread = _spread_axis(record)
    if spread is not None:
        index = (*index[:spread], 0, *index[spread:])
    return index


_HEADS = (("B", "h", "T", "d_h"), ("B", "h", "T", "T"))
_ONE_MATRIX = (("vocab", "C"), ("C_out", "C_in"), ("C_in", "C_out"), ("T", "T"))


def _head_cell(record: TensorRecord, index: tuple[int, ...]) -> tuple[int, int, int] | None:
    """matrix_cell for the layouts of the attention's own tensors (what mark_cells marks)."""
    dims = record.dims
    if len(index) != len(dims):
        return None
    if dims in _HEADS:
        return index[1], index[2], index[3]
    if dims in (("B", "T", "C"), ("B", "T", "T")):
        return 0, index[1], index[2]
    if dims == ("B", "T", "h", "d_h"):
        return 0, index[1], index[2] * record.values.shape[3] + index[3]
    return None


def matrix_cell(record: TensorRecord, index: tuple[int, ...]) -> tuple[int, int, int] | None:
    """Where a tensor index is drawn: (the head's matrix or 0, row, column), as
    _tensor_matrices draws it, or None for an index that does not fit the tensor. The
    inverse is tensor_index."""
    found = _drawn_index(record, index)
    if found is None:
        return None
    record, index = _as_drawn(record), found
    shape = record.values.shape
    dims = record.dims
    place = _head_cell(record, index)
    if place is not None:
        return place
    if dims in _ONE_MATRIX or dims == ("B", "T"):
        return 0, index[0], index[1]
    if dims == ("C",) or len(shape) == 1:  # one row
        return 0, 0, index[0]
    if not shape:  # a scalar: its one cell
        return 0, 0, 0
    # any other tensor: every leading index one row (C order), its last axis the columns
    row = 0
    for i, n in zip(index[:-1], shape[:-1], strict=True):
        row = row * n + i
    return 0, row, index[-1]


def matrix_bounds(record: TensorRecord) -> tuple[int, int, int]:
    """Heads (matrices the cursor's tab moves between), rows and columns of the tensor as
    drawn: the ranges of matrix_cell's answers."""
    record = _as_drawn(record)
    shape, dims = record.values.shape, record.dims
    if dims in _HEADS:
        return shape[1], shape[2], shape[3]
    if dims in (("B", "T", "C"), ("B", "T", "T")):
        return 1, shape[1], shape[2]
    if dims == ("B", "T", "h", "d_h"):
        return 1, shape[1], shape[2] * shape[3]
    if dims in _ONE_MATRIX or dims == ("B", "T"):
        return 1, shape[0], shape[1]
    if dims == ("C",) or len(shape) == 1:
        return 1, 1, shape[0]
    if not shape:
        return 1, 1, 1
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return 1, rows, shape[-1]


def heads_in_columns(record: TensorRecord) -> bool:
    """Whether the drawn matrix holds the heads side by side in its columns ((B, T, C),
    (B, T, h, d_h)): tab then moves the cursor one head's block of d_h columns over."""
    return _as_drawn(record).dims in (("B", "T", "C"), ("B", "T", "h", "d_h"))


def tensor_index(record: TensorRecord, head: int, row: int, col: int, batch: int = 0
                 ) -> tuple[int, ...]:
    """The tensor index drawn at (head's matrix, row, column) of batch row `batch`:
    matrix_cell's inverse."""
    index = _tensor_index_in_row(record, head, row, col)
    if batch and record.dims[:1] == ("B",) and index:  # a padded batch's row (the app's r)
        index = (min(batch, record.values.shape[0] - 1), *index[1:])
    return index


def _tensor_index_in_row(record: TensorRecord, head: int, row: int, col: int) -> tuple[int, ...]:
    drawn = _as_drawn(record)
    shape, dims = drawn.values.shape, drawn.dims
    if dims in _HEADS:
        index: tuple[int, ...] = (0, head, row, col)
    elif dims in (("B", "T", "C"), ("B", "T", "T")):
        index = (0, row, col)
    elif dims == ("B", "T", "h", "d_h"):
        index = (0, row, *divmod(col, shape[3]))
    elif dims in _ONE_MATRIX or dims == ("B", "T"):
        index = (row, col)
    elif dims == ("C",) or len(shape) == 1:
        index = (col,)
    elif not shape:
        index = ()
    else:
        leading: list[int] = []
        for n in reversed(shape[:-1]):
            row, i = divmod(row, n)
            leading.insert(0, i)
        index = (*leading, col)
    return _tensor_index(record, index)


def _place_cursor(matrices: list[Matrix], record: TensorRecord, index: tuple[int, ...]) -> None:
    place = matrix_cell(record, index)
    if place is None:
        return
    head, row, col = place
    for matrix in matrices:
        number = matrix.head if matrix.head is not None else 0
        matrix.drill_at((row, col) if number == head else None, number)


def mark_cells(matrices: list[Matrix], record: TensorRecord, cells: np.ndarray) -> int:
    """Mark the cells where `cells` (a boolean array of the record's shape) is True in the
    matrices drawn for it (Matrix.marked); returns how many could be placed (none for a
    layout matrix_cell does not know)."""
    import numpy as np

    if cells.shape == record.values.shape:  # as drawn: a spread axis out, batch 0 added
        spread = _spread_axis(record)
        if spread is not None:
            cells = cells[(slice(None),) * spread + (0,)]
        cells = cells[None] if _unbatched(record) else cells
        record = _as_drawn(record)
    by_head: dict[int, set[tuple[int, int]]] = {}
    placed = 0
    for index in zip(*np.nonzero(cells), strict=True):
        place = _head_cell(record, tuple(int(i) for i in index))
        if place is None:  # (the attention's own layouts only, as before)
            return 0
        head, row, col = place
        by_head.setdefault(head, set()).add((row, col))
        placed += 1
    for matrix in matrices:
        matrix.marked = frozenset(by_head.get(matrix.head if matrix.head is not None else 0, ()))
    return placed


def _tensor_matrices(record: TensorRecord, config: Config, opts: RenderOptions,
                     batched: bool = True, kv: bool = False,
                     keys: tuple[bool, ...] = ()) -> list[Matrix]:
    v, dims, d_h = record.values, record.dims, config.head_dim
    row = _batch_row(record, opts)  # the batch row drawn (0 without --batch)

    def tokens(axis: int, tags: Sequence[str] | None = None,
               tag_heads: Sequence[int] | None = None) -> Axis:  # T axis `axis` of v
        return _token_axis(config, tags, tag_heads, n=v.shape[axis],
                           keys=axis < len(keys) and keys[axis], row=row)

    split = d_h if record.head_split is not None else None
    if dims == ("B", "T"):
        return [Matrix(v[row:row + 1], record, Axis(["ids"]), tokens(1), None, opts)]
    if dims == ("vocab", "C"):
        return [Matrix(v, record, Axis(list(config.vocab), literal=True), _channel_axis(v.shape[1], None),
                       None, opts)]
    if dims == ("B", "T", "C"):
        return [Matrix(v[row], record, tokens(1), _channel_axis(v.shape[2], split),
                       None, opts)]
    if dims == ("C_out", "C_in"):
        rows = _channel_axis(v.shape[0], split if record.head_split == 0 else None, "out ")
        cols = _channel_axis(v.shape[1], split if record.head_split == 1 else None, "in ")
        if record.head_split == 0:  # a head's rows: show which head beside the channel
            rows = Axis([f"out {c} h{c // d_h}" for c in range(v.shape[0])], heads=rows.heads)
        return [Matrix(v, record, rows, cols, None, opts)]
    if dims == ("C_in", "C_out"):  # stored as (in, out): x @ W (Conv1D, raw parameters)
        rows = _channel_axis(v.shape[0], split if record.head_split == 0 else None, "in ")
        cols = _channel_axis(v.shape[1], split if record.head_split == 1 else None, "out ")
        return [Matrix(v, record, rows, cols, None, opts)]
    if dims == ("C",):
        return [Matrix(v.reshape(1, -1), record, Axis(["bias"]), _channel_axis(v.shape[0], None), None,
                       opts)]
    if dims == ("T", "T"):
        return [Matrix(v, record, tokens(0), tokens(1), None, opts)]
    if dims == ("B", "T", "T"):  # head-averaged weights, a (1, T, T) mask: query x key
        return [Matrix(v[row], record, tokens(1), tokens(2), None, opts)]
    if dims == ("B", "T", "h", "d_h"):
        # The tensor's own h and d_h (as matrix_cell reads them): a module whose head count
        # is not --heads (hard-coded, or --init num_heads=...) is drawn as it is.
        h, d_h = v.shape[2], v.shape[3]
        flat = v[row].reshape(v.shape[1], h * d_h)  # memory order: head-major within a token
        heads = [c // d_h for c in range(h * d_h)]
        cols = Axis([f"h{c // d_h}" for c in range(h * d_h)], heads=heads,
                    sub=[f"d{c % d_h}" for c in range(h * d_h)])
        return [Matrix(flat, record, tokens(1), cols, None, opts)]
    if dims in (("B", "h", "T", "d_h"), ("B", "h", "T", "T")):
        matrices = []
        for i in _heads_shown(v.shape[1], opts):
            tags = record.row_tags[i] if record.row_tags is not None else None
            tag_heads = record.row_tag_heads[i] if record.row_tag_heads is not None else None
            cols = (tokens(3) if dims[-1] == "T" else Axis([f"d{j}" for j in range(v.shape[3])]))
            matrices.append(Matrix(v[row, i], record, tokens(2, tags, tag_heads), cols,
                                   _head_title(record, i, opts, batched, kv, row), opts, head=i))
        return matrices
    if dims and dims[-1] == "T" and v.ndim >= 2 and v.shape[-1] == len(config.tokens) and \
            v.shape[0] == 1 and all(d in ("B", "1") for d in dims[:-1]):
        # a key padding mask (B, 1, 1, T) of one sentence: its columns are the keys' tokens
        return [Matrix(v.reshape(1, -1), record, Axis(["every query"]), _token_axis(config),
                       None, opts)]
    return _generic_matrices(record, opts)


def _generic_matrices(record: TensorRecord, opts: RenderOptions) -> list[Matrix]:
    """Any other tensor (an op no rule placed, a bias, a (in, out) weight): its last axis as
    columns, every leading index as one row, labelled by that index."""
    import numpy as np

    v = record.values
    if v.ndim == 0:  # a scalar (x.sum(), a loss): one cell, its axes have no names
        return [Matrix(v.reshape(1, 1), record, Axis([""]), Axis(["value"]), None, opts)]
    if v.ndim == 1:
        return [Matrix(v.reshape(1, -1), record, Axis([""]),
                       Axis([f"{record.dims[0] if record.dims else 'c'}{c}" for c in range(v.shape[0])]),
                       None, opts)]
    rows = [", ".join(map(str, index)) for index in np.ndindex(*v.shape[:-1])]
    flat = v.reshape(-1, v.shape[-1])
    row_prefix = record.dims[-2] if len(record.dims) == 2 else ""
    labels = [f"{row_prefix} {r}".strip() if row_prefix else f"[{r}]" for r in rows]
    return [Matrix(flat, record, Axis(labels), Axis([f"{record.dims[-1]} {c}" for c in range(v.shape[-1])]),
                   None, opts)]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def shown_dims(dims: Sequence[str], config: Config | None) -> tuple[str, ...]:
    """The axes' names as shown: T is the queries' axis, named T_q beside the keys' T_k when
    the two differ (cross-attention, a decode step), as the header names them."""
    if config is None or not (config.cross or config.cached):
        return tuple(dims)
    return tuple("T_q" if d == "T" else d for d in dims)


def tensor_meta(record: TensorRecord, config: Config | None = None) -> Text:
    """shape and dims, then strides, contiguity and storage sharing on a second line."""
    text = Text.assemble(
        (record.name, "bold"), "  ",
        ("shape ", "dim"), str(record.shape).replace(",)", ")"), "  ",
        ("dims ", "dim"), "(" + ", ".join(shown_dims(record.dims, config)) + ")",
        # a half-precision module's tensors say their dtype (float32 ones are the default)
        *((("  dtype ", "dim"), (record.dtype, "bold")) if record.dtype else ()), "\n  ",
        ("strides ", "dim"), str(record.strides).replace(",)", ")"),
        (" bytes" if record.stride_unit == "bytes" else "", "dim"),
        # one head's: the heads were separate tensors, stacked by mha-tui (see the caption)
        (" per head" if len(record.strides) == len(record.shape) - 1 else "", "dim"), "  ",
        ("contiguous ", "dim"), _yes(record.contiguous),
    )
    if record.shares_storage is not None:
        text.append_text(Text.assemble("  ", (f"shares storage with {record.shares_with}: ", "dim"),
                                       _yes(record.shares_storage)))
    return text


class TensorView:
    """One tensor: its metadata line, caption, and matrices (side by side when they fit)."""

    def __init__(self, record: TensorRecord, config: Config, opts: RenderOptions) -> None:
        self.record, self.config, self.opts = record, config, opts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        record, opts = self.record, self.opts
        yield Unbroken(tensor_meta(record, self.config))
        if record.caption:
            yield Unbroken(Text(record.caption, style="italic dim"))
        rows = batch_rows(record) if opts.row is None else 1
        for row in range(rows):  # a padded batch in a transcript: every row, one after another
            if rows > 1:
                yield Text.assemble((f"batch row {row}", "bold"), "  ",
                                    (" ".join(self.config.row_tokens(row)), "dim"))
            drawn = replace(opts, row=row) if rows > 1 else opts
            matrices = tensor_matrices(record, self.config, drawn)
            if len(matrices) == 1:
                yield matrices[0]
            else:
                yield Columns(matrices, padding=(0, 3))
        dims = _canonical(record.dims)
        h = record.values.shape[1] if dims[:2] == ("B", "h") else \
            record.values.shape[0] if dims[:1] == ("h",) else 0
        shown = len(_heads_shown(h, opts)) if h else 0
        if h and shown < h:
            yield Text(f"  {shown} of {h} heads shown", style="dim")
