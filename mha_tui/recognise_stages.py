"""The recogniser's second half: each kind of stage built from its ops, tensors and checks.

`recognise` decides which ops make which stage; this module decides what a stage shows:
the tensors (named as the module names them, laid out on B, T, C, h, d_h axes), the
checks computed from the recorded values, the code lines and the words. Values are the
module's own snapshots; where mha-tui computes something itself (the expansion of a fused
`F.scaled_dot_product_attention`, a per-head comparison), the stage says so.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import numpy as np

from .recognise import BHTD, BHTT, BTC, BTHD, Builder, Embedded, _info, _plural, _Unit, _yes
from .records import Check, OpRecord, Recording, Ref, Snapshot, Source, Stage, TensorRecord
from .stages import NO_MASK, NO_MASK_ARGUMENT, stage_info

SDPA_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

SKIPPED_MASK = (
    "No mask was applied (--no-causal): the module's masking lines did not run, so every "
    "token may attend to every token, later ones included, and the scaled scores go on to "
    "softmax unchanged.")
PER_HEAD_PROJECT = (
    "Each of the {h} heads is its own module with its own query, key and value layers, C in "
    "and d_h out. Their outputs are shown side by side, d_h channels per head, exactly as one "
    "fused C x C layer per role would hold them: the same numbers, laid out the fused way.")
FUSED_PROJECT = (
    "One layer computes queries, keys and values at once: its output has 3C channels, and "
    "split (or chunk) cuts it into q, k and v of C channels each, windows onto the same memory. "
    "Within each, channels 0..d_h-1 will become head 0, the next d_h head 1, and so on.")
MATMUL_PROJECT = (
    "x times a (C, C) weight stored as (in, out): output channel j is column j of the weight "
    "(nn.Linear stores the transpose). Output channels 0..d_h-1 will become head 0, the next "
    "d_h head 1, and so on.")
MATMUL_W_O = (
    "A final C x C projection, x @ W with W stored as (in, out), mixes the heads: every output "
    "channel is a weighted sum over all C input channels, so over every head.")


def _synthetic(values: np.ndarray) -> Snapshot:
    """A tensor mha-tui computed itself (an expansion step): contiguous, its own memory."""
    values = np.ascontiguousarray(values)
    strides = tuple(s // values.itemsize for s in values.strides) if values.itemsize else ()
    return Snapshot(values=values, shape=tuple(values.shape), strides=strides, contiguous=True,
                    storage=-1 - id(values) % 1_000_000, dtype=str(values.dtype))


def _targets(text: str) -> list[str]:
    """`q, k, v = ...` -> ["q", "k", "v"]; `scores = ...` -> ["scores"]."""
    match = re.match(r"\s*([A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_][\w]*)*)\s*(?::[^=]*)?=(?!=)", text)
    return [t.strip() for t in match.group(1).split(",")] if match else []


def _softmax(values: np.ndarray) -> np.ndarray:
    shifted = values - np.max(values, axis=-1, keepdims=True)
    shifted = np.where(np.isnan(shifted), -np.inf, shifted)
    e = np.exp(shifted)
    return (e / np.sum(e, axis=-1, keepdims=True)).astype(values.dtype)


def _joined_explanation(joined: str, batched: bool) -> str:
    """The concat stage's words when the heads' outputs are joined, not transposed back."""
    head_out, out = ("(B, T, d_h)", "(B, T, C)") if batched else ("(T, d_h)", "(T, C)")
    return (f"Each head returned its own {head_out} output, rows already in token order, so "
            f"nothing needs moving back: {joined} along the last axis lays the h outputs side "
            f"by side, {out}. Head i's d_h channels become channels i*d_h..(i+1)*d_h-1 of every "
            "token's row, the same layout a fused module gets from transpose and view.")


class StageMaker:
    def __init__(self, b: Builder, rec: Recording) -> None:
        self.b, self.g, self.rec, self.s = b, b.g, rec, b.sizes
        self.made: dict[str, Stage] = {}
        self.out_of_kind: dict[str, tuple[np.ndarray, Snapshot]] = {}

    # ------------------------------------------------------------ helpers

    def op(self, i: int) -> OpRecord:
        return self.g.ops[i]

    def snap(self, ref: Ref) -> Snapshot:
        return self.rec.snapshot(ref)

    def x_in(self, op: OpRecord) -> Ref:
        return self.g.x_inputs(op)[0]

    def tensor_name(self, op: OpRecord, position: int = 0, fallback: str = "") -> str:
        targets = _targets(op.source.text)
        if not targets and op.in_place and op.inputs:  # scores.masked_fill_(...): still scores
            producer = self.g.producer(op.inputs[0])
            if producer is not None:
                return self.tensor_name(producer, op.inputs[0].output, fallback)
        if len(targets) > position:
            return targets[position]
        if targets and len(op.outputs) == 1:
            return targets[0]
        return fallback or self.b.name(op)

    def expr(self, ref: Ref, depth: int = 0) -> str:
        """A readable expression for a helper tensor: `causal_mask[:4, :4]`, `tril[:4, :4] == 0`."""
        if ref.kind in ("param", "buffer", "input"):
            return ref.name
        if ref.kind == "const":
            return "a constant"
        op = self.g.producer(ref)
        if op is None or depth > 6:
            return "a tensor"
        base = self.expr(op.inputs[0], depth + 1) if op.inputs else op.name
        if op.name == "getitem":
            index = op.args[1] if len(op.args) > 1 else ()
            parts = index if isinstance(index, tuple) and index and isinstance(index[0], tuple) else (index,)
            return f"{base}[{', '.join(_index(p) for p in parts)}]"
        if op.name in ("eq", "ne", "lt", "le", "gt", "ge"):
            ops = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
            other = op.scalars()
            return f"{base} {ops[op.name]} {other[0] if other else '...'}"
        if op.name in ("bool", "float", "logical_not", "bitwise_not", "tril", "triu"):
            return f"{base}.{op.name}()" if op.name != "bitwise_not" else f"~{base}"
        return f"{op.name}({base})"

    def _spelled(self, ref: Ref, op: OpRecord) -> str:
        """The mask as the module's line spells it (`self.causal_mask[:T, :T]`), else composed."""
        composed = self.expr(ref)
        if composed.count("(") > 1:  # a chain of conversions: name where it started
            root = re.sub(r"^.*\(([^()]*)\).*$", r"\1", composed)
            return f"{root} (converted: {composed.split('(')[0]} ...)"
        base = composed.split("[", 1)[0].split(".", 1)[0]
        texts = [op.source.text] + [self.op(i).source.text for i in range(max(0, op.index - 4), op.index)]
        for text in texts:
            found = re.search(rf"(?<![\w.])(?:self\.)?{re.escape(base)}(?:\.\w+\(\))?\[[^\]]*\]"
                              rf"(?:\s*==\s*\w+)?", text) if base else None
            if found:
                return found.group(0).removeprefix("self.")
        return composed

    def code(self, indices: Iterable[int]) -> tuple[str, Source | None]:
        seen: list[Source] = []
        for i in sorted(indices):
            src = self.op(i).source
            if src.text and all((s.file, s.line) != (src.file, src.line) for s in seen):
                seen.append(src)
        seen.sort(key=lambda s: (s.file != (seen[0].file if seen else ""), s.line))
        return "\n".join(s.text for s in seen), (seen[0] if seen else None)

    def stage(self, unit: _Unit, stage_id: str, kind: str, tensors: list[TensorRecord],
              checks: list[Check], *, shape_in: tuple[int, ...], shape_out: tuple[int, ...],
              dims_in: tuple[str, ...], dims_out: tuple[str, ...], note: str = "",
              aside: tuple[TensorRecord, ...] = (), title: str | None = None,
              explanation: str | None = None, extra_ops: Iterable[int] = ()) -> Stage:
        indices = sorted({*unit.ops, *unit.helpers, *unit.folded, *extra_ops})
        code, source = self.code(indices)
        default_title, default_explanation = _info(kind)
        for i in unit.folded:
            op = self.op(i)
            who = f"{op.module}: " if op.module else ""
            checks.append(Check(f"{who}dropout(p={op.kwarg('p', _p(op))}) "
                                f"{'in eval mode ' if op.kwarg('training') is False else ''}"
                                "left the numbers unchanged", True))
        stage = Stage(
            id=stage_id, title=title or default_title, code=code,
            explanation=explanation if explanation is not None else default_explanation,
            shape_in=tuple(shape_in), shape_out=tuple(shape_out), dims_in=dims_in,
            dims_out=dims_out, tensors=tuple(tensors), checks=tuple(checks), note=note,
            aside=aside, kind=kind, source=source, ops=tuple(self.op(i) for i in indices),
        )
        self.made[kind] = stage
        return stage

    def dims(self, shape: tuple[int, ...], *prefer: tuple[str, ...]) -> tuple[str, ...]:
        return self.b.dims(shape, prefer)

    # ------------------------------------------------------------ embed

    def embed(self, e: Embedded) -> Stage:
        ids, table, x = e.ids, e.table, e.x
        title, explanation = _info("embed")
        n = self.s.T
        return Stage(
            id="embed", title=title, code=e.source.text, explanation=explanation,
            shape_in=ids.shape, shape_out=x.shape, dims_in=("B", "T"), dims_out=BTC,
            tensors=(
                self.b.record("ids", ids, ("B", "T"), kind="int"),
                self.b.record(e.table_name, table, ("vocab", "C"),
                              caption="one learned row per vocabulary entry"),
                self.b.record("x", x, BTC, share=(e.table_name, table)),
            ),
            checks=(Check(f"x[{'0, ' if self.s.batched else ''}t] is row ids[t] of the embedding table for "
                          f"{_all(n, 'token')}", e.looked_up),),
            kind="embed", source=e.source,
        )

    # ------------------------------------------------------------ project

    def project(self, unit: _Unit, stage_id: str, kind: str = "project") -> Stage:
        b, g, s = self.b, self.g, self.s
        mains = [self.op(i) for i in unit.ops if self.op(i).name not in ("split", "chunk", "unbind",
                                                                         "tensor_split", "getitem")]
        products = [op for op in mains if op.name in ("linear", "addmm", "matmul", "mm", "einsum")]
        splits = [self.op(i) for i in unit.ops if self.op(i).name in ("split", "chunk", "unbind",
                                                                      "tensor_split", "getitem")]
        x_ref = self.x_in(self.op(min(i for i in unit.ops if self.g.x_inputs(self.op(i)))))
        x_snap = self.snap(x_ref)
        tensors: list[TensorRecord] = []
        outputs: list[TensorRecord] = []
        ok_all = True
        has_bias = False
        by_role: dict[str, list[OpRecord]] = {}
        for op in products:
            by_role.setdefault(b.role(op) if kind == "project" else "O", []).append(op)
        heads_split = kind == "project" and s.h > 1
        for role, ops in by_role.items():
            ops = sorted(ops, key=lambda o: g.head.get(o.index, 0))
            weights, biases, outs = [], [], []
            for op in ops:
                w_ref = next(r for r in g.other_inputs(op) if self.snap(r).ndim == 2)
                w = self.snap(w_ref)
                bias_refs = [r for r in g.other_inputs(op) if self.snap(r).ndim == 1]
                xin = self.snap(self.x_in(op)).values.astype(np.float64)
                wv = w.values.astype(np.float64)
                # nn.Linear stores (out, in) and computes x @ W.T; addmm / x @ W use (in, out)
                stored_out_in = op.name == "linear"
                product = xin @ (wv.T if stored_out_in else wv) if op.name != "einsum" else None
                last = self._result_of(op, unit)
                if product is not None:
                    if bias_refs:
                        product = product + self.snap(bias_refs[0]).values
                        has_bias = True
                    ok_all &= bool(np.allclose(product.reshape(last.values.shape), last.values,
                                               atol=1e-5, rtol=1e-4))
                weights.append((w_ref, w, stored_out_in))
                biases.extend(self.snap(r) for r in bias_refs)
                outs.append((op, last))
            self._projection_records(role, ops, weights, biases, outs, tensors, outputs,
                                     heads_split, kind)
        if splits and kind == "project":
            outputs = self._split_records(splits, heads_split)
        checks = []
        names = ", ".join(r.name for r in outputs) or "the outputs"
        layer = ("nn.Linear" if any(o.name == "linear" for o in products)
                 else products[0].name if products else "")
        checks.append(Check(f"{names} {'each ' if len(outputs) > 1 else ''}equal "
                            f"x @ W{'.weight.T' if layer == 'nn.Linear' else ''}"
                            f"{' + b' if has_bias else ''} ({layer}"
                            f"{', with bias' if has_bias else ', no bias'})", ok_all))
        if self.b.head_modules and kind == "project":
            checks.append(Check(f"each of the {s.h} heads ran as its own module with its own "
                                f"layers; shown side by side as one fused module would hold them",
                                None))
        out_snap = outputs[0] if outputs else None
        shape_out = out_snap.shape if out_snap else x_snap.shape
        explanation = None
        if kind == "project":
            if self.b.per_head:
                explanation = PER_HEAD_PROJECT.format(h=s.h)
            elif splits:
                explanation = FUSED_PROJECT
            elif layer != "nn.Linear":
                explanation = MATMUL_PROJECT
        elif layer != "nn.Linear":
            explanation = MATMUL_W_O
        stage = self.stage(unit, stage_id, kind, tensors + outputs, checks, explanation=explanation,
                           shape_in=x_snap.shape, shape_out=shape_out,
                           dims_in=self.dims(x_snap.shape, BTC),
                           dims_out=out_snap.dims if out_snap else BTC)
        return stage

    def _result_of(self, op: OpRecord, unit: _Unit) -> Snapshot:
        """The projection's result after its own plumbing (Conv1D's view back to 3-D)."""
        result = op.out
        for i in sorted(unit.ops):
            later = self.op(i)
            if i > op.index and later.name in ("view", "reshape") and later.inputs and \
                    later.inputs[0].op == op.index:
                result = later.out
        return result

    def _projection_records(self, role: str, ops: list[OpRecord], weights: list, biases: list,
                            outs: list, tensors: list[TensorRecord], outputs: list[TensorRecord],
                            heads_split: bool, kind: str) -> None:
        b, s = self.b, self.s
        if not ops:
            return
        first_w_ref, first_w, out_in = weights[0]
        name = self.tensor_name(ops[0], fallback="out" if kind == "w_o" else role)
        leaf = ops[0].module.rsplit(".", 1)[-1]
        if leaf and leaf not in ops[0].source.text:  # the line is inside the layer (Conv1D)
            name = "out" if kind == "w_o" else f"{ops[0].module}(x)"
        if len(ops) > 1:  # one layer per head: rows stacked as a fused layer's
            values = np.concatenate([w.values if o else w.values.T for _, w, o in weights], axis=0)
            w_name = re.sub(r"\.\d+(?=\.|$)", ".*", first_w_ref.name)
            w_rec = b.record(f"{w_name}", first_w, ("C_out", "C_in"), values=values, head_split=0,
                             caption=f"each head's own layer, stacked: rows {s.d_h} at a time are "
                                     f"one head's (stored as (out, in) per head)")
            out_values = np.concatenate([last.values for _, last in outs], axis=-1)
            out_rec = b.record(name, outs[0][1], BTC if out_values.shape[-1] == s.C else None,
                               values=out_values, head_split=2,
                               caption=f"heads side by side: channels {s.d_h} at a time come "
                                       f"from one head's module")
        else:
            last = outs[0][1]
            if out_in:
                caption = (f"stored as (out, in); {name} = x @ {first_w_ref.name}.T"
                           f"{' + bias' if biases else ''}")
                dims = ("C_out", "C_in")
                split_axis = 0
            else:
                caption = f"stored as (in, out); {name} = x @ {first_w_ref.name}{' + bias' if biases else ''}"
                dims = ("C_in", "C_out")
                split_axis = 1
            wide = first_w.values.shape[split_axis] == s.C
            if kind == "project" and heads_split and wide:
                caption += f"; {'rows' if out_in else 'columns'} {s.d_h} at a time feed one head"
            if kind == "w_o":
                caption = (f"stored as ({'out, in' if out_in else 'in, out'}); columns in blocks "
                           f"of d_h come from one head each, and every row reads all of them"
                           if out_in else
                           "stored as (in, out); rows in blocks of d_h come from one head each, "
                           "and every column reads all of them")
                split_axis = 1 if out_in else 0
            w_rec = b.record(first_w_ref.name, first_w, dims,
                             head_split=split_axis if (wide or kind == "w_o") and s.h > 1 else None,
                             caption=caption)
            out_rec = b.record(name, last, self.dims(last.shape, BTC),
                               share=("x", self.snap(self.x_in(ops[0]))),
                               head_split=2 if kind == "project" and last.shape[-1] == s.C and s.h > 1
                               else None,
                               caption=f"channels in blocks of d_h={s.d_h}, one block per head"
                               if kind == "project" and last.shape[-1] == s.C and heads_split else "")
        tensors.append(w_rec)
        for bias in biases[:1] if len(ops) == 1 else []:
            tensors.append(b.record(f"{first_w_ref.name.rsplit('.', 1)[0]}.bias", bias, ("C",)))
        outputs.append(out_rec)

    def _split_records(self, splits: list[OpRecord], heads_split: bool) -> list[TensorRecord]:
        b, s = self.b, self.s
        records = []
        for op in splits:
            source = self.snap(self.x_in(op))
            for n, out in enumerate(op.outputs):
                part = n
                if op.name == "getitem" and len(op.args) > 1 and isinstance(op.args[1], int):
                    part = op.args[1]
                name = self.tensor_name(op, part, fallback="qkv"[part] if part < 3 else f"part{part}")
                records.append(b.record(name, out, self.dims(out.shape, BTC),
                                        share=("the fused projection", source),
                                        head_split=2 if out.shape[-1] == s.C and s.h > 1 else None,
                                        caption=f"part {part} of the fused (C, 3C) projection; "
                                                f"channels in blocks of d_h={s.d_h}"))
        return records

    # ------------------------------------------------------------ view / transpose

    def view(self, unit: _Unit, stage_id: str) -> Stage:
        b = self.b
        ops = [self.op(i) for i in unit.ops]
        tensors, shared, same = [], True, True
        for op in ops:
            src_ref = self.x_in(op)
            src = self.snap(src_ref)
            source_name = self._origin_name(src_ref)
            tensors.append(b.record(self.tensor_name(op), op.out, self.dims(op.out.shape, BTHD),
                                    share=(source_name, src)))
            shared &= op.out.storage == src.storage
            same &= bool(np.array_equal(op.out.values.reshape(-1), src.values.reshape(-1)))
        names = ", ".join(t.name for t in tensors)
        first = ops[0]
        checks = [
            Check(f"{names} share storage with the projections: {_yes(shared)}"
                  f"{', nothing copied' if shared else ''}", shared),
            Check(f"the numbers are untouched: {tensors[0].name}.{first.name}(...) flattened back equals "
                  f"{tensors[0].name}", same),
        ]
        src = self.snap(self.x_in(first))
        return self.stage(unit, stage_id, "view", tensors, checks, shape_in=src.shape,
                          shape_out=first.out.shape, dims_in=self.dims(src.shape, BTC),
                          dims_out=self.dims(first.out.shape, BTHD))

    def _origin_name(self, ref: Ref) -> str:
        op = self.g.producer(ref)
        if op is None:
            return ref.name or "the input"
        kind = self.g.kind.get(op.index, op.name)
        stage = {"project": "project", "view": "view", "transpose": "transpose"}.get(kind, kind)
        if op.name in ("split", "chunk", "unbind"):
            return f"{stage}'s {self.tensor_name(op, ref.output)}"
        return f"{stage}'s {self.tensor_name(op)}"

    def _project_source(self, ref: Ref) -> Snapshot | None:
        """Follow a tensor back through view/transpose to the projection's (B, T, C) output."""
        for _ in range(8):
            op = self.g.producer(ref)
            if op is None:
                return None
            if self.g.kind.get(op.index) == "project":
                return op.outputs[ref.output]
            ref = self.x_in(op) if self.g.x_inputs(op) else ref
        return None

    def transpose(self, unit: _Unit, stage_id: str) -> Stage:
        b, s = self.b, self.s
        ops = [self.op(i) for i in unit.ops]
        tensors, blocks, shared = [], True, True
        first_projected: Snapshot | None = None
        q_projected: Snapshot | None = None
        for op in ops:
            src_ref = self.x_in(op)
            src = self.snap(src_ref)
            name = self.tensor_name(op)
            tensors.append(b.record(name, op.out, self.dims(op.out.shape, BHTD),
                                    share=(self._origin_name(src_ref), src)))
            shared &= op.out.storage == src.storage
            projected = self._project_source(src_ref)
            moved, from_projection = self._batched(op.out.values), None
            if projected is not None:
                from_projection = self._batched(projected.values)
            if from_projection is not None and moved.ndim == 4 and from_projection.ndim == 3:
                first_projected = first_projected or projected
                if self._role_of_chain(op) == "Q":
                    q_projected = projected
                for i in range(s.h):
                    blocks &= bool(np.array_equal(moved[:, i],
                                                  from_projection[:, :, i * s.d_h:(i + 1) * s.d_h]))
        out = ops[0].out
        checks = [
            Check(f"head i holds channels i*{s.d_h}..(i+1)*{s.d_h}-1 of every token", blocks),
            Check(f"same storage as the view, strides now {out.strides}, "
                  f"contiguous: {_yes(out.contiguous)}", shared),
        ]
        aside: tuple[TensorRecord, ...] = ()
        q = q_projected or first_projected
        q_name = tensors[0].name
        if q is not None and self._batched(q.values).ndim == 3 and self._batched(out.values).ndim == 4:
            wrong = q.values.reshape(out.values.shape)
            differs = not np.array_equal(wrong, out.values if self._role_of_chain(ops[0]) == "Q"
                                         else tensors[0].values)
            checks.append(Check(f"a single {q_name}.{self._wrong_call()} gives different heads: "
                                f"{_yes(differs)}", None))
            aside = (self._wrong_view(q, q_name, differs),)
        src = self.snap(self.x_in(ops[0]))
        facts = {"result_contiguous": out.contiguous,
                 "wrong_view_equal": bool(aside) and not aside[0].caption.startswith("WRONG")}
        explanation = stage_info("transpose").explain(facts, why=_single_axes(s.T, s.h))
        return self.stage(unit, stage_id, "transpose", tensors, checks, shape_in=src.shape,
                          shape_out=out.shape, dims_in=self.dims(src.shape, BTHD),
                          dims_out=self.dims(out.shape, BHTD), aside=aside, explanation=explanation)

    def _role_of_chain(self, op: OpRecord) -> str:
        ref = self.x_in(op)
        for _ in range(8):
            producer = self.g.producer(ref)
            if producer is None:
                return "?"
            if self.g.kind.get(producer.index) == "project":
                if producer.name in ("split", "chunk", "unbind"):
                    return "QKV"[min(ref.output, 2)]
                return self.b.role(producer)
            ref = self.x_in(producer)
        return "?"

    def _batched(self, values: np.ndarray) -> np.ndarray:
        """The values with a batch axis of 1 in front when the module has none (NumPy)."""
        return values if self.s.batched else values[None]

    def _wrong_call(self) -> str:
        """The tempting single call that splits heads without moving them."""
        return "view(B, h, T, d_h)" if self.s.batched else "reshape(h, T, d_h)"

    def _wrong_view(self, q: Snapshot, name: str, differs: bool) -> TensorRecord:
        s = self.s
        B, T, C = self._batched(q.values).shape
        token_of = np.repeat(np.arange(T), C).reshape(B, s.h, T, s.d_h)[..., 0]
        head_of = np.tile(np.arange(C) // s.d_h, T).reshape(B, s.h, T, s.d_h)[..., 0]
        tokens = self.b.config.tokens

        def word(t: int) -> str:
            if t >= len(tokens):
                return str(t)
            # A repeated token is told apart by its position ("the·0·h1"), as on token axes.
            return f"{tokens[t]}·{t}" if tokens.count(tokens[t]) > 1 else tokens[t]

        tags = tuple(tuple(f"{word(int(token_of[0, i, r]))}·h{int(head_of[0, i, r])}" for r in range(T))
                     for i in range(s.h))
        tag_heads = tuple(tuple(int(head_of[0, i, r]) for r in range(T)) for i in range(s.h))
        caption = (f"WRONG: one {self._wrong_call()} reads memory in the old order; each row is "
                   "labelled with the token and head block it really holds" if differs else
                   f"the same numbers as the right {name} here, because {_single_axes(T, s.h)}; "
                   f"each row is labelled with the token and head block it holds")
        values = q.values.reshape(B, s.h, T, s.d_h)
        if not s.batched:
            values = values[0]
        unit = q.values.itemsize if q.stride_unit == "bytes" else 1
        strided = Snapshot(values=values, shape=values.shape,
                           strides=tuple(n * unit for n in _c_strides(values.shape)),
                           contiguous=True, storage=q.storage, stride_unit=q.stride_unit)
        return self.b.record(f"{name}.{self._wrong_call()}", strided, BHTD, values=values,
                             share=(f"project's {name}", q), caption=caption,
                             row_tags=tags, row_tag_heads=tag_heads)

    # ------------------------------------------------------------ scores ... attend

    def _per_head_ops(self, unit: _Unit) -> list[list[OpRecord]]:
        return self.b.heads_of(unit.ops)

    def four_d(self, unit: _Unit, dims: tuple[str, ...]) -> tuple[np.ndarray, Snapshot]:
        return self.b.out_4d(unit.ops, dims)

    def scores(self, unit: _Unit, stage_id: str) -> Stage:
        values, snap = self.four_d(unit, BHTT)
        ok = True
        for group in self._per_head_ops(unit):
            for op in group:
                if op.name not in ("matmul", "bmm", "einsum", "mm", "baddbmm"):
                    continue
                a, c = (self.snap(r).values.astype(np.float64) for r in self.g.x_inputs(op)[:2])
                if op.name == "einsum":
                    equation = next((x for x in op.args if isinstance(x, str)), "")
                    product = np.einsum(equation, a, c)
                else:
                    product = a @ c
                if op.name == "baddbmm":
                    product = product + self.snap(self.g.other_inputs(op)[0]).values
                ok &= bool(np.allclose(product, op.out.values, atol=1e-5, rtol=1e-4))
        first = self.op(unit.ops[0])
        name = self.tensor_name(first, fallback="scores")
        h = self.s.h
        what = "einsum" if first.name == "einsum" else "batched matmul"
        checks = [Check(_batched(h, "Q_i @ K_i^T", what) if not self.b.per_head
                        else f"each head's own q @ k^T, {h} heads side by side", ok)]
        fused_mask = next((op for op in (self.op(i) for i in unit.ops) if op.name == "baddbmm"
                           and _very_negative_anywhere(self, op)), None)
        src = self.snap(self.x_in(first))
        if fused_mask is not None:
            return self._scores_and_mask(unit, stage_id, fused_mask, values, snap, src)
        rec = self.b.record(name, snap, BHTT if values.ndim == 4 else None, values=values,
                            caption="row: query token · column: key token")
        self.out_of_kind["scores"] = (values, snap)
        return self.stage(unit, stage_id, "scores", [rec], checks, shape_in=src.shape,
                          shape_out=values.shape if self.b.per_head else snap.shape,
                          dims_in=self.dims(src.shape, BHTD, ("T", "d_h")),
                          dims_out=rec.dims)

    def _scores_and_mask(self, unit: _Unit, stage_id: str, op: OpRecord, values: np.ndarray,
                         snap: Snapshot, src: Snapshot) -> list[Stage]:
        """torch.baddbmm(mask, q, k^T) adds the mask in the same call as the product: the
        product alone is mha-tui's expansion, the masked result is torch's own."""
        a, c = (self.snap(r).values for r in self.g.x_inputs(op)[:2])
        raw = (a @ c).astype(a.dtype)
        raw4 = raw.reshape(values.shape) if raw.size == values.size else raw
        bias_ref = self.g.other_inputs(op)[0]
        label = ("torch.baddbmm(mask, q, k^T) computes q @ k^T and adds the mask in one call; "
                 "this stage's product alone is computed by mha-tui from its inputs, the next "
                 "stage shows torch's own result.")
        scores = self.stage(unit, stage_id, "scores", [
            self.b.record("q @ k^T", _synthetic(raw4), BHTT if raw4.ndim == 4 else None,
                          caption="row: query token · column: key token (mha-tui's expansion)")],
            [Check(f"q @ k^T, {self.s.h} heads, computed here from baddbmm's inputs", None)],
            shape_in=src.shape, shape_out=snap.shape, dims_in=self.dims(src.shape, BHTD),
            dims_out=BHTT, note=label, title="Raw attention scores (mha-tui's expansion)")
        blocked = values <= -1e4
        kept = bool(np.allclose(values[~blocked], raw4[~blocked], rtol=1e-5, atol=1e-6)) \
            if raw4.shape == values.shape else True
        n_inf = int(np.isneginf(values).sum())
        bias = self.snap(bias_ref)
        mask = Stage(
            id="mask", title=_info("mask")[0], code=scores.code,
            explanation=_info("mask")[1], shape_in=snap.shape, shape_out=snap.shape,
            dims_in=BHTT, dims_out=BHTT,
            tensors=(self.b.record(self._spelled(bias_ref, op), bias, None,
                                   caption="added by baddbmm: 0 where a token may look, -inf where not"),
                     self.b.record(self.tensor_name(op, fallback="scores"), snap, BHTT, values=values)),
            checks=(Check(f"{n_inf} of {int(blocked.sum())} blocked entries are exactly -inf",
                          n_inf == int(blocked.sum())),
                    Check("entries the mask lets through equal the product "
                          "(allclose, rtol=1e-05, atol=1e-06)", kept)),
            kind="mask", source=scores.source, ops=scores.ops)
        self.made["mask"] = mask
        self.out_of_kind["scores"] = (raw4, snap)
        return [scores, mask]

    def scale(self, unit: _Unit, stage_id: str) -> Stage:
        s = self.s
        first = self.op(unit.ops[0])
        values, snap = self.four_d(unit, BHTT)
        factor = _scale_factor(self.g, first)
        before_ref = self.x_in(first)
        before = self.snap(before_ref)
        d_h = s.d_h
        sqrt = math.sqrt(d_h)
        divides = first.name in ("div", "div_", "true_divide")
        on_q = not self.g.op_derives(first, {"scores"})
        raw = "masked scores" if self.g.op_derives(first, {"mask"}) else "raw scores"
        if on_q:
            raw = f"{self._origin_name(before_ref).split(chr(39) + 's ')[-1]}"
        if divides and factor is not None and abs(factor - sqrt) < 1e-6 * max(1.0, sqrt):
            caption = f"{raw} / sqrt({d_h}) = {raw} / {sqrt:.4f}"
        elif not divides and factor is not None and abs(factor - 1 / sqrt) < 1e-6:
            caption = f"{raw} * d_h ** -0.5 = {raw} * {factor:.4f} = {raw} / sqrt({d_h})"
        elif factor is not None:
            caption = f"{raw} {'/' if divides else '*'} {factor:.6g}"
        else:
            caption = raw
        rec = self.b.record(self.tensor_name(first, fallback="scores"), snap,
                            BHTT if values.ndim == 4 and values.shape[-1] == s.T
                            else self.dims(values.shape, BHTD),
                            values=values, caption=caption)
        groups = self._per_head_ops(unit)
        if self.b.per_head and len(groups) > 1:  # every head's input, not only the first's
            before_values = np.stack([self.snap(self.x_in(grp[0])).values for grp in groups],
                                     axis=self.b.head_axis)
        else:
            before_values = self.b.out_4d([before_ref.op], BHTT)[0] if before_ref.op is not None \
                else before.values
        checks = []
        raw_f = before_values[np.isfinite(before_values)].astype(np.float64)
        new_f = values[np.isfinite(values)].astype(np.float64)
        if raw_f.size > 1 and new_f.size > 1:
            checks.append(Check(f"spread (std) of the scores: {raw_f.std(ddof=1):.4f} raw -> "
                                f"{new_f.std(ddof=1):.4f} scaled" if not on_q else
                                f"spread (std) of {rec.name}: {raw_f.std(ddof=1):.4f} -> "
                                f"{new_f.std(ddof=1):.4f}", None))
        else:
            checks.append(Check("a single score: nothing to spread", None))
        if factor is not None:
            expected = 1 / sqrt
            used = 1 / factor if divides else factor
            checks.append(Check(f"the factor is 1/sqrt(d_h) = 1/sqrt({d_h}): "
                                f"{_yes(abs(used - expected) < 1e-6)}", None))
        if on_q:
            note = "This module scales before the scores are computed (q * 1/sqrt(d_h)); same result."
        elif raw == "masked scores":
            note = "This module masks before it scales: -inf divided by sqrt(d_h) stays -inf."
        else:
            note = ""
        return self.stage(unit, stage_id, "scale", [rec], checks, shape_in=before_values.shape,
                          shape_out=values.shape if self.b.per_head else snap.shape, dims_in=rec.dims,
                          dims_out=rec.dims, note=note)

    def mask(self, unit: _Unit, stage_id: str) -> Stage:
        g = self.g
        groups = self._per_head_ops(unit)
        first = self.op(unit.ops[0])
        before_ref = self.x_in(first)
        values, snap = self.four_d(unit, BHTT)
        if self.b.per_head and len(groups) > 1:
            before_values = np.stack([self.snap(self.x_in(grp[0])).values for grp in groups],
                                     axis=self.b.head_axis)
        else:
            before_values = self.b.out_4d([before_ref.op], BHTT)[0] if before_ref.op is not None \
                else self.snap(before_ref).values
        mask_ref = next((r for r in g.other_inputs(first) if self.snap(r).values.size > 1), None)
        tensors = []
        how = first.name.rstrip("_")
        if mask_ref is not None:
            m = self.snap(mask_ref)
            if m.dtype == "bool":
                caption = ("True where the score is replaced" if how == "masked_fill" else
                           "True where the score is kept" if _where_keeps(first) else
                           "True where the score is replaced")
            else:
                caption = "0 where a token may look, -inf (or a large negative) where it may not"
            mask_values = m.values
            if mask_values.ndim == 2 and mask_values.shape[0] == mask_values.shape[1]:
                n = mask_values.shape[0]
                above = np.triu(np.ones((n, n), dtype=bool), 1)
                if m.dtype == "bool" and np.array_equal(mask_values, above):
                    caption = "True above the diagonal (a later token), False on and below it"
                elif m.dtype == "bool" and np.array_equal(mask_values, ~above):
                    caption = "True on and below the diagonal, False above it (a later token)"
                elif m.dtype != "bool" and np.isneginf(mask_values[above]).all() and \
                        (mask_values[~above] == 0).all():
                    caption = "0 on and below the diagonal, -inf above"
            tensors.append(self.b.record(self._spelled(mask_ref, first), m, self.dims(m.shape, ("T", "T")),
                                         values=mask_values, caption=caption,
                                         kind="int" if m.dtype == "bool" else "signed"))
        name = self.tensor_name(first, fallback="scores")
        before_op = g.producer(before_ref)
        before_name = self.tensor_name(before_op) if before_op is not None else "scores"
        stage_name = "scale" if g.op_derives(first, {"scale"}) else "scores"
        tensors.append(self.b.record(name, snap, BHTT if values.ndim == 4 else None, values=values,
                                     share=(f"{stage_name}'s {before_name}", self.snap(before_ref))))
        blocked = values <= -1e4 if values.dtype.kind == "f" else np.zeros(values.shape, bool)
        newly = blocked & ~(before_values <= -1e4) if before_values.shape == values.shape else blocked
        n_blocked = int(newly.sum())
        T = values.shape[-1]
        above = np.triu(np.ones((values.shape[-2], T), dtype=bool), 1)
        causal = values.ndim >= 2 and bool(np.array_equal(np.broadcast_to(above, values.shape), blocked))
        n_inf = int(np.isneginf(values[blocked]).sum()) if blocked.any() else 0
        kept = bool(np.array_equal(values[~blocked], before_values[~blocked])) \
            if before_values.shape == values.shape else True
        where = "above the diagonal" if causal else "the mask blocks"
        checks = [
            Check(f"{n_inf} of {int(blocked.sum())} entries {where} are exactly -inf"
                  if n_inf == int(blocked.sum()) or n_inf else
                  f"{int(blocked.sum())} entries {where} hold a large negative number "
                  f"({float(values[blocked].max()) if blocked.any() else 0:.3g})",
                  bool(blocked.any()) or n_blocked == 0),
            Check(f"entries {'on and below the diagonal' if causal else 'the mask lets through'} "
                  f"are unchanged", kept),
        ]
        note = ""
        if g.op_derives(first, {"scale"}) is False and "scale" not in self.made:
            note = "This module masks the raw scores, before scaling."
        if first.in_place:
            note = (note + " " if note else "") + (
                f"{first.name} changes the tensor in place; mha-tui recorded the scores before it ran, "
                "so the scores stage still shows them unmasked.")
        explanation = None
        if how == "masked_fill":
            explanation = ("A token may only attend to itself and earlier tokens. masked_fill "
                           "writes -inf wherever the boolean mask is True; softmax turns -inf into "
                           "exactly 0. The same (T, T) mask broadcasts over every batch and head.")
        elif how == "where":
            explanation = ("torch.where keeps a score where the condition allows it and puts a "
                           "large negative number elsewhere; softmax turns those into (almost) 0.")
        if blocked.any() and n_inf < int(blocked.sum()):
            # The words follow the recorded values: -1e9 or finfo.min is not -inf.
            fill = float(values[blocked].max())
            explanation = ("A token may only attend to itself and earlier tokens. The scores it "
                           f"may not look at are set to a large negative number ({fill:.3g}"
                           "), not -inf; softmax turns them into 0 to within float32 precision "
                           "(their exp underflows). The same (T, T) mask broadcasts over every "
                           "batch and head.")
        return self.stage(unit, stage_id, "mask", tensors, checks, shape_in=before_values.shape,
                          shape_out=values.shape, dims_in=tensors[-1].dims, dims_out=tensors[-1].dims,
                          note=note, explanation=explanation)

    def softmax(self, unit: _Unit, stage_id: str) -> Stage:
        first = self.op(unit.ops[0])
        values, snap = self.four_d(unit, BHTT)
        groups = self._per_head_ops(unit)
        if self.b.per_head and len(groups) > 1:
            before = np.stack([self.snap(self.x_in(grp[0])).values for grp in groups],
                                     axis=self.b.head_axis)
        else:
            ref = self.x_in(first)
            before = self.b.out_4d([ref.op], BHTT)[0] if ref.op is not None else self.snap(ref).values
        checks = _softmax_checks(values, before)
        ops = [self.op(i) for i in unit.ops]
        sums = [op for op in ops if op.name == "sum"]
        by_hand = any(op.name == "exp" for op in ops) and bool(sums)
        told = sums[0] if by_hand else first  # the op whose axis the rows are taken along
        dim = told.kwarg("dim", told.kwarg("axis", next((a for a in told.scalars()
                                                         if isinstance(a, int)), -1)))
        if dim not in (-1, values.ndim - 1, snap.ndim - 1):
            checks.append(Check(f"softmax over {'axis' if by_hand else 'dim'}={dim}, not the last "
                                f"axis: rows do not sum to 1", False))
        name_op = ops[-1] if by_hand else first
        rec = self.b.record(self.tensor_name(name_op, fallback="weights"), snap,
                            BHTT if values.ndim == 4 else None, values=values, kind="prob",
                            caption="row: query token · column: key token it takes from")
        note = "" if "mask" in self.made else "No mask was applied: every token may attend to every token."
        explanation = None
        if by_hand:
            stable = any(op.name == "sub" for op in ops)
            lines = len({(op.source.file, op.source.line) for op in ops})
            checks.append(Check(f"written by hand ({_plural(lines, 'line')}): "
                                f"{'subtract the row maximum, ' if stable else ''}exp, divide by the "
                                f"row sum; recognised from those ops as one softmax", None))
            checks.append(Check(f"the row maximum is subtracted before exp (no overflow): "
                                f"{_yes(stable)}", None))
            explanation = (_info("softmax")[1] + " Here softmax is written out by hand: "
                           + ("exp(s - max(s)) / sum(exp(s - max(s))) along each row. Subtracting "
                              "the row maximum changes nothing in the result and keeps exp from "
                              "overflowing." if stable else "exp(s) / sum(exp(s)) along each row."))
        return self.stage(unit, stage_id, "softmax", [rec], checks, shape_in=before.shape,
                          shape_out=values.shape, dims_in=rec.dims, dims_out=rec.dims, note=note,
                          explanation=explanation)

    def dropout(self, unit: _Unit, stage_id: str) -> Stage:
        op = self.op(unit.ops[0])
        src = self.snap(self.x_in(op))
        rec = self.b.record(self.tensor_name(op), op.out, self.dims(op.out.shape, BHTT, BTC))
        zeros = int((op.out.values == 0).sum() - (src.values == 0).sum())
        checks = [Check(f"dropout zeroed {zeros} entries and scaled the rest by 1/(1-p)", None)]
        return self.stage(unit, stage_id, "dropout", [rec], checks, shape_in=src.shape,
                          shape_out=op.out.shape, dims_in=rec.dims, dims_out=rec.dims)

    def attend(self, unit: _Unit, stage_id: str) -> Stage:
        values, snap = self.four_d(unit, BHTD)
        ok = True
        for group in self._per_head_ops(unit):
            for op in group:
                if op.name not in ("matmul", "bmm", "einsum", "mm"):
                    continue
                a, c = (self.snap(r).values.astype(np.float64) for r in self.g.x_inputs(op)[:2])
                product = np.einsum(next(x for x in op.args if isinstance(x, str)), a, c) \
                    if op.name == "einsum" else a @ c
                ok &= bool(np.allclose(product, op.out.values, atol=1e-5, rtol=1e-4))
        first = self.op(unit.ops[0])
        h = self.s.h
        what = "einsum" if first.name == "einsum" else "batched matmul"
        checks = [Check(_batched(h, "weights_i @ V_i", what) if not self.b.per_head
                        else f"each head's own weights @ v, {h} heads side by side", ok)]
        rec = self.b.record(self.tensor_name(first, fallback="context"), snap,
                            BHTD if values.ndim == 4 else None, values=values,
                            caption="row t: token t's weighted mix of values")
        self.out_of_kind["attend"] = (values, snap)
        src = self.snap(self.x_in(first))
        return self.stage(unit, stage_id, "attend", [rec], checks, shape_in=src.shape,
                          shape_out=values.shape if self.b.per_head else snap.shape,
                          dims_in=self.dims(src.shape, BHTT, ("T", "T")), dims_out=rec.dims)

    # ------------------------------------------------------------ concat / w_o

    def concat(self, unit: _Unit, stage_id: str) -> Stage:
        b, s = self.b, self.s
        ops = [self.op(i) for i in unit.ops]
        final = ops[-1]
        attend_values = self.out_of_kind.get("attend", (None, None))[0]
        attend_snap = self.out_of_kind.get("attend", (None, None))[1]
        tensors, checks = [], []
        moved = next((op for op in ops if op.name in ("transpose", "permute")), None)
        if moved is not None:
            src = self.snap(self.x_in(moved))
            src_name = self.tensor_name(self.g.producer(self.x_in(moved))) \
                if self.g.producer(self.x_in(moved)) else "context"
            args = ", ".join(str(a) for a in moved.scalars())
            strided_name = f"{src_name}.{moved.name}({args})"
            tensors.append(b.record(strided_name, moved.out, self.dims(moved.out.shape, BTHD),
                                    share=(f"attend's {src_name}", src)))
            shares = moved.out.storage == src.storage
            checks.append(Check(f"the transposed view shares storage: {_yes(shares)}, "
                                f"contiguous: {_yes(moved.out.contiguous)}", shares))
            if final is not moved:
                copied = final.out.storage != moved.out.storage
                checks.append(Check(f"contiguous() copied the numbers into new storage: {_yes(copied)}"
                                    if any(op.name == "contiguous" for op in ops) else
                                    f"reshape copied the numbers into new memory (a view cannot "
                                    f"read them in this order): {_yes(copied)}"
                                    if final.name == "reshape" and not moved.out.contiguous else
                                    f"the result has its own storage: {_yes(copied)}",
                                    copied or moved.out.contiguous))
        name = self.tensor_name(final, fallback="context")
        if final.name in ("cat", "concat", "stack"):
            share = None
        else:
            share = ("the transposed view", moved.out) if moved is not None and final is not moved else None
        tensors.append(b.record(name, final.out, self.dims(final.out.shape, BTC), share=share,
                                head_split=2 if s.h > 1 else None,
                                caption="heads side by side: block i is head i's output"))
        merged = self._batched(final.out.values)
        per_head = self._batched(attend_values) if attend_values is not None else None
        if per_head is not None and merged.ndim == 3 and per_head.ndim == 4:
            blocks = all(np.array_equal(merged[:, :, i * s.d_h:(i + 1) * s.d_h],
                                        per_head[:, i]) for i in range(s.h))
            checks.append(Check(f"channels i*{s.d_h}..(i+1)*{s.d_h}-1 hold head i's {name}", blocks))
        if final.name in ("cat", "concat", "concatenate"):
            joined = "np.concatenate" if final.name == "concatenate" else "torch.cat"
            checks.insert(0, Check(f"{joined} put the {s.h} heads' outputs side by side along the "
                                   f"last axis", None))
        stacked = next((op for op in ops if op.name == "stack"), None)
        if stacked is not None:
            checks.insert(0, Check(f"np.stack put the {s.h} heads' outputs on a new head axis: "
                                   f"{_shape_text(stacked.out.shape)}", None))
        src_shape = attend_snap.shape if attend_snap is not None else self.snap(self.x_in(ops[0])).shape
        explanation = None
        if moved is not None and any(op.name == "contiguous" for op in ops):
            explanation = stage_info("concat").explain(
                {"strided_contiguous": moved.out.contiguous}, why=_single_axes(s.T, s.h))
        elif moved is None and final.name in ("cat", "concat", "concatenate"):
            explanation = _joined_explanation(
                "np.concatenate" if final.name == "concatenate" else "torch.cat", s.batched)
        return self.stage(unit, stage_id, "concat", tensors, checks,
                          shape_in=self.snap(self.x_in(ops[0])).shape if not self.b.per_head
                          else b.unbatched((s.B, s.h, s.T, s.d_h), BHTD) if attend_values is not None
                          else src_shape,
                          shape_out=final.out.shape, explanation=explanation,
                          dims_in=BHTD, dims_out=self.dims(final.out.shape, BTC))

    def w_o(self, unit: _Unit, stage_id: str) -> Stage:
        stage = self.project(unit, stage_id, kind="w_o")
        s = self.s
        weight = next((t for t in stage.tensors if t.dims in (("C_out", "C_in"), ("C_in", "C_out"))), None)
        checks = list(stage.checks)
        in_axis = -1 if weight is not None and weight.dims[0] == "C_out" else 0
        if weight is not None and s.h > 1 and weight.values.shape[in_axis] == s.h * s.d_h:
            w = weight.values if weight.dims[0] == "C_out" else weight.values.T
            mixes = all(bool((w[:, i * s.d_h:(i + 1) * s.d_h] != 0).any(axis=1).all()) for i in range(s.h))
            checks.insert(0, Check(f"every output channel reads from all {s.h} heads "
                                   f"(no all-zero block)", mixes))
        out = stage.tensors[-1]
        last = self.op(max([*unit.ops, *unit.helpers]))
        if last.out.shape != tuple(out.values.shape) and last.out.shape == (s.B, s.T, s.C):
            out = self.b.record(out.name, last.out, BTC)
        renamed = TensorRecord(**{**out.__dict__, "shares_with": "concat's " + self._concat_name(),
                                  "head_split": None, "caption": ""})
        object.__setattr__(stage, "tensors", (*stage.tensors[:-1], renamed))
        object.__setattr__(stage, "checks", tuple(c for c in checks if "nn.Linear" not in c.label
                                                  or ("bias" in c.label and c.ok is not True)))
        return stage

    def _concat_name(self) -> str:
        stage = self.made.get("concat")
        return stage.tensors[-1].name if stage else "context"

    # ------------------------------------------------------------ sdpa expansion

    def sdpa(self, unit: _Unit) -> list[Stage]:
        op = self.op(unit.ops[0])
        s = self.s
        q, k, v = (self.snap(r).values.astype(np.float32) for r in op.inputs[:3])
        attn_mask_ref = None
        for position, arg in enumerate(op.args):
            if position == 3 and hasattr(arg, "index"):
                attn_mask_ref = op.inputs[arg.index]  # type: ignore[attr-defined]
        kw_mask = op.kwarg("attn_mask")
        if hasattr(kw_mask, "index"):
            attn_mask_ref = op.inputs[kw_mask.index]  # type: ignore[attr-defined]
        is_causal = bool(op.kwarg("is_causal", op.args[5] if len(op.args) > 5 else False))
        factor = op.kwarg("scale")
        d = q.shape[-1]
        factor = float(factor) if isinstance(factor, int | float) else 1 / math.sqrt(d)
        L, S = q.shape[-2], k.shape[-2]
        raw = (q @ np.swapaxes(k, -2, -1)).astype(np.float32)
        scaled = (raw * np.float32(factor)).astype(np.float32)
        bias = np.zeros((L, S), dtype=np.float32)
        masked_by = []
        if is_causal:
            bias = np.where(np.tril(np.ones((L, S), dtype=bool)), bias, -np.inf).astype(np.float32)
            masked_by.append("is_causal=True")
        if attn_mask_ref is not None:
            m = self.snap(attn_mask_ref).values
            if m.dtype == bool:
                bias = np.where(m, bias, -np.inf).astype(np.float32)
            else:
                bias = (m + bias).astype(np.float32)
            masked_by.append(f"attn_mask={self.expr(attn_mask_ref)}")
        masked = (scaled + bias).astype(np.float32)
        weights = _softmax(masked)
        context = (weights @ v).astype(np.float32)
        fused = op.out.values
        diff = float(np.max(np.abs(context - fused))) if context.size else 0.0
        close = bool(np.allclose(context, fused, **SDPA_TOLERANCE))
        label = ("Computed by mha-tui from the inputs of F.scaled_dot_product_attention, the way "
                 "PyTorch documents its reference implementation; the module itself ran the fused op.")
        stages = []
        code, source = self.code([*unit.ops, *unit.helpers])
        ops = tuple(self.op(i) for i in sorted({*unit.ops, *unit.helpers}))

        def make(kind: str, name: str, values: np.ndarray, checks: list[Check], caption: str,
                 value_kind: str = "signed", extra: tuple[TensorRecord, ...] = ()) -> Stage:
            title, explanation = _info(kind)
            rec = self.b.record(name, _synthetic(values), self.dims(values.shape, BHTT, BHTD),
                                kind=value_kind, caption=caption)  # type: ignore[arg-type]
            return Stage(id=kind, title=title + " (mha-tui's expansion)", code=code,
                         explanation=explanation, shape_in=q.shape, shape_out=values.shape,
                         dims_in=self.dims(q.shape, BHTD), dims_out=rec.dims,
                         tensors=(*extra, rec), checks=tuple(checks), note=label, kind=kind,
                         source=source, ops=ops)

        stages.append(make("scores", "q @ k.transpose(-2, -1)", raw,
                           [Check(f"computed here: {s.h} heads' q_i @ k_i^T", None)],
                           "row: query token · column: key token"))
        stages.append(make("scale", "scores * scale", scaled,
                           [Check(f"scale = {f'1/sqrt({d})' if op.kwarg('scale') is None else 'scale='}"
                                  f" = {factor:.4f}", None)],
                           f"raw scores * {factor:.4f} = raw scores / sqrt({d})"))
        if masked_by:
            n = int(np.isneginf(np.broadcast_to(bias, masked.shape)).sum())
            stages.append(make("mask", "scores + attn_bias", masked,
                               [Check(f"{n} entries blocked by {' and '.join(masked_by)} are -inf", None)],
                               "attn_bias: 0 where a token may look, -inf where it may not"))
        stages.append(make("softmax", "attn_weight", weights, _softmax_checks(weights, masked),
                           "row: query token · column: key token it takes from", "prob"))
        fused_rec = self.b.record(self.tensor_name(op, fallback="y") + " (fused, from the module)",
                                  op.out, self.dims(op.out.shape, BHTD),
                                  caption="what F.scaled_dot_product_attention returned")
        stages.append(make("attend", "attn_weight @ v", context,
                           [Check(f"the expansion equals the fused output: allclose(rtol="
                                  f"{SDPA_TOLERANCE['rtol']:g}, atol={SDPA_TOLERANCE['atol']:g}) = "
                                  f"{close} (largest difference {diff:.2e})", close)],
                           "row t: token t's weighted mix of values", extra=(fused_rec,)))
        self.out_of_kind["attend"] = (fused, op.out)
        return stages

    # ------------------------------------------------------------ op / error

    def plain_op(self, unit: _Unit, stage_id: str) -> Stage:
        ops = [self.op(i) for i in unit.ops]
        tensors = []
        for op in ops:
            for ref in self.g.x_inputs(op)[:2]:
                snap = self.snap(ref)
                tensors.append(self.b.record(f"{op.name} input: {self._origin_name(ref)}", snap,
                                             self.dims(snap.shape)))
            for n, out in enumerate(op.outputs[:3]):
                tensors.append(self.b.record(self.tensor_name(op, n, fallback=op.name), out,
                                             self.dims(out.shape)))
        first = ops[0]
        args = ", ".join(repr(a) for a in first.scalars()[:4])
        title = f"{first.qualname}" + (f" ({args})" if args else "")
        explanation = ("No rule of mha-tui places this op in the attention recipe, so it is shown "
                       "as it ran: its line, what it consumed and what it made.")
        src = self.snap(self.g.x_inputs(first)[0]) if self.g.x_inputs(first) else first.out
        return self.stage(unit, stage_id, "op", tensors[-4:], [], shape_in=src.shape,
                          shape_out=ops[-1].out.shape, dims_in=self.dims(src.shape),
                          dims_out=self.dims(ops[-1].out.shape), title=title, explanation=explanation)

    def error(self) -> Stage:
        err = self.rec.error
        assert err is not None
        source = err.source
        last = self.rec.ops[-1] if self.rec.ops else None
        tensors = []
        if last is not None:
            tensors.append(self.b.record(f"last recorded tensor: {self.tensor_name(last)}", last.out,
                                         self.dims(last.out.shape, BHTD, BTHD, BTC)))
        return Stage(
            id="error", title=f"The forward raised {err.type}", code=source.text if source else "",
            explanation=err.message,
            shape_in=last.out.shape if last else (), shape_out=(), dims_in=tensors[0].dims if tensors else (),
            dims_out=(), tensors=tuple(tensors),
            checks=(Check(f"{err.type} at line {source.line if source else '?'}: every stage before "
                          f"this one ran; this line did not finish", False),),
            note="This is where the forward stopped: the message is torch's own.",
            kind="error", source=source, ops=(),
        )


def _all(n: int, noun: str) -> str:
    """"all 4 tokens", but "the one token": counts in labels read as plain English."""
    return f"the one {noun}" if n == 1 else f"all {n} {noun}s"


def _single_axes(T: int, h: int) -> str:
    """Why a transpose of T and h moved nothing in memory (the reason, for an explanation)."""
    if h == 1 and T == 1:
        return "there is only one head and one token"
    return "there is only one head" if h == 1 else "there is only one token"


def _batched(h: int, product: str, what: str = "batched matmul") -> str:
    if h == 1:
        return f"one {what} = the one head's {product.replace('_i', '_0')}"
    return f"one {what} = {h} separate per-head {product}"


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _index(part: object) -> str:
    if isinstance(part, tuple) and part and part[0] == "slice":
        start, stop, step = part[1:]
        text = f"{'' if start is None else start}:{'' if stop is None else stop}"
        return text + (f":{step}" if step is not None else "")
    if part is None:
        return "None"
    return str(part)


def _p(op: OpRecord) -> object:
    numbers = [a for a in op.scalars() if isinstance(a, float)]
    return numbers[0] if numbers else "?"


def _where_keeps(op: OpRecord) -> bool:
    """torch.where(cond, scores, -inf): True keeps; where(cond, -inf, scores): True replaces."""
    args = op.args
    return len(args) > 1 and hasattr(args[1], "index") and op.inputs[args[1].index].kind == "op"


def _very_negative_anywhere(maker: StageMaker, op: OpRecord) -> bool:
    from .recognise import _masks_somewhere

    others = maker.g.other_inputs(op)
    return bool(others) and _masks_somewhere(maker.g, others[0])


def _scale_factor(g, op: OpRecord) -> float | None:  # type: ignore[no-untyped-def]
    from .recognise import _scalar_operand

    return _scalar_operand(g, op)


def _softmax_checks(weights: np.ndarray, before: np.ndarray) -> list[Check]:
    deviation = float(np.abs(weights.sum(axis=-1, dtype=weights.dtype) - 1).max()) if weights.size else 0.0
    checks = [Check(f"every row sums to 1 (largest deviation {deviation:.2e})", deviation < 1e-5)]
    if before.shape == weights.shape:
        blocked = np.isneginf(before)
        n_blocked = int(blocked.sum())
        if n_blocked:
            n_zero = int((weights[blocked] == 0).sum())
            checks.append(Check(f"{n_zero} of {n_blocked} masked entries are exactly 0",
                                n_zero == n_blocked))
    return checks


def build_stages(b: Builder, units: list[_Unit], rec: Recording, *, embedded: Embedded | None,
                 forward_equal: bool | None, n_params: int | None) -> tuple[Stage, ...]:
    maker = StageMaker(b, rec)
    stages: list[Stage] = []
    if embedded is not None:
        stages.append(maker.embed(embedded))
    counts: dict[str, int] = {}
    for unit in units:
        kind = unit.kind
        counts[kind] = counts.get(kind, 0) + 1
        stage_id = kind if counts[kind] == 1 else f"{kind}-{counts[kind]}"
        try:
            if kind == "sdpa":
                stages.extend(maker.sdpa(unit))
                continue
            builder = getattr(maker, {"op": "plain_op"}.get(kind, kind))
            made = builder(unit, stage_id)
            stages.extend(made if isinstance(made, list) else [made])
        except Exception as error:  # a rule that misread: show the ops plainly, never crash
            fallback = maker.plain_op(unit, stage_id if kind == "op" else f"op-{kind}")
            object.__setattr__(fallback, "note", f"mha-tui could not lay this out as {kind} "
                                                 f"({type(error).__name__}: {error}); shown as it ran.")
            stages.append(fallback)
    if not b.config.causal and not any(st.kind == "mask" for st in stages):
        _skipped_mask(stages, b)
    if n_params is not None:
        _add_param_check(stages, n_params, b)
    if rec.error is not None:
        stages.append(maker.error())
    elif forward_equal is not None and stages:
        last = stages[-1]
        if rec.output is not None and rec.output.kind == "op":
            last = next((st for st in stages if any(op.index == rec.output.op for op in st.ops)), last)
        name = last.tensors[-1].name if last.tensors else "the output"
        object.__setattr__(last, "checks", (*last.checks, Check(
            f"{name} equals the module's own forward, {_own_forward(rec)} = {forward_equal}",
            forward_equal)))
    if not b.sizes.batched:
        _unbatch_dims(stages, b)
    return tuple(stages)


def _own_forward(rec: Recording) -> str:
    if rec.library == "numpy":
        return f"module.forward({', '.join(name for name, _ in rec.inputs)}): np.array_equal"
    return "module(x): torch.equal"


def _unbatch_dims(stages: list[Stage], b: Builder) -> None:
    """No batch axis (NumPy's (T, C)): a stage's dims say (T, C), never (B, T, C), and its
    words say what NumPy does (x @ W, reshape, no batch)."""
    for stage in stages:
        for field_name, shape in (("dims_in", stage.shape_in), ("dims_out", stage.shape_out)):
            dims = getattr(stage, field_name)
            if len(dims) == len(shape) + 1:
                object.__setattr__(stage, field_name, b.unbatched(dims, dims))
        try:
            info = stage_info(stage.kind)
        except KeyError:
            continue
        object.__setattr__(stage, "explanation", info.reword(stage.explanation))
        if stage.title == "Move the head axis next to the batch axis":
            object.__setattr__(stage, "title", "Move the head axis in front")


def _add_param_check(stages: list[Stage], n_params: int, b: Builder) -> None:
    for stage in stages:
        if stage.kind == "project":
            C = b.sizes.C
            four = n_params == 4 * C * C
            label = (f"the module has {n_params} parameters = 4 * C^2 = 4 * {C}^2, whatever h is"
                     if four else f"the module has {n_params} parameters")
            object.__setattr__(stage, "checks", (*stage.checks, Check(label, True if four else None)))
            return


def _skipped_lines(before: Stage, after: Stage) -> tuple[str, Source] | None:
    """The module's own lines between the scale stage's statement and softmax's that did not
    run (an `if` that was False and its body), read from the file, each marked as skipped."""
    import linecache

    if before.source is None or not after.ops:
        return None
    start = max(op.source.end_line or op.source.line for op in before.ops) if before.ops else 0
    end = after.ops[0].source.line
    file = after.ops[0].source.file
    if not start or file != before.source.file or end - start < 2:
        return None
    lines = [linecache.getline(file, n).rstrip("\n") for n in range(start + 1, end)]
    code = [line for line in lines if line.strip() and not line.strip().startswith("#")]
    if not code or not code[0].strip().startswith("if "):
        return None
    indent = min(len(line) - len(line.lstrip()) for line in code)
    marked = []
    for n, line in enumerate(code):
        text = line[indent:].split("  # ", 1)[0].rstrip()
        marked.append(text + ("  # False: the line below did not run" if n == 0 and text.startswith("if ")
                              else "  # skipped, did not run"))
    return "\n".join(marked), Source(file=file, line=start + 1, text="\n".join(marked), end_line=end - 1)


def _skipped_mask(stages: list[Stage], b: Builder) -> None:
    """--no-causal on a module whose mask line is guarded: say that no mask ran, after scale,
    showing the module's own guarded lines as skipped."""
    at = next((i for i, st in enumerate(stages) if st.kind == "scale"), None)
    softmax = next((st for st in stages if st.kind == "softmax"), None)
    if at is None or not stages[at].tensors or softmax is None:
        return
    skipped = _skipped_lines(stages[at], softmax)
    if skipped is None and b.g.rec.library != "numpy":
        return
    scaled = stages[at].tensors[-1]
    passed = TensorRecord(**{**scaled.__dict__, "shares_storage": True,
                             "shares_with": f"scale's {scaled.name}",
                             "caption": "no mask: the scaled scores, unchanged"})
    same = bool(softmax.ops) and any(
        ref.kind == "op" and ref.op in {op.index for op in stages[at].ops}
        for ref in softmax.ops[0].inputs)
    numpy = b.g.rec.library == "numpy"
    info = NO_MASK_ARGUMENT if numpy else NO_MASK
    if skipped is not None:
        code, source = skipped
        explanation = info.explanation if numpy else SKIPPED_MASK
    else:
        code, source, explanation = info.code, None, info.explanation
    stages.insert(at + 1, Stage(
        id="mask", title=info.title, code=code, explanation=explanation,
        shape_in=stages[at].shape_out, shape_out=stages[at].shape_out, dims_in=scaled.dims,
        dims_out=scaled.dims, tensors=(passed,),
        checks=(Check("no mask was applied: the scores are the scaled scores, the same tensor",
                      same),),
        kind="mask", source=source, ops=()))
