"""`--hf`: the first stage, where layer L's attention input comes from, read off the model.

Every family builds its first block's input its own way: GPT-2 adds token and position
embeddings; Llama and the other rotary models add nothing to the token embeddings (positions
enter inside attention); Gemma multiplies them by sqrt(C); OPT and RoBERTa read their
position table from row 2 on; BERT adds a token-type row and normalises the sum. None of
this is assumed here: the hooks (`tracing.hf_layers`) keep what each embedding module and
each layer norm the model called before its first block returned, and this module finds the
relations between those tensors from their values (which rows of each table were read, the
one factor between two tensors, which sum is the next module's input) and says what it
found. The few values it computes (a lookup, a sum, a product, a layer norm) are computed
only to compare with the model's own, and the checks say so.

Imported only for `--hf` (torch). Never import rich, textual, typer or transformers here.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence

import torch

from ..load.hf import Loaded
from ..records import Check, Stage, Statement, TensorRecord
from ..tracing.hf_layers import ForwardRun, Line, NormCall, is_norm

BTC = ("B", "T", "C")
# Exact search for the rows an embedding read is skipped beyond this many table entries
# (rows x channels): a tokens' table is read at input_ids, never searched.
_SEARCH_LIMIT = 64 * 2**20


def record(name: str, t: torch.Tensor, dims: tuple[str, ...], *, kind: str = "signed",
           caption: str = "") -> TensorRecord:
    """A window onto the model's own tensor (no copy, no recomputation); a bfloat16 tensor,
    which NumPy cannot hold, as a float32 copy of the same numbers (exact) that says its dtype."""
    t = t.detach()
    dtype = ""
    if t.dtype == torch.bfloat16:
        dtype, t = "bfloat16", t.float()  # every bfloat16 number is a float32 number
    return TensorRecord(name=name, dims=dims, values=t.numpy(), strides=tuple(t.stride()),
                        contiguous=t.is_contiguous(), kind=kind,  # type: ignore[arg-type]
                        caption=caption, dtype=dtype)


def code(*lines: Line | None) -> str:
    """The model's own lines, each with the file and line number it was read from."""
    shown = list(dict.fromkeys(line for line in lines if line is not None and line.text))
    width = max((len(line.text) for line in shown), default=0)
    return "\n".join(f"{line.text:<{width}}  # {os.path.basename(line.file)}:{line.line}"
                     for line in shown)


# ---------------------------------------------------------------- relations, from the values


def factor_between(base: torch.Tensor, scaled: torch.Tensor) -> float | None:
    """The one number s with base * s == scaled bit for bit (s != 1), found from the values:
    the median ratio, or the float next to it either way; None when there is none."""
    if base.shape != scaled.shape:
        return None
    nonzero = base != 0
    if not bool(nonzero.any()):
        return None
    s = (scaled[nonzero] / base[nonzero]).median()
    for candidate in (s, torch.nextafter(s, s.new_tensor(math.inf)),
                      torch.nextafter(s, s.new_tensor(-math.inf))):
        if torch.equal(base * candidate, scaled):
            value = float(candidate)
            return None if value == 1.0 else value
    return None


def factor_words(s: float, C: int) -> str:
    """s, and sqrt(C) when that is what it is (to float32 precision)."""
    root = math.sqrt(C)
    if abs(s - root) <= 1e-6 * root:
        return f"{s:.6g} = sqrt(C) = sqrt({C})"
    return f"{s:.6g}"


def _row_of(table: torch.Tensor, row: torch.Tensor) -> int | None:
    hits = (table == row).all(-1).nonzero()
    return int(hits[0, 0]) if len(hits) else None


def rows_read(table: torch.Tensor, out: torch.Tensor) -> list[int] | None:
    """Which row of table each of out's rows (T, C) is, bit for bit; None when one is not."""
    if table.ndim != 2 or out.ndim != 2 or table.shape[1] != out.shape[1]:
        return None
    if table.numel() > _SEARCH_LIMIT:
        return None
    first = _row_of(table, out[0])
    if first is None:
        return None
    T = out.shape[0]
    if first + T <= table.shape[0] and torch.equal(table[first:first + T], out):
        return list(range(first, first + T))  # positions: consecutive rows
    if torch.equal(table[first].expand_as(out), out):
        return [first] * T  # one row for every token (a segment, a token type)
    rows = [_row_of(table, row) for row in out]
    return None if any(r is None for r in rows) else rows  # type: ignore[misc]


def rows_words(rows: list[int], table: str, padding_idx: int | None) -> tuple[str, str]:
    """(caption, check label) for the rows an embedding read, in the learner's words."""
    T = len(rows)
    if T > 1 and rows == list(range(rows[0], rows[0] + T)):
        k = rows[0]
        if k == 0:
            return (f"position embeddings: row t of {table}, whatever the token",
                    f"token t gets row t of {table}, t = 0..{T - 1}: a row per position")
        why = (f"; row {padding_idx} is the padding index, and positions are counted after it"
               if padding_idx is not None and padding_idx == k - 1 else
               f"; rows 0..{k - 1} are never used for positions")
        return (f"position embeddings: row t + {k} of {table}, whatever the token",
                f"token t gets row t + {k} of {table}, t = 0..{T - 1}: positions start at "
                f"row {k}{why}")
    if len(set(rows)) == 1:
        return (f"the same row {rows[0]} of {table} for every token",
                f"every token gets row {rows[0]} of {table}, whatever the token and its "
                f"position")
    return (f"rows {rows} of {table}", f"the tokens get rows {rows} of {table}")


def sum_order(parts: Sequence[torch.Tensor], target: torch.Tensor) -> tuple[int, ...] | None:
    """An order of adding parts that gives target bit for bit (float addition is not
    associative, so the order matters in the last bit); None when no order does."""
    for order in itertools.permutations(range(len(parts))):
        total = parts[order[0]]
        for i in order[1:]:
            total = total + parts[i]
        if total.shape == target.shape and torch.equal(total, target):
            return order
    return None


# ---------------------------------------------------------------- the stage


def _what_a_block_adds(loaded: Loaded, layer: int) -> str:
    """"attention and MLP outputs", or "attention outputs" for a block whose only parameters
    are its attention's and its norms' (an attention-only model: mha_tui/models/induction.py)."""
    block = loaded.blocks[layer]
    known = {id(p) for p in loaded.attention(layer).parameters()}
    known |= {id(p) for name, sub in block.named_modules() if name and is_norm(name, sub)
              for p in sub.parameters()}
    if all(id(p) in known for p in block.parameters()):
        return "attention outputs (the blocks have no MLP)"
    return "attention and MLP outputs"


def _short(path: str) -> str:
    return path.rsplit(".", 1)[-1]


@torch.no_grad()
def input_stage(loaded: Loaded, run: ForwardRun, layer: int, *,
                positions_inside: str = "") -> Stage:
    """Where layer L's attention input comes from: embeddings, residual stream, layer norm.

    positions_inside: the title of the stage of this layer that puts positions into
    attention (rotary, a position bias), if any; said when no embedding adds positions.
    """
    info, captured = loaded.info, run.layers[layer]
    C, T = info.embed_dim, run.ids.shape[1]
    ids = run.ids[0]
    x = captured.attention_input
    records = [record("input_ids", run.ids, ("B", "T"), kind="int",
                      caption=f"the tokenizer's ids, one per token (vocabulary of "
                              f"{info.vocab_size})")]
    checks: list[Check] = []
    said: list[str] = [f"The tokenizer cut the sentence into {T} tokens."]
    parts: list[torch.Tensor] = []
    has_positions = False
    for call in run.embeddings:
        table = call.module.weight
        name = f"{call.path}.weight"
        out = call.output.reshape(T, -1)
        if call.tokens:
            lookup = table[ids]  # recomputed only to compare
            if torch.equal(out, lookup):
                caption = f"token embeddings: row t is row input_ids[t] of {name}"
                checks.append(Check(f"row t of the token embeddings is row input_ids[t] of "
                                    f"{name} for all {T} tokens", True))
                said.append(f"{call.path} turns each id into a learned row of C={C} numbers "
                            f"(what the token is).")
            else:
                s = factor_between(lookup, out)
                words = None if s is None else factor_words(s, C)
                caption = (f"token embeddings: row input_ids[t] of {name} times {words}"
                           if words else f"token embeddings from {name}")
                checks.append(Check(
                    f"row t of the token embeddings is row input_ids[t] of {name} times "
                    f"{words} (the lookup and the product recomputed by mha-tui to compare): "
                    f"torch.equal = True" if words else
                    f"row t of the token embeddings is not row input_ids[t] of {name}, nor "
                    f"that row times one number", s is not None))
                if words:
                    said.append(f"{call.path} turns each id into a learned row of C={C} "
                                f"numbers (what the token is) and multiplies it by {words}, "
                                f"so that the rows start out on the scale the rest of the "
                                f"model expects.")
            records.append(record(f"{call.path}(input_ids)", call.output, BTC, caption=caption))
            parts.append(call.output)
            continue
        rows = rows_read(table, out)
        padding = getattr(call.module, "padding_idx", None)
        if rows is None:
            caption, label = (f"from {name}", f"the rows of {call.path}'s output were not "
                                              f"found in {name}")
        else:
            caption, label = rows_words(rows, name, padding)
        consecutive = rows is not None and T > 1 and rows == list(range(rows[0], rows[0] + T))
        has_positions |= consecutive
        # (T, C) when the model looks up positions of shape (T,) (nanoGPT, mha_tui.models)
        records.append(record(f"{call.path}(...)", call.output, BTC[-call.output.ndim:],
                              caption=caption))
        checks.append(Check(label + " (found by comparing rows)" if rows is not None else label,
                            rows is not None))
        said.append(f"{call.path} adds a row " + ("for its position (where it is)" if consecutive
                                                   else "that does not depend on the token")
                    + (f", read from row {rows[0]} on." if consecutive and rows and rows[0]
                       else "."))
        parts.append(call.output)
    if not has_positions:
        said.append("No position embedding is added here: " + (
            f"positions enter inside attention (the stage \u201c{positions_inside}\u201d)."
            if positions_inside else "no stage of this layer adds positions either."))
    embedded = run.embedded
    norm: NormCall | None = run.embedding_norms[0] if run.embedding_norms else None
    target = norm.input if norm is not None else embedded
    target_name = f"{norm.path}'s input" if norm is not None else "block 0's input"
    what = " + ".join(_short(run.embeddings[i].path) for i in range(len(parts)))
    unfit = [(call.path, tuple(part.shape)) for call, part in zip(run.embeddings, parts,
                                                                  strict=True)
             if part.shape != target.shape]
    if unfit:  # OPT-350m: 512-wide token embeddings, projected to the blocks' 1024
        checks.append(Check(
            f"{target_name} {tuple(target.shape)} is not a plain sum of the embeddings: "
            + ", ".join(f"{path} gives {shape}" for path, shape in unfit)
            + "; what turns them into the blocks' width is not shown here", None))
    elif len(parts) > 1:
        order = sum_order(parts, target)
        if order is not None:
            spelled = " + ".join(_short(run.embeddings[i].path) for i in order)
            checks.append(Check(f"{target_name} is {spelled} (the sum recomputed by mha-tui, in "
                                f"that order, to compare): torch.equal = True", True))
        else:
            total = sum(parts[1:], parts[0])
            s = factor_between(total, target)
            checks.append(Check(
                f"{target_name} is ({what}) times {factor_words(s, C)} (recomputed by mha-tui "
                f"to compare): torch.equal = True" if s is not None else
                f"{target_name} is not {what} in any order (recomputed by mha-tui to compare)",
                s is not None))
    elif parts:
        same = bool(torch.equal(parts[0].reshape(target.shape), target))
        s = None if same else factor_between(parts[0].reshape(target.shape), target)
        checks.append(Check(
            f"{target_name} is the token embeddings themselves: torch.equal = True" if same else
            f"{target_name} is the token embeddings times {factor_words(s, C)} (recomputed by "
            f"mha-tui to compare): torch.equal = True" if s is not None else
            f"{target_name} is not the token embeddings, nor them times one number",
            same or s is not None))
    if norm is not None:
        again = norm.module(norm.input)  # recomputed only for the check
        same = bool(torch.equal(again, embedded))
        that = "that sum" if len(parts) > 1 else "them"
        checks.append(Check(f"block 0's input is {norm.path} applied to {that} (recomputed by "
                            f"mha-tui for this check; dropout is off in eval mode): "
                            f"torch.equal = {same}", same))
        said.append(f"{'The sum' if len(parts) > 1 else 'They'} go{'es' if len(parts) > 1 else ''}"
                    f" through {norm.path} (a {type(norm.module).__name__}) and enter"
                    f"{'s' if len(parts) > 1 else ''} block 0.")
    else:
        said.append("That sum enters block 0." if len(parts) > 1 else
                    "The token embeddings enter block 0 as they are.")
    records.append(record(f"{loaded.blocks_path}.0 input", embedded, BTC,
                          caption="the residual stream as it enters the first block"))
    adds = _what_a_block_adds(loaded, layer)
    if layer > 0:
        records.append(record(
            f"{loaded.blocks_path}.{layer} input", captured.residual, BTC,
            caption=f"the residual stream after {layer} block{'s' if layer > 1 else ''}: "
                    f"the embeddings plus every earlier block's {adds}"))
        checks.append(Check(
            f"spread (std) of the residual stream: {embedded.std().item():.4f} entering "
            f"block 0 -> {captured.residual.std().item():.4f} entering block {layer}", None))
    said.append(f"Each block adds its {adds} back onto this residual "
                f"stream, so layer {layer} reads the stream after {layer} "
                f"block{'s' if layer != 1 else ''}.")
    layer_norm = captured.norm_name
    if layer_norm is not None and captured.norm is not None:
        records.append(record(f"x = {layer_norm}(hidden_states)", x, BTC,
                              caption=f"layer {layer}'s layer norm: what the attention module "
                                      f"receives as x"))
        read = captured.residual
        if captured.norm_input is not None and not torch.equal(captured.norm_input, read):
            read = captured.norm_input  # a decoder's cross-attention: after its self-attention
            records.append(record(f"{layer_norm}'s input", read, BTC,
                                  caption=f"block {layer}'s input plus its self-attention's "
                                          f"output"))
        after = read is not captured.residual
        again = captured.norm(read)  # recomputed only for the check
        same = bool(torch.equal(x, again))
        what = (f"the stream after block {layer}'s self-attention (its input plus the "
                f"self-attention's output)" if after else f"block {layer}'s input")
        checks.append(Check(f"x is {layer_norm} applied to {what} (recomputed by "
                            f"mha-tui for this check): torch.equal = {same}", same))
        said.append(f"{'After the self-attention adds its output, i' if after else 'I'}ts layer "
                    f"norm {layer_norm} rescales every token's C numbers before attention "
                    f"sees them.")
    else:
        records.append(record("x", x, BTC, caption="what the attention module receives"))
        same = bool(torch.equal(x, captured.residual))
        checks.append(Check(f"x is block {layer}'s input itself, with no layer norm before "
                            f"attention: torch.equal = {same}", same))
        if same:
            said.append("No layer norm stands between the residual stream and attention "
                        "here (this block normalises after attention).")
    if info.encoder:
        said.append(f"{info.class_name} is an encoder: its self-attention lets every token see "
                    f"every token, later ones included (no causal mask).")
    source = (f"the residual stream through {layer_norm}" if layer_norm is not None
              else _origin(layer, len(parts), bool(unfit), norm))
    embedding_lines = [call.line for call in run.embeddings]
    return Stage(
        id="embed", title=f"Where layer {layer}'s input comes from: {source}",
        code=code(*embedding_lines, norm.line if norm else None, captured.residual_line,
                  captured.norm_line),
        explanation=" ".join(said), shape_in=tuple(run.ids.shape), shape_out=tuple(x.shape),
        dims_in=("B", "T"), dims_out=BTC, tensors=tuple(records), checks=tuple(checks),
        kind="embed", source=_source(captured.norm_line or captured.attention_line),
    )


def _origin(layer: int, n_parts: int, unfit: bool, norm: NormCall | None) -> str:
    """What layer L's attention reads when no layer norm of its own comes first (post-norm
    encoders: BERT, RoBERTa, DistilBERT): the embeddings (their sum, through the embeddings'
    own norm when the model has one) for layer 0, the residual stream after the blocks
    before it for a later layer."""
    if layer > 0:
        return f"the residual stream after {layer} block{'s' if layer > 1 else ''}"
    what = ("the embeddings" if unfit or not n_parts else
            "the embeddings' sum" if n_parts > 1 else "the token embeddings")
    return f"{what} through {norm.path}" if norm is not None else what


def _source(line: Line) -> Statement:
    """The model's statement at line, as the tracer reads statements."""
    from ..tracing.torch_ops import source_at

    return source_at(line.file, line.line) if line.file else Statement(file="", line=0, text="")
