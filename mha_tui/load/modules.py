"""The load room: the attention module to explain, and the input its forward gets.

Everything is built in the order a reader of a tutorial builds it: import the module's
file, `torch.manual_seed(seed)`, the token embedding `nn.Embedding(V, C)`, then the
attention module with its constructor arguments filled by name, then (optionally) its
tensors replaced from a weights file, then eval mode. x is the embedding of the sentence's
ids. `--model NAME` is the same path with a file from `mha_tui/examples`.

A learner's code is theirs: it is imported and run, never edited. A weights file is only
read in ways that cannot execute code (`torch.load(weights_only=True)` or safetensors).
Every refusal is a `LoadError` whose message is one line naming the file, the line or the
name at fault. Knows torch; never imports rich, textual or typer.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import re
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from ..config import NUMPY_MODEL_NAMES, Config, Source, parse_module_ref
from .learner import (  # the torch-free half of the load room, shared with numpy_modules
    LoadError,
    class_file,
    constructor_arguments,
    describe,
    import_file,
    import_name,
    learner_code,
    refuse_another_context_width,
    safe,
    shown_path,
)
from .signature import plan


@dataclass(frozen=True)
class Example:
    """A `--model`: a class in mha_tui/examples and the arguments the rules cannot guess."""

    module: str
    cls: str
    fixed: Callable[[Config], dict[str, object]] = lambda config: {}
    # Masks with its own buffer, so --no-causal cannot switch the mask off.
    own_mask: bool = False


EXAMPLES: dict[str, Example] = {
    "mygpt": Example("mha_tui.examples.mygpt", "MultiHeadAttention"),
    "course": Example("mha_tui.examples.course", "MultiHeadAttention"),
    "raschka": Example("mha_tui.examples.raschka", "MultiHeadAttention", own_mask=True),
    # Each head is d_out wide and there is no projection: C // h keeps the output C wide.
    "raschka-wrapper": Example("mha_tui.examples.raschka", "MultiHeadAttentionWrapper",
                               fixed=lambda config: {"d_out": config.head_dim}, own_mask=True),
    # Chapter 4's KV cache (--decode): use_cache=True and reset_cache().
    "raschka-cache": Example("mha_tui.examples.raschka", "CachedMultiHeadAttention", own_mask=True),
    "many-eyes": Example("mha_tui.examples.many_eyes", "MultiHeadAttention", own_mask=True),
    # Cross-attention (--context): queries from the sentence, keys and values from the context.
    "cross": Example("mha_tui.examples.cross", "CrossAttention"),
}


# ---------------------------------------------------------------- what load returns


@dataclass(frozen=True, eq=False)
class LoadedTorch:
    """A built module, its input, and how its forward is called."""

    module: nn.Module
    embedding: nn.Embedding
    ids: torch.Tensor  # (B, T) int64
    x: torch.Tensor  # (B, T, C)
    args: tuple[torch.Tensor, ...]  # forward's positional inputs: (x,) or (x, x, x)
    kwargs: dict[str, torch.Tensor | None] = field(default_factory=dict)  # the mask, by name
    label: str = ""  # "raschka", "my_attn.py:MultiHeadAttention"
    file: str = ""  # the file the module's class is defined in
    construction: str = ""  # the constructor call made, e.g. "MultiHeadAttention(embed_dim=4, ...)"
    weights: str = ""  # --weights: the file the module's tensors were replaced from
    # --context: the keys' and values' sequence (B, T_k, C), embedded with the same table.
    context: torch.Tensor | None = None
    context_ids: torch.Tensor | None = None  # (B, T_k) int64

    def call(self, module: nn.Module, x: torch.Tensor) -> object:
        """How the tracer calls the module: x once or three times (or x and the context), and
        the mask by name; `x` stands where the loader's x stood (the check passes another)."""
        args = tuple(x if arg is self.x else arg for arg in self.args)
        kwargs = {name: x if value is self.x else value for name, value in self.kwargs.items()}
        return module(*args, **kwargs)

    def forward(self) -> torch.Tensor:
        """module(*args, **kwargs), reduced to its output tensor."""
        return output_tensor(self.call(self.module, self.x), self.module)


def output_tensor(result: object, module: nn.Module) -> torch.Tensor:
    """A forward's output: the tensor itself, or the first element of a tuple or list."""
    if isinstance(result, tuple | list) and result:
        result = result[0]
    if not isinstance(result, torch.Tensor):
        raise LoadError(
            f"{type(module).__name__}.forward returned {describe(result)}, not a tensor; "
            "mha-tui needs the attention output (a tensor, or a tuple whose first element is one)"
        )
    return result


# ---------------------------------------------------------------- the one entry point


def load(config: Config, source: Source | None = None) -> LoadedTorch:
    """Import, seed, embed, build, fill weights, eval: the module and x for this run."""
    source = source or Source()
    if source.module is not None:
        cls, label = _learner_class(source.module)
        example = None
    else:
        example = EXAMPLES[source.model]
        cls = getattr(importlib.import_module(example.module), example.cls)
        label = source.model
        if example.own_mask and not config.causal:
            switchable = [name for name, e in EXAMPLES.items() if not e.own_mask]
            raise LoadError(f"--model {source.model} always applies its own causal mask (a buffer "
                            f"in the module); --no-causal works with "
                            f"{', '.join([*switchable, *NUMPY_MODEL_NAMES])} and --module")
    fixed = example.fixed(config) if example else {}
    kwargs = constructor_arguments(cls, config, {**fixed, **dict(source.init)})
    refuse_another_context_width(cls, config, kwargs)

    with torch.no_grad():
        torch.manual_seed(config.seed)
        embedding = nn.Embedding(len(config.vocab), config.embed_dim)
        module = _construct(cls, kwargs)
        if source.weights is not None:
            load_weights(module, source.weights)
        embedding.eval()
        module.eval()
        if config.dtype:  # --dtype: the module and its x in that dtype (module.to(dtype))
            module.to(getattr(torch, config.dtype))
            embedding.to(getattr(torch, config.dtype))
        ids = torch.tensor(config.batch_ids)  # (B, T): row 0 the sentence, then --batch
        x = embedding(ids)  # (B, T, C)
        context_ids = torch.tensor([config.context_ids]) if config.context else None  # (B, T_k)
        context = embedding(context_ids) if context_ids is not None else None  # (B, T_k, C)
    padding = torch.tensor(config.padding) if config.batch else None  # (B, T), True = padding
    args, forward_kwargs = forward_inputs(module, x, causal=config.causal, context=context,
                                          padding=padding)
    loaded = LoadedTorch(module=module, embedding=embedding, ids=ids, x=x, args=args,
                    kwargs=forward_kwargs, label=label, file=class_file(cls),
                    construction=_call_text(cls, kwargs), weights=source.weights or "",
                    context=context, context_ids=context_ids)
    if source.module is not None:
        _probe(loaded)
    return loaded


def on_table(loaded: LoadedTorch, table: object) -> LoadedTorch:
    """The same built module, its x looked up in another embedding table (V, C) for the same
    ids (`explain --against` with a NumPy module: the torch reference reads the NumPy x)."""
    with torch.no_grad():
        weight = torch.tensor(table, dtype=torch.float32)  # (V, C)
        embedding = nn.Embedding.from_pretrained(weight, freeze=True)
        embedding.eval()
        x = embedding(loaded.ids)  # (B, T, C)
        context = embedding(loaded.context_ids) if loaded.context_ids is not None else None
    swap = {id(loaded.x): x, id(loaded.context): context}
    return replace(loaded, embedding=embedding, x=x, context=context,
                   args=tuple(swap.get(id(a), a) for a in loaded.args),
                   kwargs={k: swap.get(id(v), v) for k, v in loaded.kwargs.items()})


def _probe(loaded: LoadedTorch) -> None:
    """Run a learner's forward once, untraced, to refuse a result that is not a tensor.

    A forward that raises is not refused here: the trace shows every stage up to the
    failing line, which is what a learner needs to see.
    """
    try:
        with torch.no_grad(), contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = loaded.call(loaded.module, loaded.x)
    except Exception:
        return
    output_tensor(result, loaded.module)


def _call_text(cls: type, kwargs: Mapping[str, object]) -> str:
    return f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


# ---------------------------------------------------------------- finding the class


def _learner_class(ref: str) -> tuple[type[nn.Module], str]:
    where, attr, is_file = parse_module_ref(ref)
    module = import_file(where) if is_file else import_name(where)
    shown = shown_path(where) if is_file else where
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            classes = sorted(name for name, value in vars(module).items()
                             if isinstance(value, type) and issubclass(value, nn.Module)
                             and getattr(value, "__module__", None) == module.__name__)
            there = f"; nn.Module classes there: {', '.join(classes)}" if classes else \
                "; it defines no nn.Module class"
            raise LoadError(f"--module {safe(shown)} has no {safe(attr)!r}{there}")
        target = getattr(target, part)
    if not (isinstance(target, type) and issubclass(target, nn.Module)):
        what = "an nn.Module instance" if isinstance(target, nn.Module) else describe(target)
        raise LoadError(f"--module {safe(shown)}:{safe(attr)} is {what}, not an nn.Module "
                        "subclass; name the class (e.g. my_attn.py:MultiHeadAttention)")
    return target, f"{shown}:{attr}"


# ---------------------------------------------------------------- construction


def _construct(cls: type[nn.Module], kwargs: dict[str, object]) -> nn.Module:
    file = class_file(cls)
    call = _call_text(cls, kwargs)
    with learner_code(f"building {call}", file):
        module = cls(**kwargs)
    if not isinstance(module, nn.Module):  # a __new__ that returns something else
        raise LoadError(f"{call} returned {describe(module)}, not an nn.Module")
    return module


# ---------------------------------------------------------------- forward's inputs


def causal_mask(T: int) -> torch.Tensor:
    """(T, T) booleans, True where a token may not look (the masked_fill convention)."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)


def forward_inputs(module: nn.Module, x: torch.Tensor, *, causal: bool,
                   context: torch.Tensor | None = None, padding: torch.Tensor | None = None
                   ) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor | None]]:
    """What forward is called with, read from its signature (`load.signature.plan`): x, or
    x three times for (query, key, value); with a context (cross-attention) the keys and
    values from it. A parameter named mask or attn_mask gets the causal mask (None with
    --no-causal, and across two sequences). padding: (B, T) True where a row is padded
    (`--batch`), given as the module's padding parameter takes it."""
    call = plan(module.forward, f"{type(module).__name__}.forward", causal=causal,
                context=context is not None, padding=padding is not None)
    mask = causal_mask(x.shape[1]) if causal and context is None else None
    inputs: dict[str, object] = {"x": x, "context": context, "mask": mask,
                                 # a cache the module keeps, filled from position 0
                                 "start": 0, "positions": torch.arange(x.shape[1])}
    if padding is not None:
        blocked = padding[:, None, None, :]  # (B, 1, 1, T): a padded key, for every query
        inputs.update(keep=(~padding).long(),  # (B, T): 1 = a token, 0 = padding (Hugging Face)
                      pad=padding,  # (B, T): True = padding (torch's key_padding_mask)
                      **{"mask+pad": blocked | mask if mask is not None else blocked})  # (B, 1, T, T)
    args, kwargs = call.build(inputs)
    return args, kwargs  # type: ignore[return-value]


# ---------------------------------------------------------------- weights


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """A state dict from FILE, read without executing anything in it."""
    shown = safe(shown_path(path))
    file = Path(path).expanduser()
    if not file.is_file():
        raise LoadError(f"--weights {shown} {'is a folder' if file.is_dir() else 'does not exist'}")
    if file.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            data: object = load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError) as error:
            raise LoadError(f"--weights {shown} is not a readable .safetensors file: "
                            f"{safe(str(error))}") from None
    else:
        with file.open("rb") as head:
            magic = head.read(4)
        # torch.save writes a zip archive (or, before torch 1.6, a pickle: protocol 2 opens 0x80).
        if magic != b"PK\x03\x04" and magic[:1] != b"\x80":
            raise LoadError(f"--weights {shown} is neither a torch.save file nor a .safetensors file")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                data = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as error:  # the unpickler's refusals come as several types
            raise LoadError(_weights_refusal(shown, error)) from None
    return _state_dict(shown, data)


def _weights_refusal(shown: str, error: Exception) -> str:
    text = str(error)
    only = "refused: a weights file may hold only tensors (save model.state_dict(), or use .safetensors)"
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return f"--weights {shown} would run code when loaded (it calls {safe(found.group(1))}); {only}"
    if "Weights only load failed" in text:
        detail = re.search(r"WeightsUnpickler error:\s*(.+?)\n\n", text, re.S)
        why = f" ({safe(detail.group(1))})" if detail else ""
        return f"--weights {shown} cannot be read without risking running code{why}; {only}"
    return f"--weights {shown} is not a state dict torch.load can read: {safe(text)}"


def _state_dict(shown: str, data: object) -> dict[str, torch.Tensor]:
    if isinstance(data, Mapping) and not all(isinstance(v, torch.Tensor) for v in data.values()):
        # A training checkpoint: the module's tensors are one entry among others.
        for key in ("state_dict", "model_state_dict", "model"):
            inner = data.get(key)
            if isinstance(inner, Mapping) and inner and \
                    all(isinstance(v, torch.Tensor) for v in inner.values()):
                data = inner
                break
    if not isinstance(data, Mapping):
        raise LoadError(f"--weights {shown} holds {describe(data)}, not a state dict "
                        "(save model.state_dict())")
    for key, value in data.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise LoadError(f"--weights {shown}: entry {safe(repr(key))} is {describe(value)}, "
                            "not a tensor")
    return dict(data)


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(map(str, t.shape)) + ("," if t.dim() == 1 else "") + ")"


def load_weights(module: nn.Module, path: str) -> None:
    """Replace the module's parameters and buffers by the file's; refuse the first misfit."""
    shown = safe(shown_path(path))
    state = read_weights(path)
    expected = module.state_dict()
    what = type(module).__name__
    for key, tensor in expected.items():
        if key not in state:
            raise LoadError(f"--weights {shown} has no {key!r}, which {what} has "
                            f"({len(expected)} tensors in the module, {len(state)} in the file)")
        if state[key].shape != tensor.shape:
            raise LoadError(f"--weights {shown}: {key!r} is {_shape(state[key])} in the file but "
                            f"{_shape(tensor)} in {what} (check --embed-dim, --heads and --init)")
        if state[key].is_floating_point() != tensor.is_floating_point():
            raise LoadError(f"--weights {shown}: {key!r} is {state[key].dtype} in the file but "
                            f"{tensor.dtype} in {what}")
    for key in state:
        if key not in expected:
            raise LoadError(f"--weights {shown} has {safe(repr(key))}, which {what} does not have")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise LoadError(f"--weights {shown}: {safe(str(error))}") from None
