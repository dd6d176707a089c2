"""The tutorials' modules (`--model NAME`) against independent witnesses.

Each module's output is compared with a per-head computation written here in float64 from
the module's own weights, and with torch's nn.MultiheadAttention loaded with the same
weights. The examples themselves must stay plain torch: no mha-tui import inside.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mha_tui.config import MODEL_NAMES, Config, Source
from mha_tui.load.modules import EXAMPLES, LoadedTorch, causal_mask, load

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "mha_tui" / "examples"
ShapeCase = tuple[int, int, int, int]  # C, h, T, seed
CASES: list[ShapeCase] = [(4, 2, 4, 0), (8, 4, 7, 1), (6, 3, 1, 2), (12, 1, 5, 3), (16, 4, 9, 7)]


def _config(C: int, h: int, T: int, seed: int, causal: bool = True) -> Config:
    sentence = " ".join(f"w{i % 5}" for i in range(T))  # repeated tokens share an embedding row
    return Config(sentence, embed_dim=C, num_heads=h, seed=seed, causal=causal, max_seq_len=16)


Head = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None,
             torch.Tensor, torch.Tensor | None]  # Wq, bq, Wk, bk, Wv, bv: (d_h, C), (d_h,)


def _rows(linear: nn.Linear, i: int, d_h: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    bias = None if linear.bias is None else linear.bias[i * d_h:(i + 1) * d_h]
    return linear.weight[i * d_h:(i + 1) * d_h], bias


def heads_and_output(name: str, module: nn.Module, h: int, C: int
                     ) -> tuple[list[Head], nn.Linear | None]:
    """Where each tutorial keeps head i's projections and the output projection."""
    d_h = C // h
    if name in ("mygpt", "course", "raschka", "raschka-cache", "cross"):
        q, k, v, o = {
            "mygpt": ("W_Q", "W_K", "W_V", "W_O"),
            "course": ("W_q", "W_k", "W_v", "W_o"),
            "cross": ("W_q", "W_k", "W_v", "W_o"),  # without a context it attends to x
            "raschka": ("W_query", "W_key", "W_value", "out_proj"),
            "raschka-cache": ("W_query", "W_key", "W_value", "out_proj"),
        }[name]
        layers = [getattr(module, n) for n in (q, k, v)]
        heads = [(*_rows(layers[0], i, d_h), *_rows(layers[1], i, d_h), *_rows(layers[2], i, d_h))
                 for i in range(h)]
        return heads, getattr(module, o)
    if name == "raschka-wrapper":
        return [(hd.W_query.weight, None, hd.W_key.weight, None, hd.W_value.weight, None)
                for hd in module.heads], None
    assert name == "many-eyes"
    return [(hd.query.weight, None, hd.key.weight, None, hd.value.weight, None)
            for hd in module.heads], module.proj


def reference(x: torch.Tensor, heads: list[Head], out: nn.Linear | None, causal: bool
              ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Per-head weights (T, T), per-head context (T, d_h) and the output, in float64, one
    head and one query token at a time."""
    x = x[0].double()  # (T, C)
    T = x.shape[0]

    def lin(W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return x @ W.double().T + (0 if b is None else b.double())

    weights, contexts = [], []
    for Wq, bq, Wk, bk, Wv, bv in heads:
        q, k, v = lin(Wq, bq), lin(Wk, bk), lin(Wv, bv)  # (T, d_h)
        d_h = q.shape[1]
        w = torch.zeros(T, T, dtype=torch.float64)
        for t in range(T):
            seen = t + 1 if causal else T
            s = torch.tensor([float(q[t] @ k[j]) / math.sqrt(d_h) for j in range(seen)],
                             dtype=torch.float64)
            e = torch.exp(s - s.max())
            w[t, :seen] = e / e.sum()
        weights.append(w)
        contexts.append(w @ v)
    concat = torch.cat(contexts, dim=-1)  # (T, C)
    result = concat if out is None else concat @ out.weight.double().T + (
        0 if out.bias is None else out.bias.double())
    return weights, contexts, result[None]


def _built(name: str, case: ShapeCase, causal: bool = True) -> tuple[LoadedTorch, Config]:
    config = _config(*case, causal=causal)
    return load(config, Source(model=name)), config


@pytest.mark.parametrize("case", CASES, ids=lambda c: "C{}-h{}-T{}-s{}".format(*c))
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_output_equals_a_per_head_computation(name: str, case: ShapeCase) -> None:
    loaded, _ = _built(name, case)
    C, h = case[0], case[1]
    with torch.no_grad():
        out = loaded.forward()
        heads, proj = heads_and_output(name, loaded.module, h, C)
        _, _, expected = reference(loaded.x, heads, proj, causal=True)
    assert out.shape == loaded.x.shape
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["mygpt", "course"])
def test_no_causal_sees_every_token(name: str) -> None:
    loaded, _ = _built(name, (8, 2, 6, 4), causal=False)
    with torch.no_grad():
        out = loaded.forward()
        heads, proj = heads_and_output(name, loaded.module, 2, 8)
        _, _, expected = reference(loaded.x, heads, proj, causal=False)
        _, _, causal = reference(loaded.x, heads, proj, causal=True)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    assert not torch.allclose(out.double(), causal, atol=1e-4)  # the mask really is off


@pytest.mark.parametrize("name", ["raschka-wrapper", "many-eyes"])
def test_per_head_modules_give_each_head_its_context(name: str) -> None:
    """The ModuleList tutorials run each head as its own module: its output is that head's
    context, equal to the per-head computation."""
    loaded, _ = _built(name, (8, 4, 6, 5))
    seen: list[torch.Tensor] = []
    hooks = [hd.register_forward_hook(lambda _m, _i, o: seen.append(o)) for hd in loaded.module.heads]
    with torch.no_grad():
        loaded.forward()
        heads, proj = heads_and_output(name, loaded.module, 4, 8)
        _, contexts, _ = reference(loaded.x, heads, proj, causal=True)
    for hook in hooks:
        hook.remove()
    assert len(seen) == 4
    for got, want in zip(seen, contexts, strict=True):
        torch.testing.assert_close(got[0].double(), want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "C{}-h{}-T{}-s{}".format(*c))
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_torch_multihead_attention_agrees(name: str, case: ShapeCase) -> None:
    """A second, independent witness: nn.MultiheadAttention with the same weights gives the
    same output and the same per-head weights."""
    loaded, _ = _built(name, case)
    C, h, T = case[0], case[1], case[2]
    heads, proj = heads_and_output(name, loaded.module, h, C)
    mha = nn.MultiheadAttention(C, h, bias=True, batch_first=True).eval()
    with torch.no_grad():
        W = [torch.cat([hd[j] for hd in heads]) for j in (0, 2, 4)]
        b = [torch.cat([hd[j] for hd in heads]) if heads[0][j] is not None else torch.zeros(C)
             for j in (1, 3, 5)]
        mha.in_proj_weight.copy_(torch.cat(W))
        mha.in_proj_bias.copy_(torch.cat(b))
        mha.out_proj.weight.copy_(torch.eye(C) if proj is None else proj.weight)
        mha.out_proj.bias.copy_(torch.zeros(C) if proj is None or proj.bias is None else proj.bias)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        want, want_w = mha(loaded.x, loaded.x, loaded.x, attn_mask=mask, need_weights=True,
                           average_attn_weights=False)
        weights, _, _ = reference(loaded.x, heads, proj, causal=True)
        torch.testing.assert_close(loaded.forward(), want, atol=1e-5, rtol=1e-5)
    for i in range(h):
        torch.testing.assert_close(want_w[0, i].double(), weights[i], atol=1e-6, rtol=1e-5)


def test_each_model_declares_its_layers_in_the_tutorials_order() -> None:
    """Declaration order decides which random numbers each layer gets after manual_seed."""
    order = {
        name: [n for n, _ in load(Config("a b"), Source(model=name)).module.named_parameters()]
        for name in MODEL_NAMES
    }
    assert order["course"] == ["W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight",
                               "W_v.bias", "W_o.weight", "W_o.bias"]
    assert order["raschka"] == ["W_query.weight", "W_key.weight", "W_value.weight",
                                "out_proj.weight", "out_proj.bias"]
    assert order["raschka-wrapper"] == [f"heads.{i}.W_{n}.weight" for i in range(2)
                                        for n in ("query", "key", "value")]
    assert order["many-eyes"] == [f"heads.{i}.{n}.weight" for i in range(2)
                                  for n in ("key", "query", "value")] + ["proj.weight", "proj.bias"]
    buffers = {name: [n for n, _ in load(Config("a b"), Source(model=name)).module.named_buffers()]
               for name in ("raschka", "many-eyes")}
    assert buffers == {"raschka": ["mask"], "many-eyes": ["heads.0.tril", "heads.1.tril"]}


def _construction_lines(path: Path) -> list[str]:
    """The indented construction lines in an example's docstring (seed, embedding, module)."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc is not None
    lines, current = [], ""
    for line in doc.splitlines():
        if line.startswith("    ") or (current and line.startswith(" ")):
            current += line.strip()
            if current.count("(") == current.count(")"):
                lines.append(current)
                current = ""
    return lines


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES if n != "mygpt"])
def test_the_construction_lines_in_each_file_give_the_same_numbers(name: str) -> None:
    """A reader who runs the lines in the file's docstring, with the tutorial's class, gets
    exactly the module and embedding `--model NAME` builds."""
    example = EXAMPLES[name]
    file = EXAMPLES_DIR / (example.module.rsplit(".", 1)[1] + ".py")
    config = Config("I love AI ! I", embed_dim=8, num_heads=2, seed=3, max_seq_len=16)
    loaded = load(config, Source(model=name))
    namespace: dict[str, object] = {}
    exec(compile(file.read_text(), str(file), "exec"), namespace)
    namespace.update(torch=torch, nn=nn, seed=3, V=len(config.vocab), C=8, h=2, L=16)
    lines = _construction_lines(file)
    target = {"raschka-wrapper": "wrapper", "raschka-cache": "cached"}.get(name, "mha")
    chosen = [ln for ln in lines if not ln.startswith(("mha =", "wrapper =", "cached ="))
              or ln.startswith(f"{target} =")]
    assert len(chosen) == 3, lines
    exec("\n".join(chosen), namespace)
    built = namespace[target]
    assert isinstance(built, nn.Module)
    assert torch.equal(namespace["embedding"].weight, loaded.embedding.weight)  # type: ignore[union-attr]
    mine, theirs = loaded.module.state_dict(), built.state_dict()
    assert list(mine) == list(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("path", sorted(EXAMPLES_DIR.glob("*.py")), ids=lambda p: p.name)
def test_examples_are_plain_torch(path: Path) -> None:
    """A learner can diff an example against their own file: nothing of mha-tui inside."""
    tree = ast.parse(path.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0}
    relative = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert imported <= {"__future__", "math", "torch", "numpy"} and not relative
    assert not re.search(r"\btap\s*[(=:]", path.read_text())  # no tap call or argument


@pytest.mark.parametrize("path", sorted(EXAMPLES_DIR.glob("*.py")), ids=lambda p: p.name)
def test_every_tensor_line_in_a_forward_has_a_shape_comment(path: Path) -> None:
    source = path.read_text().splitlines()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign | ast.Return | ast.Expr) and \
                        not isinstance(getattr(stmt, "value", None), ast.Constant):
                    line = source[stmt.end_lineno - 1]
                    assert "# " in line and "(" in line.split("#", 1)[1], \
                        f"{path.name}:{stmt.end_lineno} has no shape comment: {line.strip()}"


MODULES_PAGE = EXAMPLES_DIR.parent.parent / "docs" / "modules.md"


def _readme_block() -> tuple[list[str], dict[str, str]]:
    """The manual's construction block (docs/modules.md): shared lines, and one `mha = ...`
    line per model."""
    text = MODULES_PAGE.read_text()
    start = text.index("torch.manual_seed(seed)\nembedding = nn.Embedding(V, C)\n")
    block = text[start:text.index("```", start)].splitlines()
    shared = [ln for ln in block if not ln.startswith("mha = ") and not ln.startswith("x = ")]
    per_model = {ln.rsplit("# ", 1)[1].strip(): ln.split("  #")[0] for ln in block
                 if ln.startswith("mha = ")}
    return shared, per_model


def test_the_docs_name_every_model_once() -> None:
    assert sorted(_readme_block()[1]) == sorted(MODEL_NAMES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_docs_construction_lines_give_the_same_numbers(name: str) -> None:
    """What the manual promises a reader: their tutorial's class, built with these lines,
    has the weights, embedding and output that `--model NAME` shows."""
    shared, per_model = _readme_block()
    config = Config("I love AI ! I", embed_dim=8, num_heads=2, seed=5, max_seq_len=16)
    loaded = load(config, Source(model=name))
    file = Path(loaded.file)  # the tutorial's file the class comes from
    namespace: dict[str, object] = {}
    exec(compile(file.read_text(), str(file), "exec"), namespace)  # the class, as a reader has it
    namespace.update(torch=torch, nn=nn, seed=5, V=len(config.vocab), C=8, h=2, L=16,
                     ids=list(config.ids))
    lines = [*shared[:2], per_model[name], *shared[2:],
             "x = embedding(torch.tensor([ids]))"]
    with torch.no_grad():
        exec("\n".join(lines), namespace)
        mha, x = namespace["mha"], namespace["x"]
        assert isinstance(mha, nn.Module) and not mha.training
        assert torch.equal(x, loaded.x)
        mine, theirs = loaded.module.state_dict(), mha.state_dict()
        assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
        args = (x, causal_mask(x.shape[1])) if name == "course" else (x,)
        kwargs = {"mask": causal_mask(x.shape[1])} if name == "cross" else {}  # forward(x, context, mask)
        assert torch.equal(mha(*args, **kwargs), loaded.forward())


def _decode_block() -> str:
    """The manual's decoding lines (docs/modules.md, after "Decoding with a KV cache")."""
    text = MODULES_PAGE.read_text()
    start = text.index("```python\n", text.index("**Decoding with a KV cache**")) + len("```python\n")
    return text[start:text.index("```", start)]


def test_the_docs_decoding_lines_give_each_steps_numbers() -> None:
    """`--decode 2` on raschka-cache (what --decode runs without --model): the manual's
    prefill and two calls of one token, run on the tutorial's class as a reader has it,
    give each step's output as the walk-through shows it."""
    from mha_tui.pipeline import decoded
    from mha_tui.records.request import Request

    config = Config("I love AI ! I", embed_dim=8, num_heads=2, seed=5, max_seq_len=16)
    trace = decoded(Request(config, Source(model="raschka-cache"), steps=2))
    shown = [step.recording.snapshot(step.recording.output).values for step in trace.steps]
    loaded = load(config, Source(model="raschka-cache"))
    namespace: dict[str, object] = {"mha": loaded.module, "x": loaded.x, "torch": torch}
    outs = []
    with torch.no_grad():
        for line in _decode_block().splitlines():  # each `out = ...` kept as it is made
            exec(line, namespace)
            if line.startswith("out = "):
                outs.append(namespace["out"].numpy())
    assert len(outs) == len(shown) == 2
    for mine, theirs in zip(outs, shown, strict=True):
        assert mine.shape == (1, 1, 8) and np.array_equal(mine, theirs)
