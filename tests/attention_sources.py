"""Source code of multi-head attention modules, written the many ways learners write them,
with at most one value-changing line inserted at a chosen point of the forward.

`source(style, tamper)` returns a whole module file (class `MultiHeadAttention(embed_dim,
num_heads, max_seq_len=64)`, a shape comment on every tensor line) and the number of the
inserted line. Every `Style` is correct multi-head attention; a `Tamper` inserts one line
such as `k = torch.roll(k, 1, dims=2)` right after the line that makes the tensor it names.
The property tests write the text to a file and run `check` on it, so the module `check`
sees is plain code with the change on a line of its own, exactly as a learner would write it.
"""

from __future__ import annotations

from dataclasses import dataclass

PRODUCTS = ("matmul", "einsum", "sdpa")
PROJECTIONS = ("separate", "fused")
SPLITS = ("view", "reshape", "permute")
MASKS = ("masked_fill_inf", "additive_buffer", "minus_1e9", "finfo_min", "where_bool")
SCALES = ("before_mask", "after_mask", "on_q")
MERGES = ("contiguous_view", "reshape")


@dataclass(frozen=True)
class Style:
    """One legitimate way to write causal multi-head attention (all of them equivalent)."""

    product: str = "matmul"  # q @ k^T; einsum; F.scaled_dot_product_attention
    projection: str = "separate"  # W_Q, W_K, W_V; one fused (C, 3C) layer cut in three
    split: str = "view"  # view + transpose(1, 2); reshape + transpose; view + permute
    mask: str = "masked_fill_inf"  # how the causal mask is applied (not with sdpa)
    scale: str = "before_mask"  # where 1/sqrt(d_h) is applied (not with sdpa)
    merge: str = "contiguous_view"  # how the heads are put back side by side
    bias: bool = False


# Where a tamper line can go: the tensor it rewrites, its axes, and which styles have it.
POINTS = {
    "x": "(B, T, C)",  # the input, before the projections
    "q": "(B, h, T, d_h)",
    "k": "(B, h, T, d_h)",
    "v": "(B, h, T, d_h)",
    "scores": "(B, h, T, T)",  # scaled, before the mask (not with sdpa)
    "weights": "(B, h, T, T)",  # after softmax (not with sdpa)
    "context": "(B, h, T, d_h)",
    "merged": "(B, T, C)",
    "out": "(B, T, C)",
}

# What each op does to a tensor, as code (t is the tensor's name).
OPS = {
    "roll": "torch.roll({t}, 1, dims={axis})",
    "flip": "torch.flip({t}, dims=[{axis}])",
    "relu": "torch.relu({t})",
    "add": "{t} + 0.5",
    "swap_heads": "{t}[:, [1, 0] + list(range(2, {t}.shape[1]))]",
    "transpose": "{t}.transpose(-2, -1)",
}


@dataclass(frozen=True)
class Tamper:
    """One value-changing line: `op` applied to the tensor at `point`."""

    point: str
    op: str

    def line(self) -> str:
        axes = POINTS[self.point]
        axis = 1 if axes == "(B, T, C)" else 2 if self.point != "weights" else 3
        if self.point in ("scores", "weights"):
            axis = 3  # along the keys
        code = OPS[self.op].format(t=self.point, axis=axis)
        return f"{self.point} = {code}  # TAMPERED  {axes}"


def tampers(style: Style) -> list[Tamper]:
    """Every (point, op) pair that changes the output of a module of this style (for T >= 2
    and h >= 2, all but measure-zero weights): the pairs that cannot are left out, e.g. a
    constant added to the scores (softmax does not see it), a constant added to k (it adds
    the same q . c to a whole row), relu after softmax (the weights are never negative)."""
    found = []
    for point, axes in POINTS.items():
        if style.product == "sdpa" and point in ("scores", "weights"):
            continue
        for op in OPS:
            if op == "swap_heads" and "h" not in axes:
                continue
            if op == "transpose" and point not in ("scores", "weights"):
                continue
            if op == "add" and point in ("k", "scores"):
                continue
            if op == "relu" and point == "weights":
                continue
            found.append(Tamper(point, op))
    return found


def source(style: Style = Style(), tamper: Tamper | None = None) -> tuple[str, int]:
    """The module file's text, and the line number of the tamper line (0 if none)."""
    init = [
        "class MultiHeadAttention(nn.Module):",
        "    def __init__(self, embed_dim, num_heads, max_seq_len=64):",
        "        super().__init__()",
        "        self.h = num_heads",
        "        self.d_h = embed_dim // num_heads",
    ]
    bias = "True" if style.bias else "False"
    if style.projection == "fused":
        init.append(f"        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias={bias})")
    else:
        init += [f"        self.W_{r} = nn.Linear(embed_dim, embed_dim, bias={bias})" for r in "QKV"]
    init.append(f"        self.W_O = nn.Linear(embed_dim, embed_dim, bias={bias})")
    L = "max_seq_len, max_seq_len"
    if style.mask == "additive_buffer":
        init.append(f"        future = torch.triu(torch.full(({L}), float('-inf')), diagonal=1)")
        init.append("        self.register_buffer('future', future)  # -inf where a token may not look")
    else:
        init.append(f"        future = torch.triu(torch.ones({L}, dtype=torch.bool), diagonal=1)")
        init.append("        self.register_buffer('future', future)  # True where a token may not look")

    body: list[tuple[str, str]] = [("", "        B, T, C = x.shape"), ("x", "")]
    if style.projection == "fused":
        body.append(("", "        q, k, v = self.qkv(x).split(C, dim=-1)  # each (B, T, C)"))
        made = {r: r.lower() for r in "QKV"}
    else:
        made = {r: f"self.W_{r}(x)" for r in "QKV"}
    for role in "qkv":
        src = made[role.upper()]
        if style.split == "view":
            code = f"{src}.view(B, T, self.h, self.d_h).transpose(1, 2)"
        elif style.split == "reshape":
            code = f"{src}.reshape(B, T, self.h, self.d_h).transpose(1, 2)"
        else:
            code = f"{src}.view(B, T, self.h, self.d_h).permute(0, 2, 1, 3)"
        body.append(("", f"        {role} = {code}  # (B, h, T, d_h)"))
    body += [("q", ""), ("k", ""), ("v", "")]

    if style.product == "sdpa":
        body.append(("", "        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)"
                         "  # (B, h, T, d_h)"))
    else:
        if style.scale == "on_q":
            body.append(("", "        q = q * self.d_h ** -0.5  # (B, h, T, d_h)"))
        if style.product == "einsum":
            body.append(("", "        scores = torch.einsum('bhqd,bhkd->bhqk', q, k)  # (B, h, T, T)"))
        else:
            body.append(("", "        scores = q @ k.transpose(-2, -1)  # (B, h, T, T)"))
        scale_line = ("", "        scores = scores / math.sqrt(self.d_h)  # (B, h, T, T)")
        if style.scale == "before_mask":
            body.append(scale_line)
        body.append(("scores", ""))
        mask = {
            "masked_fill_inf": "scores.masked_fill(self.future[:T, :T], float('-inf'))",
            "additive_buffer": "scores + self.future[:T, :T]",
            "minus_1e9": "scores.masked_fill(self.future[:T, :T], -1e9)",
            "finfo_min": "scores.masked_fill(self.future[:T, :T], torch.finfo(scores.dtype).min)",
            "where_bool": "torch.where(self.future[:T, :T], float('-inf'), scores)",
        }[style.mask]
        body.append(("", f"        scores = {mask}  # (B, h, T, T)"))
        if style.scale == "after_mask":
            body.append(scale_line)
        body.append(("", "        weights = F.softmax(scores, dim=-1)  # (B, h, T, T)"))
        body.append(("weights", ""))
        if style.product == "einsum":
            body.append(("", "        context = torch.einsum('bhqk,bhkd->bhqd', weights, v)"
                             "  # (B, h, T, d_h)"))
        else:
            body.append(("", "        context = weights @ v  # (B, h, T, d_h)"))
    body.append(("context", ""))
    if style.merge == "contiguous_view":
        body.append(("", "        merged = context.transpose(1, 2).contiguous().view(B, T, C)"
                         "  # (B, T, C)"))
    else:
        body.append(("", "        merged = context.transpose(1, 2).reshape(B, T, C)  # (B, T, C)"))
    body += [("merged", ""), ("", "        out = self.W_O(merged)  # (B, T, C)"), ("out", ""),
             ("", "        return out")]

    header = [
        f'"""Generated by tests/attention_sources.py: {style}, tamper {tamper}."""',
        "",
        "import math",
        "",
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "",
        "",
    ]
    lines = [*header, *init, "", "    def forward(self, x):"]
    marked = 0
    for point, text in body:
        if point:
            if tamper is not None and tamper.point == point:
                lines.append(f"        {tamper.line()}")
                marked = len(lines)
            continue
        lines.append(text)
    return "\n".join(lines) + "\n", marked
