"""NumPy modules traced like torch ones: the blueprint (seed 002) and a learner's own class.

The numbers are checked against an independent NumPy computation written here, from the
blueprint's two construction lines only; the stages against the recogniser's kinds.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mha_tui.config import Config
from mha_tui.load.numpy_modules import build_blueprint
from mha_tui.pipeline import numpy_runner, trace_numpy
from mha_tui.tracing.numpy_ops import record, snapshot

from .conftest import ROOT, run_cli

BLUEPRINT_KINDS = ["embed", "project", "view", "transpose", "scores", "scale", "mask", "softmax",
                   "attend", "concat", "w_o"]


def _sentence(T: int) -> str:
    words = ["I", "love", "AI", "!", "the", "cat", "sat", "on", "mat", "."]
    return " ".join(words[i % len(words)] for i in range(T))


def independent(config: Config) -> dict[str, np.ndarray]:
    """The blueprint's forward, computed here token by token and head by head."""
    d, H, T = config.embed_dim, config.num_heads, config.seq_len
    d_h = d // H
    rng = np.random.default_rng(config.seed)
    W = {name: rng.standard_normal((d, d)).astype(np.float32) * (1 / np.sqrt(d))
         for name in ("Q", "K", "V", "O")}  # drawn in this order
    table = np.random.default_rng(config.seed + 1).standard_normal(
        (len(config.vocab), d)).astype(np.float32)
    x = np.stack([table[i] for i in config.ids])  # (T, d)
    q, k, v = (x @ W[name] for name in "QKV")
    heads_q = np.stack([q[:, i * d_h:(i + 1) * d_h] for i in range(H)])  # (H, T, d_h)
    heads_k = np.stack([k[:, i * d_h:(i + 1) * d_h] for i in range(H)])
    heads_v = np.stack([v[:, i * d_h:(i + 1) * d_h] for i in range(H)])
    raw = np.zeros((H, T, T))
    for i in range(H):
        for t in range(T):
            for s in range(T):
                raw[i, t, s] = float(np.dot(heads_q[i, t], heads_k[i, s]))
    scaled = raw / np.sqrt(d_h)
    masked = scaled.copy()
    if config.causal:
        for t in range(T):
            masked[:, t, t + 1:] = -np.inf
    weights = np.exp(masked - masked.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    context = np.einsum("hts,hsd->htd", weights, heads_v)
    merged = np.concatenate(list(context), axis=-1)  # (T, d): head i's block at i*d_h
    return {"x": x, "Q": q, "K": k, "V": v, "heads_q": heads_q, "scores": raw, "scaled": scaled,
            "masked": masked, "weights": weights, "context": context, "merged": merged,
            "out": merged @ W["O"], "W_Q": W["Q"], "W_O": W["O"]}


CASES = [  # (d, H, T, seed, causal)
    (4, 2, 4, 0, True),
    (8, 4, 5, 3, True),
    (6, 3, 3, 7, False),
    (8, 1, 2, 1, True),
    (12, 2, 7, 42, False),
]


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-5, atol=1e-6))


@pytest.mark.parametrize("einsum", [False, True], ids=["loop", "einsum"])
@pytest.mark.parametrize(("d", "H", "T", "seed", "causal"), CASES)
def test_blueprint_numbers_equal_an_independent_computation(d: int, H: int, T: int, seed: int,
                                                           causal: bool, einsum: bool) -> None:
    config = Config(_sentence(T), embed_dim=d, num_heads=H, seed=seed, causal=causal)
    result = numpy_runner(build_blueprint(config, einsum=einsum))(config)
    want = independent(config)
    # --no-causal keeps a mask stage that says no mask was passed
    assert [s.kind for s in result.stages] == BLUEPRINT_KINDS
    stage = {s.kind: s for s in result.stages}
    assert np.array_equal(stage["embed"].tensor("x").values, want["x"])
    project = stage["project"]
    for name in "QKV":
        assert _close(project.tensor(name).values, want[name]), name
    assert np.array_equal(project.tensor("W_Q").values, want["W_Q"])
    assert _close(stage["transpose"].tensors[0].values, want["heads_q"])
    assert _close(stage["scores"].tensors[-1].values, want["scores"])
    assert _close(stage["scale"].tensors[-1].values, want["scaled"])
    if causal:
        masked = stage["mask"].tensors[-1].values
        assert np.array_equal(np.isneginf(masked), np.isneginf(want["masked"]))
        assert _close(np.where(np.isneginf(masked), 0, masked),
                      np.where(np.isneginf(want["masked"]), 0, want["masked"]))
    assert _close(stage["softmax"].tensors[-1].values, want["weights"])
    assert _close(stage["attend"].tensors[-1].values, want["context"])
    assert _close(stage["concat"].tensors[-1].values, want["merged"])
    assert _close(stage["w_o"].tensors[-1].values, want["out"])
    assert all(c.ok is not False for s in result.stages for c in s.checks), \
        [(s.id, c.label) for s in result.stages for c in s.checks if c.ok is False]
    final = [c for c in stage["w_o"].checks if "own forward" in c.label]
    assert final and final[0].ok is True and "np.array_equal" in final[0].label


def test_blueprint_module_output_is_exactly_what_the_trace_recorded() -> None:
    config = Config("I love AI !", embed_dim=8, num_heads=2)
    loaded = build_blueprint(config)
    result = numpy_runner(loaded)(config)
    again = loaded.module.forward(loaded.x, loaded.kwargs["mask"])
    assert np.array_equal(result.stages[-1].tensors[-1].values, again)


@pytest.mark.parametrize(("d", "H", "T", "seed", "causal"), CASES)
def test_loop_and_einsum_forms_give_the_same_stages_and_values(d: int, H: int, T: int, seed: int,
                                                              causal: bool) -> None:
    config = Config(_sentence(T), embed_dim=d, num_heads=H, seed=seed, causal=causal)
    loop = numpy_runner(build_blueprint(config))(config)
    fused = numpy_runner(build_blueprint(config, einsum=True))(config)
    assert [s.kind for s in loop.stages] == [s.kind for s in fused.stages]
    for a, b in zip(loop.stages, fused.stages, strict=True):
        assert a.dims_out == b.dims_out, a.id
        va, vb = a.tensors[-1].values, b.tensors[-1].values
        assert va.shape == vb.shape, a.id
        assert np.allclose(np.nan_to_num(va, neginf=-1e30), np.nan_to_num(vb, neginf=-1e30),
                           rtol=1e-12, atol=1e-12), a.id


def test_the_loop_form_says_heads_ran_one_at_a_time_and_the_einsum_form_says_einsum() -> None:
    config = Config("I love AI !", embed_dim=4, num_heads=2)
    loop = numpy_runner(build_blueprint(config))(config)
    fused = numpy_runner(build_blueprint(config, einsum=True))(config)
    assert "each head's own q @ k^T, 2 heads side by side" in loop.stage("scores").checks[0].label
    assert "one einsum = 2 separate per-head" in fused.stage("scores").checks[0].label
    assert "np.stack put the 2 heads' outputs" in loop.stage("concat").checks[0].label
    # the loop's per-head stages carry every head's ops, each line read from the example file
    assert len([op for op in loop.stage("scores").ops if op.name == "matmul"]) == 2
    assert loop.stage("scores").code.startswith("scores_h = Q[h] @ K[h].T / np.sqrt(d_head)")
    assert fused.stage("scores").code.startswith('scores = np.einsum("htd,hsd->hts", Q, K)')


def test_hand_written_softmax_spread_over_three_lines_is_one_softmax_stage() -> None:
    config = Config("I love AI !", embed_dim=4, num_heads=2)
    result = numpy_runner(build_blueprint(config, einsum=True))(config)
    softmax = result.stage("softmax")
    assert [op.name for op in softmax.ops] == ["max", "sub", "exp", "sum", "div"]
    assert len({op.source.line for op in softmax.ops}) == 3
    assert softmax.code.splitlines()[0].startswith("shifted = x - np.max(x, axis=axis")
    labels = [c.label for c in softmax.checks]
    assert any(label.startswith("written by hand (3 lines)") for label in labels)
    assert any("the row maximum is subtracted before exp (no overflow): yes" in label for label in labels)


# ------------------------------------------------------------------- strides, dims, words


def test_strides_are_numpys_bytes_and_dims_have_no_batch_axis() -> None:
    config = Config("I love AI !", embed_dim=4, num_heads=2)
    result = numpy_runner(build_blueprint(config))(config)
    transpose = result.stage("transpose")
    q = transpose.tensors[0]
    assert q.dims == ("h", "T", "d_h") and q.stride_unit == "bytes"
    assert q.strides == (16, 32, 8)  # float64: NumPy's own strides of the transposed view
    assert result.stage("embed").dims_out == ("T", "C")
    assert result.stage("concat").dims_transition == "(h, T, d_h) -> (T, C)"
    for stage in result.stages:
        assert "B" not in stage.dims_in + stage.dims_out, stage.id
        assert all("B" not in t.dims for t in stage.tensors), stage.id
    wrong = transpose.aside[0]
    assert wrong.name == "Q.reshape(h, T, d_h)" and wrong.strides == (64, 16, 8)
    assert wrong.caption.startswith("WRONG")


def test_text_and_json_transcripts_say_bytes_and_no_batch() -> None:
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import to_json, to_text

    config = Config("I love AI !", embed_dim=4, num_heads=2)
    result = numpy_runner(build_blueprint(config))(config)
    text = to_text(result, RenderOptions(), width=100)
    assert "T=4 C=4 h=2" in text and "B=1" not in text
    assert "strides (16, 32, 8) bytes" in text
    assert "module MultiHeadAttention  file mha_tui/examples/blueprint.py" in text
    assert "Why not one reshape(h, T, d_h)?" in text
    data = json.loads(to_json(result))
    q = data["stages"][3]["tensors"]["Q"]
    assert q["strides"] == [16, 32, 8] and q["stride_unit"] == "bytes"
    assert q["dims"] == ["h", "T", "d_h"]


def test_no_causal_passes_no_mask_and_says_so() -> None:
    config = Config("I love AI !", embed_dim=4, num_heads=2, causal=False)
    result = numpy_runner(build_blueprint(config))(config)
    assert not any(op.name == "add" for s in result.stages for op in s.ops)
    mask = result.stage("mask")
    assert mask.ops == () and mask.code == ""
    assert "mask=None" in mask.explanation


# ------------------------------------------------------------------- the recorder


def test_every_numpy_op_is_recorded_with_its_line_and_origin() -> None:
    config = Config("I love AI !", embed_dim=4, num_heads=2)
    loaded = build_blueprint(config, einsum=True)
    rec = record(loaded.module, loaded.args, loaded.kwargs).recordings[""]
    names = [op.name for op in rec.ops]
    assert names == ["matmul", "reshape", "transpose"] * 3 + [
        "einsum", "div", "add", "max", "sub", "exp", "sum", "div", "einsum", "transpose",
        "reshape", "matmul"]
    first = rec.ops[0]
    assert [(r.kind, r.name) for r in first.inputs] == [("input", "x"), ("param", "W_Q")]
    assert first.source.text.startswith("Q = (x @ self.W_Q)")
    assert first.source.file.endswith("blueprint.py")
    assert rec.library == "numpy" and [name for name, _ in rec.inputs] == ["x", "mask"]
    assert rec.output is not None and rec.output.op == len(rec.ops) - 1


def test_in_place_ops_do_not_rewrite_what_was_recorded() -> None:
    class InPlace:
        def forward(self, x):
            scores = x @ x.T  # (T, T)
            before = scores.copy()
            scores[np.triu_indices(x.shape[0], 1)] = -np.inf
            scores += 1.0
            return scores, before

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    rec = record(InPlace(), (x,)).recordings[""]
    names = [op.name for op in rec.ops]
    assert names == ["T", "matmul", "copy", "setitem", "add_"]
    raw = rec.ops[1].out.values
    assert np.isfinite(raw).all() and np.array_equal(raw, x @ x.T)
    assert rec.ops[3].in_place and np.isneginf(rec.ops[3].out.values).sum() == 3
    assert rec.ops[4].inputs[0].op == 3  # += reads the tensor the setitem wrote


def test_a_numpy_error_ends_the_trace_with_its_line_and_numpys_message() -> None:
    from tests.fixtures.numpy_attn import BrokenReshape

    module = BrokenReshape(4, 2)
    x = np.ones((3, 4), dtype=np.float32)
    result = trace_numpy(module, x, ["a", "b", "c"])
    assert result.failed
    error = result.stages[-1]
    assert error.kind == "error" and "cannot reshape array" in error.explanation
    assert error.code.startswith("q = q.reshape(T, self.n_heads + 1, self.d_k)")
    assert [s.kind for s in result.stages[:-1]] == ["project"]


def test_snapshot_storage_identifies_views() -> None:
    a = np.arange(12.0).reshape(3, 4)
    view, copy = a.T, a.T.copy()
    assert snapshot(view).storage == snapshot(a).storage
    assert snapshot(copy).storage != snapshot(a).storage
    assert snapshot(a[1]).storage_offset == 4 and snapshot(a).strides == (32, 8)


# ------------------------------------------------------------------- a learner's NumPy module


def test_a_learner_numpy_module_is_recognised_stage_by_stage() -> None:
    from tests.fixtures.numpy_attn import NumpyAttention

    config = Config("the cat sat on the mat", embed_dim=8, num_heads=2, seed=5)
    module = NumpyAttention(8, 2, seed=5)
    from mha_tui.load.numpy_modules import causal_mask, embedding_table

    table = embedding_table(config)
    ids = np.array(config.ids)
    x = table[ids]
    mask = causal_mask(len(ids))
    result = trace_numpy(module, x, config.tokens, kwargs={"mask": mask}, table=table, ids=ids,
                   config=config)
    assert [s.kind for s in result.stages] == BLUEPRINT_KINDS
    stage = {s.kind: s for s in result.stages}
    # every stage's numbers, computed here in plain NumPy
    q = (x @ module.Wq).reshape(6, 2, 4).transpose(1, 0, 2)
    k = (x @ module.Wk).reshape(6, 2, 4).transpose(1, 0, 2)
    v = (x @ module.Wv).reshape(6, 2, 4).transpose(1, 0, 2)
    scores = np.einsum("htd,hsd->hts", q, k)
    scaled = scores * 4 ** -0.5
    masked = scaled + mask
    weights = np.exp(masked - masked.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    context = weights @ v
    assert _close(stage["scores"].tensors[-1].values, scores)
    assert _close(stage["scale"].tensors[-1].values, scaled)
    assert np.array_equal(np.isneginf(stage["mask"].tensors[-1].values), np.isneginf(masked))
    assert _close(stage["softmax"].tensors[-1].values, weights)
    assert _close(stage["attend"].tensors[-1].values, context)
    assert _close(stage["w_o"].tensors[-1].values,
                  context.transpose(1, 0, 2).reshape(6, 8) @ module.Wo)
    assert [op.name for op in stage["softmax"].ops] == ["max", "sub", "exp", "sum", "div"]
    shown = stage["mask"].tensors[0]  # the boolean np.where reads: mask == 0
    assert shown.name == "mask == 0" and shown.caption.startswith("True on and below the diagonal")
    assert all(c.ok is not False for s in result.stages for c in s.checks)


# ------------------------------------------------------------------- no torch on this path


def test_a_blueprint_transcript_never_imports_torch() -> None:
    """Load, trace, render and dump the blueprint in a fresh interpreter: no torch."""
    code = ("import sys\n"
            "from mha_tui.config import Config\n"
            "from mha_tui.load.numpy_modules import build_blueprint\n"
            "from mha_tui.pipeline import numpy_runner\n"
            "from mha_tui.write.dump import to_json, to_text\n"
            "from mha_tui.render.options import RenderOptions\n"
            "config = Config('I love AI !', embed_dim=8, num_heads=2)\n"
            "trace = numpy_runner(build_blueprint(config))(config)\n"
            "text = to_text(trace, RenderOptions(), width=100) + to_json(trace)\n"
            "print('TORCH', 'torch' in sys.modules, len(trace.stages))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["TORCH", "False", "11"]


NO_TORCH_RUN = ("import sys, runpy, os\n"
                "os._exit = lambda code: (sys.stdout.flush(), "
                "sys.stderr.write('TORCH ' + str('torch' in sys.modules) + '\\n'), sys.exit(code))\n"
                "sys.argv = ['mha-tui', 'explain'] + sys.argv[1:]\n"
                "runpy.run_module('mha_tui', run_name='__main__')\n")


def _explain_without_torch(*args: str) -> subprocess.CompletedProcess[bytes]:
    """`mha-tui explain ARGS` in a fresh interpreter that reports whether torch was imported."""
    return subprocess.run([sys.executable, "-c", NO_TORCH_RUN, *args], capture_output=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("model", ["blueprint", "blueprint-einsum"])
def test_a_blueprint_dump_never_imports_torch(model: str) -> None:
    """The whole CLI run, in a fresh interpreter: torch stays out of sys.modules."""
    done = _explain_without_torch("I love AI !", "--model", model, "--dump", "-")
    assert done.returncode == 0, done.stderr.decode()
    assert b"TORCH False" in done.stderr
    assert b"module MultiHeadAttention" in done.stdout and b"mha_tui/examples/blueprint.py" in done.stdout


def test_blueprint_from_the_cli_matches_the_independent_numbers() -> None:
    done = run_cli("explain", "I love AI !", "--model", "blueprint", "--dump", "-",
                   "--format", "json", "-C", "8", "-H", "4", "--seed", "3")
    assert done.returncode == 0, done.stderr.decode()
    data = json.loads(done.stdout)
    want = independent(Config("I love AI !", embed_dim=8, num_heads=4, seed=3))
    last = list(data["stages"][-1]["tensors"].values())[-1]
    assert last["dims"] == ["T", "C"]
    values = np.array(last["values"], dtype=np.float64)
    assert _close(values, want["out"])


def test_a_learner_numpy_module_from_the_cli_never_imports_torch(tmp_path) -> None:
    from pathlib import Path

    source = Path(ROOT, "tests", "fixtures", "numpy_attn.py").read_text()
    (tmp_path / "my_attn.py").write_text(source)
    done = _explain_without_torch("the cat sat", "--module",
                                  str(tmp_path / "my_attn.py:NumpyAttention"), "-C", "8",
                                  "--dump", "-", "--format", "json")
    assert done.returncode == 0, done.stderr.decode()
    assert b"TORCH False" in done.stderr
    data = json.loads(done.stdout)
    assert [stage["kind"] for stage in data["stages"]] == BLUEPRINT_KINDS


def test_a_numpy_forward_that_raises_is_one_line_and_exit_1(tmp_path) -> None:
    """A forward that raised writes its transcript up to the error stage, exits 1, and one
    line says what raised, where, and that the transcript ends there (#27)."""
    from pathlib import Path

    (tmp_path / "my_attn.py").write_text(Path(ROOT, "tests", "fixtures", "numpy_attn.py").read_text())
    done = _explain_without_torch("the cat sat", "--module",
                                  str(tmp_path / "my_attn.py:BrokenReshape"), "--dump", "-")
    assert done.returncode == 1, done.stderr.decode()
    assert "cannot reshape array of size" in done.stdout.decode()  # the transcript to its error
    error = [line for line in done.stderr.decode().splitlines() if line.startswith("mha-tui: ")]
    assert len(error) == 1
    assert "cannot reshape array of size" in error[0] and "my_attn.py line " in error[0]
    assert "the transcript written to standard output ends at its error" in error[0]


def test_bad_numpy_input_from_the_cli_is_one_line_exit_2(tmp_path) -> None:
    (tmp_path / "mine.py").write_text("class Mine:\n    pass\n")
    done = run_cli("explain", "I love AI !", "--module", str(tmp_path / "mine.py:Nope"), "--dump", "-")
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().count("\n") == 1 and "has no 'Nope'; classes there: Mine" in \
        done.stderr.decode()


# ------------------------------------------------------------------- --module with NumPy code

NUMPY_BAD_MODULES = [
    ("returns_list", "class A:\n    def __init__(self, d_model):\n        pass\n"
                     "    def forward(self, x):\n        return [1, 2]\n", "A",
     "A.forward returned a list whose first element is an int, not an ndarray"),
    ("missing", "class A:\n    pass\n\n\nclass B:\n    pass\n", "Z", "has no 'Z'; classes there: A, B"),
    ("function", "def f():\n    pass\n", "f", "is a function, not a class"),
    ("no_forward", "class A:\n    pass\n", "A",
     "A is neither an nn.Module subclass nor a class with a forward() method"),
    ("unfilled", "class A:\n    def __init__(self, foo):\n        pass\n"
                 "    def forward(self, x):\n        return x\n", "A",
     "A() needs a value for 'foo', which mha-tui cannot guess; give it with --init foo=VALUE"),
    ("syntax", "class A:\n    def forward(self, x)\n        return x\n", "A", "line 2: SyntaxError"),
    ("raises_on_build", "class A:\n    def __init__(self, d_model):\n        raise ValueError('no')\n\n"
                        "    def forward(self, x):\n        return x\n",
     "A", "line 3: ValueError: no (while building A(d_model=4))"),
]


@pytest.mark.parametrize(("name", "source", "cls", "message"), NUMPY_BAD_MODULES,
                         ids=[case[0] for case in NUMPY_BAD_MODULES])
def test_bad_numpy_modules_are_refused_with_one_line(tmp_path, name: str, source: str, cls: str,
                                                     message: str) -> None:
    from mha_tui.config import Source
    from mha_tui.load.learner import LoadError
    from mha_tui.load.numpy_modules import load

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    with pytest.raises(LoadError) as refused:
        load(Config("I love AI !"), Source(module=f"{path}:{cls}"))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_numpy_module_is_built_by_name_with_its_seed(tmp_path) -> None:
    from mha_tui.config import Source
    from mha_tui.load.numpy_modules import load

    path = tmp_path / "mine.py"
    path.write_text("import numpy as np\n\n\nclass Mine:\n"
                    "    def __init__(self, d_model, n_heads, seed=0, scale=1.0):\n"
                    "        self.W = np.random.default_rng(seed).standard_normal((d_model, d_model))\n"
                    "        self.scale = scale\n\n"
                    "    def forward(self, x, mask=None):\n"
                    "        return (x @ self.W) * self.scale\n")
    loaded = load(Config("I love AI !", embed_dim=8, num_heads=2, seed=9),
                  Source(module=f"{path}:Mine", init=(("scale", 2.0),)))
    assert loaded is not None
    assert loaded.construction == "Mine(d_model=8, n_heads=2, seed=9, scale=2.0)"
    assert loaded.x.shape == (4, 8) and set(loaded.kwargs) == {"mask"}
    assert np.array_equal(loaded.module.W, np.random.default_rng(9).standard_normal((8, 8)))


def test_weights_files_are_for_torch_modules_only(tmp_path) -> None:
    from mha_tui.config import Source
    from mha_tui.load.learner import LoadError
    from mha_tui.load.numpy_modules import load

    path = tmp_path / "mine.py"
    path.write_text("class Mine:\n    def forward(self, x):\n        return x\n")
    with pytest.raises(LoadError, match="--weights loads a torch state dict"):
        load(Config("I love AI !"), Source(module=f"{path}:Mine", weights=str(tmp_path / "w.pt")))


def test_per_head_weight_lists_come_out_as_h_head_slices() -> None:
    from mha_tui.load.numpy_modules import causal_mask, embedding_table
    from tests.fixtures.numpy_attn import PerHeadWeights

    config = Config("I love AI ! again", embed_dim=6, num_heads=3, seed=2)
    module = PerHeadWeights(6, 3, seed=2)
    table, ids = embedding_table(config), np.array(config.ids)
    x, mask = table[ids], causal_mask(len(ids))
    result = trace_numpy(module, x, config.tokens, kwargs={"mask": mask}, table=table, ids=ids,
                   config=config)
    kinds = [s.kind for s in result.stages]
    assert kinds == ["embed", "project", "scores", "scale", "mask", "softmax", "attend", "concat",
                     "w_o"]
    weights = []
    for i in range(3):
        s = (x @ module.W_q[i]) @ (x @ module.W_k[i]).T / np.sqrt(2) + mask
        e = np.exp(s)
        weights.append(e / e.sum(-1, keepdims=True))
    softmax = result.stage("softmax")
    assert softmax.tensors[-1].dims == ("h", "T", "T")
    assert _close(softmax.tensors[-1].values, np.stack(weights))
    assert "the row maximum is subtracted before exp (no overflow): no" in \
        [c.label for c in softmax.checks]
    assert result.stage("concat").checks[0].label.startswith("np.concatenate put the 3 heads'")
    assert result.stage("project").tensors[0].name == "W_q.*"
    assert all(c.ok is not False for s in result.stages for c in s.checks)


def test_a_boolean_mask_is_json_true_false() -> None:
    import io

    from mha_tui.write.dump import write_values

    out = io.BytesIO()
    write_values(np.array([[True, False], [False, True]]), out)
    assert json.loads(out.getvalue()) == [[True, False], [False, True]]


# ------------------------------------------------------------------- mha-tui check, NumPy code

CHECK_CASES = [  # (class in tests/fixtures/numpy_attn.py, equivalent, first wrong kind, diagnosis)
    ("NumpyAttention", True, None, None),
    ("PerHeadWeights", True, None, None),
    ("ScaledBySqrtC", False, "scale", "scaled_by_sqrt_C"),
    ("SoftmaxOverQueries", False, "softmax", "softmax_wrong_axis"),
    ("BrokenReshape", False, "error", "crash"),
]


@pytest.mark.parametrize(("cls", "equivalent", "stage", "diagnosis"), CHECK_CASES,
                         ids=[case[0] for case in CHECK_CASES])
def test_check_judges_numpy_modules(cls: str, equivalent: bool, stage: str | None,
                                    diagnosis: str | None) -> None:
    from mha_tui.config import Source
    from mha_tui.pipeline import check_source

    fixture = f"{ROOT}/tests/fixtures/numpy_attn.py:{cls}"
    verdict = check_source(Config("I love AI !", embed_dim=8, num_heads=2), Source(module=fixture))
    assert verdict.equivalent is equivalent
    if diagnosis is None:
        assert verdict.diagnosis is None
        assert all(row.ok is not False for row in verdict.stages)
        end = verdict.end_to_end
        if cls == "NumpyAttention":  # weights found by role: compared with the NumPy reference
            assert end is not None and end.ok is True
            assert "the NumPy blueprint's computation" in end.checked
    else:
        assert verdict.diagnosis is not None and verdict.diagnosis.kind == diagnosis
        assert verdict.diagnosis.stage == stage


@pytest.mark.parametrize("model", ["blueprint", "blueprint-einsum"])
def test_check_says_the_blueprint_is_multi_head_attention(model: str) -> None:
    from mha_tui.config import Source
    from mha_tui.pipeline import check_source

    verdict = check_source(Config("the cat sat on the mat", embed_dim=8, num_heads=4, seed=1),
                           Source(model=model))
    assert verdict.equivalent and verdict.diagnosis is None
    kinds = [row.kind for row in verdict.stages]
    assert {"project", "scores", "scale", "mask", "softmax", "attend", "concat", "w_o"} <= set(kinds)
    softmax = next(row for row in verdict.stages if row.kind == "softmax")
    assert softmax.ok is True  # the hand-written softmax, judged as one
    if model == "blueprint-einsum":  # its weights found by role, the output compared end to end
        assert verdict.end_to_end is not None and verdict.end_to_end.ok is True


def test_check_on_numpy_code_never_imports_torch() -> None:
    code = ("import sys, runpy, os\n"
            "os._exit = lambda code: (sys.stdout.flush(), sys.stderr.write("
            "'TORCH ' + str('torch' in sys.modules) + '\\n'), sys.exit(code))\n"
            "sys.argv = ['mha-tui', 'check', '--model', 'blueprint']\n"
            "try:\n"
            "    runpy.run_module('mha_tui', run_name='__main__')\n"
            "finally:\n"
            "    sys.stderr.write('TORCH ' + str('torch' in sys.modules) + '\\n')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert b"TORCH False" in done.stderr and b"TORCH True" not in done.stderr
    assert b"equivalent to multi-head attention" in done.stdout
