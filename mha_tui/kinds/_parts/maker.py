"""The helpers every kind's stage builder shares: the graph and sizes, a tensor's name as
the module's line spells it, the code lines of a stage, and `stage()` that assembles a
Stage with its words. A kind module's `build(m, unit, stage_id)` receives one StageMaker.

Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import numpy as np

from ...ops.graph import Graph
from ...ops.numeric import recomputed_agrees
from ...records import Check, OpRecord, Recording, Ref, Snapshot, Stage, Statement, TensorArg, TensorRecord
from ...stages import stage_info
from .builder import BHTT, Builder
from .unit import Unit


def synthetic(values: np.ndarray) -> Snapshot:
    """A tensor mha-tui computed itself (an expansion step): contiguous, its own memory."""
    values = np.ascontiguousarray(values)
    strides = tuple(s // values.itemsize for s in values.strides) if values.itemsize else ()
    return Snapshot(values=values, shape=tuple(values.shape), strides=strides, contiguous=True,
                    storage=-1 - id(values) % 1_000_000, dtype=str(values.dtype))


def _targets(text: str) -> list[str]:
    """`q, k, v = ...` -> ["q", "k", "v"]; `scores = ...` -> ["scores"]."""
    match = re.match(r"\s*([A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_][\w]*)*)\s*(?::[^=]*)?=(?!=)", text)
    return [t.strip() for t in match.group(1).split(",")] if match else []


def _context(op: OpRecord) -> tuple[tuple[str, str, int], ...]:
    """Where an op ran, outermost call first: the module's forward line that called the
    helper, ..., then the helper itself (its file and function)."""
    calls = tuple((c.file, c.function, c.line) for c in reversed(op.source.callers))
    return (*calls, (op.source.file, op.source.function, -1))


def _leaves(g: Graph, op: OpRecord) -> bool:
    """The op's result is read outside the helper it ran in, or by nobody (returned)."""
    here = _context(op)
    readers = [g.ops[c] for c in g.consumers.get(op.index, [])]
    return not readers or any(not _inside(_context(r), here) for r in readers)


_RESHAPES = {"view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze",
             "flatten", "unflatten", "swapaxes", "movedim"}


def _returned(g: Graph, op: OpRecord) -> OpRecord | None:
    """The op whose result the helper returns, when it is this op's result: the op itself
    when its result leaves the helper, or the reshape of it on the same statement that does
    (`out = t.view(...).transpose(1, 2); return out`); else None."""
    for _ in range(8):
        if _leaves(g, op):
            return op
        readers = [g.ops[c] for c in g.consumers.get(op.index, [])]
        same = [r for r in readers if r.source.line == op.source.line
                and r.source.file == op.source.file and r.name.rstrip("_") in _RESHAPES]
        if len(readers) != 1 or len(same) != 1:
            return None
        op = same[0]
    return None


def _runs_at(op: OpRecord, statement: Statement) -> bool:
    """The op ran at that statement itself (not in a helper it called)."""
    return (op.source.file, op.source.function) == (statement.file, statement.function) and \
        statement.line <= op.source.line <= max(statement.line, statement.end_line)


def _inside(where: tuple[tuple[str, str, int], ...], helper: tuple[tuple[str, str, int], ...]
            ) -> bool:
    """`where` is in the same call of the helper, or in a helper it called."""
    n = len(helper)
    return len(where) >= n and where[:n - 1] == helper[:n - 1] and \
        where[n - 1][:2] == helper[n - 1][:2]


def called(op: OpRecord) -> str:
    """`permute(0, 2, 1, 3)`, `transpose(1, 2)`: the op and its number arguments, a tuple of
    them spelled flat as torch's methods also take them."""
    args = [a for a in op.scalars() if isinstance(a, int | tuple | list)]
    flat = args[0] if len(args) == 1 and isinstance(args[0], tuple | list) else args
    return f"{op.name}({', '.join(str(a) for a in flat)})"


def words(kind: str) -> tuple[str, str]:
    """The kind's title and explanation from the catalogue, or the kind itself and nothing."""
    try:
        info = stage_info(kind)
        return info.title, info.explanation
    except KeyError:
        return kind, ""


def score_dims(m: StageMaker, values: np.ndarray) -> tuple[str, ...]:
    """The axes of a (B, h, T, T)-like tensor of scores a mechanism changed (soft-capped,
    with a sink column): BHTT when it is 4-d, else the labels its shape fits."""
    return BHTT if values.ndim == 4 else m.dims(values.shape, BHTT)


class StageMaker:
    """What every kind's builder shares: the graph, the sizes, naming, code lines, `stage()`."""

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
        outer = self._caller_target(op)
        if outer is not None:  # a helper's result: `q = split_heads(self.W_q(x))` names it q
            return outer
        targets = _targets(op.source.text)
        if not targets and op.in_place and op.inputs:  # scores.masked_fill_(...): still scores
            producer = self.g.producer(op.inputs[0])
            if producer is not None:
                return self.tensor_name(producer, op.inputs[0].output, fallback)
        if len(targets) > 1 and position == 0 and len(op.outputs) == 1:
            k = self._target_of(op, len(targets))
            if k is not None:  # xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
                return targets[k]
        if len(targets) > position:
            return targets[position]
        if targets and len(op.outputs) == 1:
            return targets[0]
        return fallback or self.b.name(op)

    def _caller_target(self, op: OpRecord) -> str | None:
        """The name the caller's line gives a tensor a helper of the module returns
        (`def split_heads(t): out = ...; return out`, called as `q = split_heads(...)`): the
        op's result leaves the helper (an op outside it reads it, or the forward returns
        it), and the nearest calling statement that assigns it has a target. None else."""
        callers = op.source.callers
        if not callers:
            return None
        here = _context(op)
        returned = _returned(self.g, op)
        if returned is None:
            return None  # read only inside the helper (or deeper): not what it returns
        readers = [self.g.ops[c] for c in self.g.consumers.get(returned.index, [])]
        for depth, caller in enumerate(callers):
            if any(_runs_at(r, caller) for r in readers):
                return None  # `out = softmax(scores) @ v`: the line goes on with it; out is not it
            targets = _targets(caller.text)
            if not targets:
                if caller.text.lstrip().startswith("return"):
                    continue  # `return split_heads(t)`: its caller names it
                return None
            if len(targets) == 1:
                return targets[0]
            # `q, k, v = map(split, (q, k, v))`: the k-th result leaving this call line
            line = (caller.file, caller.line)
            leaving = [o.index for o in self.g.ops if len(o.source.callers) > depth
                       and (o.source.callers[depth].file, o.source.callers[depth].line) == line
                       and _context(o) == here and _leaves(self.g, o)]
            if returned.index in leaving and len(leaving) % len(targets) == 0:
                return targets[leaving.index(returned.index) * len(targets) // len(leaving)]
            return None
        return None

    def _target_of(self, op: OpRecord, n: int) -> int | None:
        """Which of a line's n targets a one-output op's result is bound to: the k-th of the
        line's ops whose result leaves the line (in recorded order, a loop's passes in turn),
        when there are n of them (or n per pass); else None."""
        line = [o for o in self.g.ops if o.source.line == op.source.line
                and o.source.file == op.source.file]
        inside = {ref.op for o in line for ref in o.inputs if ref.kind == "op"}
        leaving = [o.index for o in line if o.index not in inside]
        if op.index not in leaving or len(leaving) % n or any(
                len(self.g.ops[i].outputs) != 1 for i in leaving):
            return None
        return leaving.index(op.index) % n

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
        if op.name in ("bitwise_or", "bitwise_and", "logical_or", "logical_and", "__or__",
                       "__and__", "or_", "and_") and len(op.inputs) == 2:
            sign = "|" if "or" in op.name else "&"
            return f" {sign} ".join(self._named(ref) for ref in op.inputs)  # future | too_far
        if op.name in ("bool", "float", "logical_not", "bitwise_not", "tril", "triu"):
            return f"{base}.{op.name}()" if op.name != "bitwise_not" else f"~{base}"
        return f"{op.name}({base})"

    def _named(self, ref: Ref) -> str:
        """A tensor by the name the module gave it (its statement's target), else its name."""
        producer = self.g.producer(ref)
        return self.tensor_name(producer) if producer is not None else (ref.name or "a tensor")

    def spelled(self, ref: Ref, op: OpRecord) -> str:
        """The mask as the module's line spells it (`self.causal_mask[:T, :T]`), else composed."""
        composed = self.expr(ref)
        if composed.count("(") > 1:  # a chain of ops made it: the name its line gives it
            producer = self.g.producer(ref)
            target = self.tensor_name(producer, ref.output, fallback="-") if producer else "-"
            if target.isidentifier():
                return target
            receiver = _receiver(op, ref)  # `alibi.baddbmm(...)`: the line's own name for it
            if receiver:
                return receiver
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

    def code(self, indices: Iterable[int]) -> tuple[str, Statement | None]:
        seen: list[Statement] = []
        for i in sorted(indices):
            src = self.op(i).source
            if src.text and all((s.file, s.line) != (src.file, src.line) for s in seen):
                seen.append(src)
        seen.sort(key=lambda s: (s.file != (seen[0].file if seen else ""), s.line))
        return "\n".join(s.text for s in seen), (seen[0] if seen else None)

    def stage(self, unit: Unit, stage_id: str, kind: str, tensors: list[TensorRecord],
              checks: list[Check], *, shape_in: tuple[int, ...], shape_out: tuple[int, ...],
              dims_in: tuple[str, ...], dims_out: tuple[str, ...], note: str = "",
              aside: tuple[TensorRecord, ...] = (), title: str | None = None,
              explanation: str | None = None, extra_ops: Iterable[int] = ()) -> Stage:
        indices = sorted({*unit.ops, *unit.helpers, *unit.folded, *extra_ops})
        code, source = self.code(indices)
        default_title, default_explanation = words(kind)
        for i in unit.folded:
            op = self.op(i)
            who = f"{op.module}: " if op.module else ""
            checks.append(Check(f"{who}dropout(p={op.kwarg('p', _p(op))}) "
                                f"{'in eval mode ' if op.kwarg('training') is False else ''}"
                                "left the numbers unchanged", None))
        note = " ".join(filter(None, [note, _einops_note([self.op(i) for i in indices])]))
        explanation = explanation if explanation is not None else default_explanation
        if "(T, T)" in explanation and len(shape_out) >= 2 and shape_out[-1] != shape_out[-2]:
            # a decode step's (1, T_k), cross-attention's (T_q, T_k): the real matrix, not (T, T)
            explanation = explanation.replace(
                "(T, T)", f"T_q x T_k = {shape_out[-2]} x {shape_out[-1]}")
        stage = Stage(
            id=stage_id, title=title or default_title, code=code,
            explanation=explanation,
            shape_in=tuple(shape_in), shape_out=tuple(shape_out), dims_in=dims_in,
            dims_out=dims_out, tensors=tuple(tensors), checks=tuple(checks), note=note,
            aside=aside, kind=kind, source=source, ops=tuple(self.op(i) for i in indices),
        )
        self.made[kind] = stage
        return stage

    def dims(self, shape: tuple[int, ...], *prefer: tuple[str, ...]) -> tuple[str, ...]:
        return self.b.dims(shape, prefer)

    def broadcast_dims(self, shape: tuple[int, ...], *prefer: tuple[str, ...],
                       onto: tuple[tuple[int, ...], tuple[str, ...]]) -> tuple[str, ...]:
        """The dims of a tensor the op broadcasts onto another whose dims are known (a mask
        onto the (B, h, T, T) scores): the caller's layouts when one fits, else each axis
        named as the axis it meets, aligned from the right, and `1` where a size-1 axis is
        spread over that axis (HF's (B, 1, T, T) mask over the heads)."""
        dims = self.dims(shape, *prefer)
        target_shape, target_dims = onto
        if dims[:1] != ("d0",) or len(shape) > len(target_shape) or \
                len(target_shape) != len(target_dims):
            return dims
        named = []
        for n, size, name in zip(shape[::-1], target_shape[::-1], target_dims[::-1], strict=False):
            if size == n:
                named.append(name)
            elif n == 1:
                named.append("1")
            else:
                return dims
        return tuple(named[::-1])

    def role_dims(self, op: OpRecord, shape: tuple[int, ...], *prefer: tuple[str, ...]
                  ) -> tuple[str, ...]:
        """The dims of a tensor op made: K's or V's own layouts first (h_kv heads) when it
        goes on to be K or V of a module that shares K/V heads (role: from where it goes,
        never from its size), else the layouts the caller gives."""
        shared = self.b.kv(*prefer) if self.b.h_kv and self.b.role(op) in ("K", "V") else ()
        return self.b.dims(shape, (*shared, *prefer))

    def origin_name(self, ref: Ref) -> str:
        op = self.g.producer(ref)
        if op is None:
            return ref.name or "the input"
        kind = self.g.kind.get(op.index, op.name)
        if kind in ("op", "aux"):  # no stage of that name: the tensor's own name says it
            return self.tensor_name(op, ref.output)
        stage = {"project": "project", "view": "view", "transpose": "transpose"}.get(kind, kind)
        if op.name in ("split", "chunk", "unbind"):
            return f"{possessive(stage)} {self.tensor_name(op, ref.output)}"
        return f"{possessive(stage)} {self.tensor_name(op)}"

    def call_text(self, op: OpRecord) -> str:
        """The op the way code writes it: `torch.zeros(3, 3)`, `torch.cat((y, x), dim=-1)`,
        `q * cos`, `k.transpose(-2, -1)`; tensors by the name the code gave them."""
        def arg(value: object) -> str:
            if isinstance(value, TensorArg):
                ref = op.inputs[value.index]
                producer = self.g.producer(ref)
                if producer is None:
                    return ref.name or "tensor"
                name = self.tensor_name(producer, ref.output)
                return name if name.isidentifier() else self.expr(ref)
            if isinstance(value, tuple) and value and value[0] == "slice":
                return _index(value)
            if isinstance(value, tuple):
                inner = ", ".join(arg(v) for v in value)
                return f"({inner},)" if len(value) == 1 else f"({inner})"
            if isinstance(value, list):
                return f"[{', '.join(arg(v) for v in value)}]"
            return repr(value)

        args = [arg(a) for a in op.args]
        kwargs = [f"{k}={arg(v)}" for k, v in op.kwargs]
        qualname = op.qualname or op.name
        owner, _, method = qualname.rpartition(".")
        if owner.startswith("Tensor") and args:
            if method in _PROPERTIES and len(args) == 1 and not kwargs:
                return f"{args[0]}.{method}"  # t.real, t.T: an attribute, not a call
            if method in _OPERATORS and len(args) == 2 and not kwargs:
                return f"{args[0]} {_OPERATORS[method]} {args[1]}"
            written = _as_written(op.source.text, method, args) if not kwargs else None
            if written is not None:
                return written
            if method == "__setitem__" and len(args) == 3:  # cache[:b, s:s + T] = xk
                index = args[1][1:-1] if args[1].startswith("(") else args[1]
                return _assignment(op.source.text) or f"{args[0]}[{index}] = {args[2]}"
            if method == "__getitem__" and len(args) == 2:
                index = args[1][1:-1] if args[1].startswith("(") else args[1]
                return f"{args[0]}[{index}]"
            return f"{args[0]}.{method.strip('_')}({', '.join(args[1:] + kwargs)})"
        return f"{api_name(op)}({', '.join(args + kwargs)})"

    def batched(self, values: np.ndarray) -> np.ndarray:
        """The values with a batch axis of 1 in front when the module has none (NumPy)."""
        return values if self.s.batched else values[None]

    def per_head_ops(self, unit: Unit) -> list[list[OpRecord]]:
        return self.b.heads_of(unit.ops)

    def four_d(self, unit: Unit, dims: tuple[str, ...]) -> tuple[np.ndarray, Snapshot]:
        return self.b.out_4d(unit.ops, dims)

    def unit_products_agree(self, unit: Unit, product: Callable[[OpRecord], Callable[..., np.ndarray]],
                       names: frozenset[str] = frozenset({"matmul", "bmm", "einsum", "mm",
                                                          "baddbmm"})) -> bool:
        """Whether every product op of the unit (each head's, one at a time) equals what its
        recorded operands give: scores' q @ k^T and attend's weights @ v (baddbmm's bias
        and factors are `product`'s to add; its operands are its second and third)."""
        ok = True
        for group in self.per_head_ops(unit):
            for op in group:
                if op.name not in names:
                    continue
                operands = op.inputs[1:3] if op.name == "baddbmm" else self.g.x_inputs(op)[:2]
                ok &= recomputed_agrees(product(op), [self.snap(r).values for r in operands],
                                        op.out.values, atol=1e-5, rtol=1e-4)
        return ok


_EINOPS_CALL = re.compile(r"""\b(rearrange|reduce|repeat|einsum|pack|unpack)\(\s*[^,()]*,\s*(['"])(.+?)\2""")


def _einops_note(ops: list[OpRecord]) -> str:
    """What an einops call on the stage's line ran as: its pattern, and the torch ops
    recorded for it (`rearrange(t, 'b n (h d) -> b h n d')` is a reshape then a permute)."""
    notes = []
    for line in dict.fromkeys(op.source.text for op in ops if "einops" in op.qualname
                              or _EINOPS_CALL.search(op.source.text)):
        found = _EINOPS_CALL.search(line)
        if found is None:
            continue
        ran = list(dict.fromkeys(op.name for op in ops if op.source.text == line))
        plain = [_PLAIN[name] for name in ran if name in _PLAIN]
        same = (f"the {' and '.join(dict.fromkeys(plain))} a module without einops would "
                f"write" if len(plain) == len(ran) else "torch's own ops")
        notes.append(f"The line's einops.{found.group(1)}('{found.group(3)}') names the axes; "
                     f"einops runs it as torch's {', then '.join(ran)}, recorded here: {same}.")
    return " ".join(notes)


# einops' backend ops and what a module without einops would write for them
_PLAIN = {"reshape": "view", "view": "view", "permute": "transpose", "transpose": "transpose",
          "flatten": "view", "unflatten": "view", "contiguous": "contiguous copy"}


_PROPERTIES = {"real", "imag", "T", "mT", "H", "mH"}
# torch's C namespaces and the public modules that spell them
_PUBLIC_NAMESPACES = {"torch._C._fft": "torch.fft", "torch._C._linalg": "torch.linalg",
                      "torch._C._special": "torch.special"}
def _receiver(op: OpRecord, ref: Ref) -> str:
    """The name a Tensor method's line gives the tensor it is called on (`alibi` in
    `alibi.baddbmm(...)`), when ref is that tensor; else ""."""
    owner, _, method = (op.qualname or op.name).rpartition(".")
    first = next((a for a in op.args if isinstance(a, TensorArg)), None)
    if not owner.startswith("Tensor") or first is None:
        return ""
    called_on = op.inputs[first.index]
    if (called_on.kind, called_on.op, called_on.output) != (ref.kind, ref.op, ref.output):
        return ""
    found = re.search(rf"(?<![\w.])((?:self\.)?[A-Za-z_]\w*)\.{re.escape(method)}\(", op.source.text)
    return found.group(1).removeprefix("self.") if found else ""


def public_name(op: OpRecord) -> str:
    """The op's name as torch's public API spells it (`fftn` for torch._C._fft.fft_fftn)."""
    owner, _, method = (op.qualname or op.name).rpartition(".")
    public = _PUBLIC_NAMESPACES.get(owner)
    return method.removeprefix(public.rsplit(".", 1)[-1] + "_") if public else op.name


def api_name(op: OpRecord) -> str:
    """The op as torch's documentation names it: `torch.fft.fftn` for torch._C._fft.fft_fftn,
    `F.linear`, `torch.zeros`, `torch.Tensor.real` for a method or attribute of a tensor."""
    owner, _, method = (op.qualname or op.name).rpartition(".")
    if owner in ("torch._VariableFunctionsClass", "torch._C._VariableFunctions", "torch"):
        return f"torch.{method}"
    if owner.startswith(("torch.nn.functional", "torch._C._nn")):
        return f"F.{method}"
    if owner in _PUBLIC_NAMESPACES:  # torch._C._fft.fft_fftn is torch.fft.fftn
        return f"{_PUBLIC_NAMESPACES[owner]}.{public_name(op)}"
    if owner.startswith("Tensor"):
        return f"torch.Tensor.{method}"
    return op.qualname or op.name


def _assignment(text: str) -> str | None:
    """`self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk`: an indexed assignment as
    its one-line statement writes it (its comment dropped), or None."""
    found = re.fullmatch(r"\s*([A-Za-z_][\w.]*\[[^\n]+\]\s*=(?!=)[^\n#]+?)\s*(#[^\n]*)?", text)
    return found.group(1) if found else None


_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "matmul": "@", "pow": "**"}


def _as_written(text: str, method: str, args: list[str]) -> str | None:
    """`a / softcap` rather than `a.div(0.5)`: a binary operator as the line writes it, with
    the right operand's own spelling (a name or a number), when the line has it that way."""
    symbol = _SYMBOLS.get(method)
    if symbol is None or len(args) != 2:
        return None
    found = re.search(rf"(?<![\w.]){re.escape(args[0])}\s*{re.escape(symbol)}(?![*=])\s*"
                      r"([A-Za-z_][\w.]*|\d[\w.]*)", text)
    return f"{args[0]} {symbol} {found.group(1)}" if found else None


def single_axes(T: int, h: int) -> str:
    """Why a transpose of T and h moved nothing in memory (the reason, for an explanation)."""
    if h == 1 and T == 1:
        return "there is only one head and one token"
    return "there is only one head" if h == 1 else "there is only one token"


def broadcast_heads(g: Graph, op: OpRecord, h: int) -> int | None:
    """How many heads the product's second operand (K^T, V) has when it is fewer than the
    query heads and the matmul broadcasts them (Falcon's multi-query: one K/V head, never
    repeated by an op); None when both have h heads."""
    if op.name not in ("matmul", "bmm") or h < 2:
        return None
    operands = g.x_inputs(op)[:2]
    if len(operands) != 2:
        return None
    a, b = (g.snap(r).shape for r in operands)
    if len(a) == len(b) == 4 and a[1] == h and b[1] == 1:
        return 1
    return None


def batched_product(h: int, product: str, what: str = "batched matmul") -> str:
    if h == 1:
        return f"one {what} = the one head's {product.replace('_i', '_0')}"
    return f"one {what} = {h} separate per-head {product}"


_OPERATORS = {"__add__": "+", "__radd__": "+", "__sub__": "-", "__rsub__": "-", "__mul__": "*",
              "__rmul__": "*", "__truediv__": "/", "__rtruediv__": "/", "__matmul__": "@",
              "__rmatmul__": "@", "__pow__": "**", "__eq__": "==", "__ne__": "!=", "__lt__": "<",
              "__le__": "<=", "__gt__": ">", "__ge__": ">=", "__and__": "&", "__or__": "|"}


def possessive(word: str) -> str:
    """`scale's`, `scores'`: the stage a tensor comes from."""
    return f"{word}'" if word.endswith("s") else f"{word}'s"


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

