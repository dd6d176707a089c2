"""The load room for NumPy modules: the blueprint (`--model blueprint`) and a learner's class.

Built in the order a reader of the NumPy blueprint (seed 002) builds it:

    module = MultiHeadAttention(d_model, n_heads, seed=seed)   # W_Q, W_K, W_V, W_O from
                                                               # np.random.default_rng(seed)
    table = np.random.default_rng(seed + 1).standard_normal((V, d_model)).astype(np.float32)
    x = table[ids]                                             # (T, d_model), no batch axis
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)   # or None: --no-causal

then `module.forward(x, mask)`. A learner's NumPy class (`--module`) is built by the same
rules as a torch module (d_model / n_heads / seed ... filled by name) and gets the same x and
the blueprint's additive mask in a forward parameter named `mask` or `attn_mask`.

NumPy only: importing this module (and running a NumPy module) never imports torch.
Never import rich, textual or typer here either.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..config import NUMPY_MODEL_NAMES, Config, Source, parse_module_ref
from .learner import (
    LoadError,
    class_file,
    constructor_arguments,
    describe,
    forward_of,
    import_file,
    import_name,
    learner_code,
    safe,
    shown_path,
)

MASK_NAMES = ("mask", "attn_mask")


def embedding_table(config: Config) -> np.ndarray:
    """The blueprint's embedding: a second generator, seeded seed + 1, one row per token."""
    rng = np.random.default_rng(config.seed + 1)
    return rng.standard_normal((len(config.vocab), config.embed_dim)).astype(np.float32)


def causal_mask(T: int) -> np.ndarray:
    """The blueprint's additive (T, T) mask: 0 where a token may look, -inf above the diagonal."""
    return np.triu(np.full((T, T), -np.inf, dtype=np.float32), k=1)


@dataclass(frozen=True, eq=False)
class LoadedNumpy:
    """A built NumPy module, its input, and how its forward is called.

    x has no batch axis, and tracing it never imports torch (`library`, `batched`)."""

    library: ClassVar[str] = "numpy"
    batched: ClassVar[bool] = False

    module: object
    ids: np.ndarray  # (T,) int64
    table: np.ndarray  # (V, C)
    x: np.ndarray  # (T, C)
    args: tuple[np.ndarray, ...]  # forward's positional inputs: (x,) or (x, x, x)
    kwargs: dict[str, np.ndarray | None] = field(default_factory=dict)
    label: str = ""
    construction: str = ""
    file: str = ""
    # Where x was looked up (file, line): the embed stage shows that line.
    lookup: tuple[str, int] = ("", 0)


def build_blueprint(config: Config, *, einsum: bool = False,
                    init: tuple[tuple[str, object], ...] = ()) -> LoadedNumpy:
    """`--model blueprint` (`blueprint-einsum`): the blueprint's class, built by the same
    rules as a learner's (d_model, n_heads, seed by name; --init), its x and mask."""
    from ..examples.blueprint import MultiHeadAttention, MultiHeadAttentionEinsum

    cls = MultiHeadAttentionEinsum if einsum else MultiHeadAttention
    name = "blueprint-einsum" if einsum else "blueprint"
    return load_learner(config, Source(model=name, init=init), cls, label=name)


def look_up(table: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, tuple[str, int]]:
    """x, the table's rows for ids, and where that happened (file, line): the embed stage
    shows the line that ran."""
    x = table[ids]  # (T, C)
    return x, (__file__, sys._getframe().f_lineno - 1)  # the line above


def _inputs(module: object, config: Config, *, label: str, construction: str) -> LoadedNumpy:
    table = embedding_table(config)
    ids = np.array(config.ids, dtype=np.int64)  # (T,)
    x, lookup = look_up(table, ids)
    args, kwargs = forward_inputs(module, x, causal=config.causal)
    return LoadedNumpy(module=module, ids=ids, table=table, x=x, args=args, kwargs=kwargs,
                       label=label, construction=construction, file=class_file(type(module)),
                       lookup=lookup)


# ---------------------------------------------------------------- a learner's NumPy class


def numpy_class(ref: str) -> type | None:
    """The `--module` class when it is NumPy code, None when it is a torch module.

    The learner's file is imported once (learner.py remembers it, so the torch load room
    does not run it again). A class that is not a torch nn.Module is NumPy code. Refusals
    (no such name, not a class) are made here unless the file defines torch modules, so a
    learner without torch never needs it.
    """
    where, attr, is_file = parse_module_ref(ref)
    module = import_file(where) if is_file else import_name(where)
    torch = sys.modules.get("torch")

    def is_torch(value: object) -> bool:
        return torch is not None and isinstance(value, type) and issubclass(value, torch.nn.Module)

    classes = sorted(name for name, value in vars(module).items()
                     if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__)
    torch_file = any(is_torch(getattr(module, name)) for name in classes)
    shown = shown_path(where) if is_file else where
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            if torch_file:
                return None  # the torch load room names the nn.Module classes there
            there = f"; classes there: {', '.join(classes)}" if classes else "; it defines no class"
            raise LoadError(f"--module {safe(shown)} has no {safe(attr)!r}{there}")
        target = getattr(target, part)
    if is_torch(target) or (not isinstance(target, type) and torch_file):
        return None
    if not isinstance(target, type):
        raise LoadError(f"--module {safe(shown)}:{safe(attr)} is {describe(target)}, not a "
                        "class; name the class (e.g. my_attn.py:MultiHeadAttention)")
    if not callable(getattr(target, "forward", None)) and "__call__" not in _own_attributes(target):
        raise LoadError(f"--module {safe(shown)}:{safe(attr)} is neither an nn.Module subclass "
                        "nor a class with a forward() method (for NumPy code)")
    return target


def _own_attributes(cls: type) -> set[str]:
    """Names defined by the class or its bases, object's own left out."""
    return {name for klass in cls.__mro__ if klass is not object for name in vars(klass)}


def load_learner(config: Config, source: Source, cls: type, label: str = "") -> LoadedNumpy:
    """Build a learner's NumPy class by the same rules as a torch module (and `seed`)."""
    label = label or source.module or cls.__name__
    if source.weights is not None:
        raise LoadError(f"--weights loads a torch state dict; {safe(label)} is NumPy code, "
                        "which makes its own arrays (pass their seed with --init seed=N)")
    init = dict(source.init)
    try:
        takes_seed = "seed" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        takes_seed = False
    if takes_seed and "seed" not in init:
        init["seed"] = config.seed  # the blueprint's convention: the weights' generator seed
    kwargs = constructor_arguments(cls, config, init)
    call = f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    with learner_code(f"building {call}", class_file(cls)):
        module = cls(**kwargs)
    try:
        forward_of(module)
    except TypeError:
        raise LoadError(f"{safe(call)} has neither forward() nor __call__(); mha-tui calls "
                        "module.forward(x, mask)") from None
    loaded = _inputs(module, config, label=label, construction=call)
    _probe(loaded)
    return loaded


def _probe(loaded: LoadedNumpy) -> None:
    """Run a learner's forward once, untraced, to refuse a result that is not an array.
    A forward that raises is not refused: the trace shows every stage up to the failure."""
    try:
        with learner_code("probing", loaded.file), np.errstate(all="ignore"):
            result = forward_of(loaded.module)(*loaded.args, **loaded.kwargs)
    except LoadError:
        return
    first = result[0] if isinstance(result, tuple | list) and result else result
    if not isinstance(first, np.ndarray):
        what = describe(result) if first is result else \
            f"{describe(result)} whose first element is {describe(first)}"
        raise LoadError(f"{type(loaded.module).__name__}.forward returned {what}, not an "
                        "ndarray; mha-tui needs the attention output (an array, or a tuple "
                        "whose first element is one)")


def load(config: Config, source: Source) -> LoadedNumpy | None:
    """The NumPy module for this run, or None when it is a torch module (load.py's job)."""
    numpy_code = source.model in NUMPY_MODEL_NAMES if source.module is None else \
        numpy_class(source.module) is not None
    if numpy_code and config.dtype:
        raise LoadError(f"--dtype {config.dtype} casts a torch module (module.to(dtype)); "
                        f"{safe(source.module or '--model ' + source.model)} is NumPy code")
    if numpy_code and (config.cross or config.batch):
        # NumPy code gets one sentence's x, (T, C), as its only sequence: run with a context
        # or other rows, it would show (and check would judge) self-attention on the sentence.
        given = "--context" if config.cross else "--batch"
        raise LoadError(f"{given} needs a torch module: mha-tui gives NumPy code one sentence's "
                        f"x, (T, C) with no batch axis, and "
                        f"{safe(source.module or '--model ' + source.model)} is NumPy code")
    if source.module is None:
        if source.model not in NUMPY_MODEL_NAMES:
            return None
        if source.weights is not None:
            raise LoadError(f"--weights loads a torch state dict; --model {source.model} is NumPy "
                            "code, which draws its own weights (choose them with --seed)")
        return build_blueprint(config, einsum=source.model == "blueprint-einsum", init=source.init)
    cls = numpy_class(source.module)
    return None if cls is None else load_learner(config, source, cls)


def forward_inputs(module: object, x: np.ndarray, *, causal: bool
                   ) -> tuple[tuple[np.ndarray, ...], dict[str, np.ndarray | None]]:
    """x (or x three times for forward(query, key, value)); `mask`/`attn_mask` gets the
    additive causal mask, or None with --no-causal."""
    try:
        params = list(inspect.signature(forward_of(module)).parameters.values())
    except (TypeError, ValueError):
        return (x,), {}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.name not in MASK_NAMES]
    names = tuple(p.name for p in positional[:3])
    args = (x, x, x) if names in (("query", "key", "value"), ("q", "k", "v")) else (x,)
    kwargs: dict[str, np.ndarray | None] = {}
    for p in params:
        if p.name in MASK_NAMES:
            kwargs[p.name] = causal_mask(x.shape[0]) if causal else None
    return args, kwargs
