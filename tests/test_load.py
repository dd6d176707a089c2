"""The load room: a learner's module found, built by name, fed, and given weights safely."""

from __future__ import annotations

import inspect
import os
import pickle
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mha_tui.config import Config, ConfigError, Source, parse_init, parse_module_ref
from mha_tui.load.learner import FILLED_BY_NAME
from mha_tui.load.modules import (
    LoadError,
    causal_mask,
    constructor_arguments,
    forward_inputs,
    load,
    output_tensor,
)

CONFIG = Config("I love AI !", embed_dim=8, num_heads=2, seed=0, max_seq_len=32)


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


PLAIN = """
    import torch
    from torch import nn

    class Attn(nn.Module):
        def __init__(self, d_model, n_heads, block_size, dropout=0.3, scale=1.0, bias=False):
            super().__init__()
            self.seen = dict(d_model=d_model, n_heads=n_heads, block_size=block_size,
                             dropout=dropout, scale=scale, bias=bias)
            self.proj = nn.Linear(d_model, d_model, bias=bias)

        def forward(self, x):
            return self.proj(x) * self.seen["scale"]
"""


# ---------------------------------------------------------------- argument parsing


@pytest.mark.parametrize(("text", "expected"), [
    ("qkv_bias=True", ("qkv_bias", True)),
    ("scale = 0.5", ("scale", 0.5)),
    ("name='a=b'", ("name", "a=b")),
    ("sizes=[1, 2]", ("sizes", [1, 2])),
    ("x=None", ("x", None)),
])
def test_init_takes_python_literals(text: str, expected: tuple[str, object]) -> None:
    assert parse_init(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("qkv_bias", "is not NAME=VALUE"),
    ("=3", "is not NAME=VALUE"),
    ("1x=3", "is not NAME=VALUE"),
    ("class=3", "is not NAME=VALUE"),
    ("act=relu", "'relu' is not a Python literal"),
    ("n=__import__('os')", "is not a Python literal"),
    ("n=(1,", "is not a Python literal"),
])
def test_bad_init_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_init(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("my_attn.py:MultiHeadAttention", ("my_attn.py", "MultiHeadAttention", True)),
    ("src/attn:MHA", ("src/attn", "MHA", True)),
    ("torch.nn:MultiheadAttention", ("torch.nn", "MultiheadAttention", False)),
    ("pkg.mod:Outer.Inner", ("pkg.mod", "Outer.Inner", False)),
])
def test_module_references(text: str, expected: tuple[str, str, bool]) -> None:
    assert parse_module_ref(text) == expected


@pytest.mark.parametrize("text", ["my_attn.py", ":MHA", "my_attn.py:", "a b:MHA", "x.py:1st"])
def test_bad_module_references(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--module takes FILE\.py:Class or package\.module:Class"):
        parse_module_ref(text)


# ---------------------------------------------------------------- constructor arguments


def test_constructor_arguments_are_filled_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, "attn.py", PLAIN)
    loaded = load(CONFIG, Source(module=f"{path}:Attn"))
    # d_model, n_heads, block_size by name; the author's own dropout default (0.3) and the rest
    # keep theirs: the module is judged as its author constructs it (#27).
    assert loaded.module.seen == dict(d_model=8, n_heads=2, block_size=32, dropout=0.3, scale=1.0,
                                      bias=False)
    assert loaded.construction == "Attn(d_model=8, n_heads=2, block_size=32)"


def test_every_listed_name_gets_its_value() -> None:
    class Everything(nn.Module):
        def __init__(self, embed_dim, d_model, d_in, d_out, n_embd, dim, num_heads, n_heads, n_head,
                     max_seq_len, context_length, block_size, dropout=0.5, batch_first=False,
                     causal=True):
            super().__init__()

    kwargs = constructor_arguments(Everything, CONFIG, {})
    assert kwargs == {**dict.fromkeys(("embed_dim", "d_model", "d_in", "d_out", "n_embd", "dim"), 8),
                      **dict.fromkeys(("num_heads", "n_heads", "n_head"), 2),
                      **dict.fromkeys(("max_seq_len", "context_length", "block_size"), 32),
                      "batch_first": True, "causal": True}
    # dropout keeps the class's own default (0.5); a class without one gets 0.0.
    no_causal = Config("I love AI !", embed_dim=8, num_heads=2, causal=False)
    assert constructor_arguments(Everything, no_causal, {})["causal"] is False


@pytest.mark.parametrize("what", sorted(FILLED_BY_NAME))
def test_every_name_of_the_table_gets_its_value(what: str) -> None:
    """learner.FILLED_BY_NAME, the one table: each name, alone in a class without a default,
    is filled with what its row says (C, h, C / h, ...)."""
    given = {"C": 8, "h": 2, "d_h": 4, "kv_heads": 2, "max_seq_len": 32, "dropout": 0.0}
    for name in FILLED_BY_NAME[what]:
        def init(self: nn.Module, *args: object, **kwargs: object) -> None:
            nn.Module.__init__(self)

        init.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)])
        cls = type("Attn", (nn.Module,), {"__init__": init})
        assert constructor_arguments(cls, CONFIG, {}) == {name: given[what]}, name


def test_public_codes_constructor_names_are_filled(tmp_path: Path) -> None:
    """Whisper's MultiHeadAttention(n_state, n_head), lucidrains' Attention(dim, heads=8,
    dim_head=64), the Annotated Transformer's MultiHeadedAttention(h, d_model, dropout=0.1)
    and d2l's MultiHeadAttention(num_hiddens, num_heads, dropout): built without --init,
    each author's dropout default kept."""
    path = write(tmp_path, "public.py", """
        from torch import nn

        class Whisper(nn.Module):
            def __init__(self, n_state, n_head):
                super().__init__()

            def forward(self, x):
                return x

        class Lucidrains(nn.Module):
            def __init__(self, dim, heads=8, dim_head=64, dropout=0.1):
                super().__init__()

            def forward(self, x):
                return x

        class Annotated(nn.Module):
            def __init__(self, h, d_model, dropout=0.1):
                super().__init__()

            def forward(self, x):
                return x

        class D2l(nn.Module):
            def __init__(self, num_hiddens, num_heads, dropout, bias=False):
                super().__init__()

            def forward(self, x):
                return x
        """)
    built = {cls: load(CONFIG, Source(module=f"{path}:{cls}")).construction
             for cls in ("Whisper", "Lucidrains", "Annotated", "D2l")}
    assert built == {"Whisper": "Whisper(n_state=8, n_head=2)",
                     "Lucidrains": "Lucidrains(dim=8, heads=2, dim_head=4)",
                     "Annotated": "Annotated(h=2, d_model=8)",
                     "D2l": "D2l(num_hiddens=8, num_heads=2, dropout=0.0)"}


def test_init_sets_other_parameters_and_overrides_the_rules(tmp_path: Path) -> None:
    path = write(tmp_path, "attn.py", PLAIN)
    source = Source(module=f"{path}:Attn", init=(("scale", 0.5), ("bias", True), ("block_size", 7)))
    loaded = load(CONFIG, source)
    assert loaded.module.seen["scale"] == 0.5 and loaded.module.seen["bias"] is True
    assert loaded.module.seen["block_size"] == 7
    assert loaded.module.proj.bias is not None


def test_init_reaches_keyword_catch_alls() -> None:
    class Loose(nn.Module):
        def __init__(self, d_model, **options):
            super().__init__()

    assert constructor_arguments(Loose, CONFIG, {"anything": 3}) == {"d_model": 8, "anything": 3}


def test_unknown_init_is_refused_with_the_parameters(tmp_path: Path) -> None:
    path = write(tmp_path, "attn.py", PLAIN)
    with pytest.raises(LoadError, match=r"^--init colour: Attn\(\) has no parameter 'colour'; "
                                        r"it takes: d_model, n_heads, block_size, dropout, scale, bias$"):
        load(CONFIG, Source(module=f"{path}:Attn", init=(("colour", 1),)))


def test_required_argument_left_unfilled_is_refused_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "attn.py", """
        from torch import nn
        class Attn(nn.Module):
            def __init__(self, d_model, vocab_size, n_heads):
                super().__init__()
    """)
    with pytest.raises(LoadError, match=r"^Attn\(\) needs a value for 'vocab_size', which mha-tui "
                                        r"cannot guess; give it with --init vocab_size=VALUE$"):
        load(CONFIG, Source(module=f"{path}:Attn"))


def test_torch_multihead_attention_from_an_installed_package() -> None:
    """package.module:Class, query/key/value inputs, attn_mask, and a tuple result."""
    loaded = load(CONFIG, Source(module="torch.nn:MultiheadAttention"))
    assert isinstance(loaded.module, nn.MultiheadAttention)
    assert loaded.module.batch_first and loaded.module.embed_dim == 8 and loaded.module.num_heads == 2
    assert loaded.args == (loaded.x, loaded.x, loaded.x)
    assert torch.equal(loaded.kwargs["attn_mask"], causal_mask(4))
    with torch.no_grad():
        out, _ = loaded.module(loaded.x, loaded.x, loaded.x, attn_mask=causal_mask(4))
        assert torch.equal(loaded.forward(), out)
    assert loaded.label == "torch.nn:MultiheadAttention"


# ---------------------------------------------------------------- forward's inputs


def _forward_of(signature: str) -> nn.Module:
    namespace: dict[str, object] = {"nn": nn}
    exec(f"class M(nn.Module):\n    def forward(self, {signature}):\n        return x", namespace)
    return namespace["M"]()  # type: ignore[operator]


X = torch.zeros(1, 3, 4)


@pytest.mark.parametrize(("signature", "n_args", "mask"), [
    ("x", 1, None),
    ("x, mask=None", 1, "mask"),
    ("x, attn_mask=None", 1, "attn_mask"),
    ("x, mask", 1, "mask"),
    ("query, key, value", 3, None),
    ("query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None", 3, "attn_mask"),
    ("q, k, v, mask=None", 3, "mask"),
    ("x, *, mask=None", 1, "mask"),
    ("*inputs", 1, None),
    ("x, extra=3", 1, None),
])
def test_forward_inputs(signature: str, n_args: int, mask: str | None) -> None:
    args, kwargs = forward_inputs(_forward_of(signature), X, causal=True)
    assert len(args) == n_args and all(a is X for a in args)
    assert list(kwargs) == ([mask] if mask else [])
    if mask:
        assert kwargs[mask].dtype == torch.bool
        assert torch.equal(kwargs[mask], torch.tensor([[False, True, True], [False, False, True],
                                                       [False, False, False]]))


def test_no_causal_passes_no_mask_or_none_when_required() -> None:
    assert forward_inputs(_forward_of("x, mask=None"), X, causal=False)[1] == {}
    assert forward_inputs(_forward_of("x, mask"), X, causal=False)[1] == {"mask": None}


@pytest.mark.parametrize(("signature", "message"), [
    ("", r"^M\.forward\(\) takes no input"),
    ("x, y", r"^M\.forward\(x, y\) needs 2 inputs"),
    ("x, *, tokens", r"^M\.forward needs 'tokens', which mha-tui cannot give"),
])
def test_forward_mha_tui_cannot_feed_is_refused(signature: str, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        forward_inputs(_forward_of(signature), X, causal=True)


def test_a_tuple_result_gives_its_first_element_and_a_non_tensor_is_refused() -> None:
    module = nn.Identity()
    assert output_tensor((X, "weights"), module) is X
    assert output_tensor([X], module) is X
    for result, what in [({"out": X}, "a dict"), (None, "None"), (("a",), "a str"), ((), "a tuple")]:
        with pytest.raises(LoadError, match=rf"^Identity\.forward returned {what}, not a tensor"):
            output_tensor(result, module)


# ---------------------------------------------------------------- importing a learner's file


def test_a_file_is_loaded_without_shadowing_or_leaving_its_folder_on_sys_path(tmp_path: Path) -> None:
    """A learner file named json.py importing its neighbour: json stays json, the neighbour
    is found, and afterwards sys.path is what it was."""
    write(tmp_path, "helpers.py", "WIDTH = 1.5\n")
    source = textwrap.dedent(PLAIN).replace("import torch", "import torch\nimport helpers")
    path = write(tmp_path, "json.py", source.replace('self.seen["scale"]', "helpers.WIDTH"))
    import json

    before = list(sys.path)
    loaded = load(CONFIG, Source(module=f"{path}:Attn"))
    assert sys.modules["json"] is json and sys.path == before
    assert type(loaded.module).__module__.startswith("_mha_tui_learner_.")
    assert loaded.file == str(path.resolve())
    with torch.no_grad():
        assert torch.equal(loaded.forward(), loaded.module.proj(loaded.x) * 1.5)
    sys.modules.pop("helpers", None)


def test_learner_prints_go_to_stderr(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "noisy.py", 'print("hello from import")\n' + textwrap.dedent(PLAIN))
    load(CONFIG, Source(module=f"{path}:Attn"))
    out, err = capfd.readouterr()
    assert out == "" and "hello from import" in err


def test_the_same_seed_gives_the_same_module_whatever_the_import_does(tmp_path: Path) -> None:
    """The file is imported before the seed: random numbers drawn at import time do not shift
    the module's weights or the embedding."""
    plain = write(tmp_path, "plain.py", PLAIN)
    greedy = write(tmp_path, "greedy.py", "import torch\ntorch.randn(100)\n" + textwrap.dedent(PLAIN))
    a = load(CONFIG, Source(module=f"{plain}:Attn"))
    b = load(CONFIG, Source(module=f"{greedy}:Attn"))
    assert torch.equal(a.x, b.x) and torch.equal(a.module.proj.weight, b.module.proj.weight)


@pytest.mark.parametrize(("source", "message"), [
    ("import torch\nraise RuntimeError('no GPU here')\n",
     r"^{file}, line 2: RuntimeError: no GPU here \(while importing {file}\)$"),
    ("from torch import nn\nclass Attn(nn.Module):\n    def __init__(self, d_model):\n"
     "        super().__init__()\n        assert d_model % 3 == 0, 'd_model must be divisible by 3'\n",
     r"^{file}, line 5: AssertionError: d_model must be divisible by 3 \(while building "
     r"Attn\(d_model=8\)\)$"),
    ("from torch import nn\nclass Attn(nn.Module):\n    def __init__(self, d_model):\n"
     "        super().__init__()\n        self.w = nn.Linear(d_model, 'four')\n",
     r"^{file}, line 5: TypeError: .*\(while building Attn\(d_model=8\)\)$"),
    ("def broken(:\n    pass\n", r"^{file}, line 1: SyntaxError: .* \(while importing {file}\)$"),
    ("import no_such_package_here\n",
     r"^{file}, line 1: ModuleNotFoundError: No module named 'no_such_package_here' "),
])
def test_learner_code_that_fails_is_one_line_with_file_and_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "attn.py").write_text(source)
    with pytest.raises(LoadError, match=message.format(file="attn\\.py")) as raised:
        load(CONFIG, Source(module="attn.py:Attn"))
    assert "\n" not in str(raised.value)
    if "while importing" in message:  # a failed import leaves nothing behind
        failed = str((tmp_path / "attn.py").resolve())
        assert not [name for name, module in list(sys.modules.items())
                    if getattr(module, "__file__", None) == failed]


def test_two_files_of_one_name_each_show_their_own_source(tmp_path: Path) -> None:
    """a/attn.py and b/attn.py loaded in one process: each class's file is its own (they
    shared one sys.modules name, and the second file's source was shown for the first)."""
    for folder, scale in (("a", 1.0), ("b", 2.0)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "attn.py").write_text(
            "import torch.nn as nn\n\n\nclass Attn(nn.Module):\n"
            "    def __init__(self, embed_dim, num_heads):\n        super().__init__()\n"
            f"    def forward(self, x):\n        return x * {scale}\n")
    first = load(CONFIG, Source(module=str(tmp_path / "a" / "attn.py") + ":Attn"))
    second = load(CONFIG, Source(module=str(tmp_path / "b" / "attn.py") + ":Attn"))
    import inspect

    assert inspect.getsourcefile(type(first.module)) == str(tmp_path / "a" / "attn.py")
    assert inspect.getsourcefile(type(second.module)) == str(tmp_path / "b" / "attn.py")


def test_missing_class_lists_the_modules_classes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    extra = "\nclass Head(nn.Module):\n    pass\n\ndef helper():\n    pass\n"
    write(tmp_path, "attn.py", textwrap.dedent(PLAIN) + extra)
    with pytest.raises(LoadError, match=r"^--module attn\.py has no 'MHA'; nn\.Module classes "
                                        r"there: Attn, Head$"):
        load(CONFIG, Source(module="attn.py:MHA"))
    with pytest.raises(LoadError, match=r"^--module attn\.py:helper is a function, not an nn\.Module "
                                        r"subclass"):
        load(CONFIG, Source(module="attn.py:helper"))


def test_missing_file_and_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError, match=r"^--module nope\.py does not exist; give a \.py file"):
        load(CONFIG, Source(module="nope.py:MHA"))
    with pytest.raises(LoadError, match=r"^--module: no module named 'nope_pkg' in this Python "
                                        r"environment$"):
        load(CONFIG, Source(module="nope_pkg:MHA"))
    write(tmp_path, "mine.py", PLAIN)
    with pytest.raises(LoadError, match=r"did you mean mine\.py:\.\.\.\?$"):
        load(CONFIG, Source(module="mine:Attn"))


def test_a_missing_module_for_check_names_no_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` takes the module as its argument: its refusals suggest no `--module`."""
    from typer.testing import CliRunner

    from mha_tui.cli import app

    monkeypatch.chdir(tmp_path)
    write(tmp_path, "mine.py", PLAIN)
    for ref, said in (("nope.py:MHA", "nope.py does not exist; give a .py file and a class, "
                                      "e.g. my_attn.py:MultiHeadAttention"),
                      ("mine:Attn", "no module named 'mine' in this Python environment; did you "
                                    "mean mine.py:...?")):
        result = CliRunner().invoke(app, ["check", ref])
        assert result.exit_code == 2
        assert result.stderr == f"mha-tui: error: {said}\n"


def test_timms_dim_is_filled_with_c() -> None:
    """timm's Attention(dim, num_heads=8), Meta's ModelArgs(dim=...): `dim` is C by name."""
    class Timm(nn.Module):
        def __init__(self, dim, num_heads=8, qkv_bias=False):
            super().__init__()

    assert constructor_arguments(Timm, CONFIG, {}) == {"dim": 8, "num_heads": 2}


@pytest.mark.parametrize("signature", ["config", "args", "settings: Cfg"])
def test_a_config_object_parameter_gets_a_hint_that_works(signature: str) -> None:
    """nanoGPT's CausalSelfAttention(config), Meta's Attention(args: ModelArgs): --init takes
    literals only, so the refusal says to build the object in a subclass instead."""
    namespace: dict[str, object] = {"nn": nn, "Cfg": type("Cfg", (), {})}
    exec(f"class Block(nn.Module):\n    def __init__(self, {signature}):\n        super().__init__()",
         namespace)
    name = signature.split(":")[0]
    with pytest.raises(LoadError) as raised:
        constructor_arguments(namespace["Block"], CONFIG, {})
    assert str(raised.value) == (
        f"Block() needs {name!r}, an object: give it with --init '{name}={{\"key\": VALUE}}' if "
        f"the class reads {name}[\"key\"] (a dict), or run a subclass whose __init__(self, "
        f"embed_dim, num_heads) builds the {name} and calls super().__init__({name})")


def test_a_cfg_dict_given_with_init_works_as_the_refusal_says() -> None:
    """#27: the refusal said `--init` could not give `cfg` while `--init 'cfg={"d": 4}'`
    works for a class that reads cfg["d"]."""
    class Block(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.proj = nn.Linear(cfg["d"], cfg["d"])

    assert constructor_arguments(Block, CONFIG, {"cfg": {"d": 8}}) == {"cfg": {"d": 8}}


def test_hugging_face_names_are_filled() -> None:
    """#27: a class written with Hugging Face's names gets the run's sizes; the K/V head
    count and the attention dropout only where the class has no default of its own."""
    class HfStyle(nn.Module):
        def __init__(self, hidden_size, num_attention_heads, num_key_value_heads,
                     attention_dropout):
            super().__init__()

    class WithDefaults(nn.Module):
        def __init__(self, hidden_size, num_attention_heads, num_key_value_heads=1,
                     attention_dropout=0.1):
            super().__init__()

    assert constructor_arguments(HfStyle, CONFIG, {}) == {
        "hidden_size": CONFIG.embed_dim, "num_attention_heads": CONFIG.num_heads,
        "num_key_value_heads": CONFIG.num_heads, "attention_dropout": 0.0}
    assert constructor_arguments(WithDefaults, CONFIG, {}) == {
        "hidden_size": CONFIG.embed_dim, "num_attention_heads": CONFIG.num_heads}


def test_every_missing_argument_is_named_at_once() -> None:
    """#27: a class missing two arguments was refused one per run."""
    class Two(nn.Module):
        def __init__(self, d_model, vocab_size, rank):
            super().__init__()

    with pytest.raises(LoadError) as raised:
        constructor_arguments(Two, CONFIG, {})
    assert str(raised.value) == ("Two() needs values for 'vocab_size' and 'rank', which mha-tui "
                                 "cannot guess; give them with --init vocab_size=VALUE --init "
                                 "rank=VALUE")


def test_a_required_literal_parameter_still_asks_for_init() -> None:
    class Needs(nn.Module):
        def __init__(self, d_model, rank: int):
            super().__init__()

    with pytest.raises(LoadError, match=r"^Needs\(\) needs a value for 'rank', which mha-tui "
                                        r"cannot guess; give it with --init rank=VALUE$"):
        constructor_arguments(Needs, CONFIG, {})


def test_a_builtin_model_with_its_own_mask_refuses_no_causal() -> None:
    with pytest.raises(LoadError, match=r"^--model raschka always applies its own causal mask"):
        load(Config("a b", causal=False), Source(model="raschka"))


def test_the_refusal_of_no_causal_names_every_model_that_takes_it() -> None:
    """The models it names (the NumPy blueprint's too) do run with --no-causal, and every
    other --model refuses it."""
    from typer.testing import CliRunner

    from mha_tui.cli import app
    from mha_tui.config import MODEL_NAMES, NUMPY_MODEL_NAMES

    with pytest.raises(LoadError) as raised:
        load(Config("a b", causal=False), Source(model="raschka"))
    named = str(raised.value).split("--no-causal works with ")[1].removesuffix(" and --module")
    named = named.split(", ")
    assert {"mygpt", "course", "blueprint", "blueprint-einsum"} <= set(named)
    for model in MODEL_NAMES + NUMPY_MODEL_NAMES:
        result = CliRunner().invoke(app, ["explain", "a b", "--model", model, "--no-causal",
                                          "--dump", "-"])
        assert result.exit_code == (0 if model in named else 2), (model, result.output)


def test_init_reaches_a_builtin_model() -> None:
    loaded = load(CONFIG, Source(model="raschka", init=(("qkv_bias", True),)))
    assert loaded.module.W_query.bias is not None


# ---------------------------------------------------------------- weights


@pytest.fixture
def attn_file(tmp_path: Path) -> str:
    return f"{write(tmp_path, 'attn.py', PLAIN.replace('bias=False', 'bias=True'))}:Attn"


def _trained(attn_file: str) -> dict[str, torch.Tensor]:
    other = load(Config("x y", embed_dim=8, num_heads=2, seed=123), Source(module=attn_file))
    return {k: v.clone() + 1 for k, v in other.module.state_dict().items()}


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "checkpoint"])
def test_weights_replace_the_modules_tensors(tmp_path: Path, attn_file: str, fmt: str) -> None:
    state = _trained(attn_file)
    path = tmp_path / f"w.{'safetensors' if fmt == 'safetensors' else 'pt'}"
    if fmt == "safetensors":
        save_file(state, str(path))
    else:
        torch.save(state if fmt == "pt" else {"epoch": 3, "model_state_dict": state}, path)
    loaded = load(CONFIG, Source(module=attn_file, weights=str(path)))
    assert all(torch.equal(loaded.module.state_dict()[k], v) for k, v in state.items())
    plain = load(CONFIG, Source(module=attn_file))
    assert torch.equal(loaded.x, plain.x)  # the embedding still comes from the seed


def test_the_header_and_the_json_say_which_weights_file_the_numbers_come_from(
        tmp_path: Path, attn_file: str) -> None:
    """Two transcripts of one module, one with --weights: the header (every format, the
    app's too) and JSON's "module" name the file, so the different numbers are explained."""
    import io
    import json

    from mha_tui.pipeline import run_trace
    from mha_tui.render.options import RenderOptions
    from mha_tui.write.dump import to_text, write_json

    path = tmp_path / "trained.pt"
    torch.save(_trained(attn_file), path)
    with_weights = run_trace(CONFIG, Source(module=attn_file, weights=str(path)))
    plain = run_trace(CONFIG, Source(module=attn_file))
    assert with_weights.module.weights == str(path) and plain.module.weights == ""
    module_line = to_text(with_weights, RenderOptions(), width=200).splitlines()[1]
    assert module_line.endswith(f"  weights {path}"), module_line
    assert "weights" not in to_text(plain, RenderOptions(), width=200).splitlines()[1]
    out = io.BytesIO()
    write_json(with_weights, out)
    assert json.loads(out.getvalue())["module"]["weights"] == str(path)
    out = io.BytesIO()
    write_json(plain, out)
    assert "weights" not in json.loads(out.getvalue())["module"]


def _evil_payload(marker: Path) -> object:
    class Evil:
        def __reduce__(self):  # what an attacker's file asks the unpickler to call
            return (os.system, (f"touch {marker}",))

    return Evil()


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_weights_file_that_would_run_code_is_refused(tmp_path: Path, attn_file: str, how: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    payload = {"proj.weight": _evil_payload(marker)}
    if how == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(LoadError, match=r"^--weights \S*evil\.pt would run code when loaded \(it calls "
                                        r"posix\.system\); refused"):
        load(CONFIG, Source(module=attn_file, weights=str(path)))
    assert not marker.exists()
    # The payload is real: unpickled the unsafe way, it would have created the marker.
    pickle.loads(pickle.dumps(_evil_payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.pop("proj.bias"),
     r" has no 'proj\.bias', which Attn has \(2 tensors in the module, 1 in the file\)$"),
    (lambda s: s.update({"proj.weight": torch.zeros(4, 4)}),
     r": 'proj\.weight' is \(4, 4\) in the file but \(8, 8\) in Attn \(check --embed-dim"),
    (lambda s: s.update({"proj.bias": torch.zeros(3)}),
     r": 'proj\.bias' is \(3,\) in the file but \(8,\) in Attn"),
    (lambda s: s.update({"extra.weight": torch.zeros(1)}),
     r" has 'extra\.weight', which Attn does not have$"),
    (lambda s: s.update({"proj.weight": torch.zeros(8, 8, dtype=torch.long)}),
     r": 'proj\.weight' is torch\.int64 in the file but torch\.float32 in Attn$"),
])
def test_weights_that_do_not_fit_name_the_first_mismatch(tmp_path: Path, attn_file: str, change,
                                                          message: str) -> None:
    state = _trained(attn_file)
    change(state)
    for suffix in ("pt", "safetensors"):
        path = tmp_path / f"w.{suffix}"
        save_file(state, str(path)) if suffix == "safetensors" else torch.save(state, path)
        with pytest.raises(LoadError, match=r"^--weights \S*w\." + suffix + message):
            load(CONFIG, Source(module=attn_file, weights=str(path)))


@pytest.mark.parametrize(("content", "message"), [
    (None, r"does not exist$"),
    (b"not a checkpoint", r"is neither a torch\.save file nor a \.safetensors file$"),
    (b"PK\x03\x04 but no zip", r"is not a state dict torch\.load can read: "),
    ([1, 2], r"holds a list, not a state dict"),
    ({"proj.weight": "text"}, r"entry 'proj\.weight' is a str, not a tensor$"),
])
def test_unreadable_weights(tmp_path: Path, attn_file: str, content: object, message: str) -> None:
    path = tmp_path / "w.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(LoadError, match=r"^--weights \S*w\.pt\b.*" + message) as raised:
        load(CONFIG, Source(module=attn_file, weights=str(path)))
    assert "\n" not in str(raised.value)


def test_a_broken_safetensors_file(tmp_path: Path, attn_file: str) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(LoadError, match=r"^--weights \S*w\.safetensors is not a readable \.safetensors "):
        load(CONFIG, Source(module=attn_file, weights=str(path)))


def test_a_learner_forward_returning_a_non_tensor_is_refused_at_load(tmp_path: Path) -> None:
    path = write(tmp_path, "attn.py", PLAIN.replace('return self.proj(x) * self.seen["scale"]',
                                                    'return {"out": self.proj(x)}'))
    with pytest.raises(LoadError, match=r"^Attn\.forward returned a dict, not a tensor; "):
        load(CONFIG, Source(module=f"{path}:Attn"))


def test_a_learner_forward_that_raises_is_left_for_the_trace(tmp_path: Path) -> None:
    """Not a load error: the trace shows the stages up to the failing line."""
    path = write(tmp_path, "attn.py", PLAIN.replace('return self.proj(x) * self.seen["scale"]',
                                                    "return self.proj(x).view(-1, 3)"))
    loaded = load(CONFIG, Source(module=f"{path}:Attn"))
    with pytest.raises(RuntimeError), torch.no_grad():
        loaded.forward()


def test_init_of_a_head_count_must_agree_with_heads() -> None:
    """--init num_heads=4 beside --heads 2 would draw a header and head labels of 2 heads over
    a module of 4: refused, saying which flag to use; the same number is fine."""
    class Heads(nn.Module):
        def __init__(self, embed_dim, num_heads=1, n_heads=1, n_head=1):
            super().__init__()

    for name in ("num_heads", "n_heads", "n_head"):
        with pytest.raises(LoadError, match=rf"^--init {name}=4 disagrees with --heads 2: give "
                                            r"--heads 4 instead$"):
            constructor_arguments(Heads, CONFIG, {name: 4})
    assert constructor_arguments(Heads, CONFIG, {"num_heads": 2})["num_heads"] == 2
