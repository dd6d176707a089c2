"""A learner's code, imported and run safely: the part of the load room that needs no torch.

Shared by the torch load room (`modules.py`) and the NumPy one (`numpy_modules.py`), so that a
NumPy learner's module is found, built and refused with the same one-line messages without
torch ever being imported. A learner's code is theirs: it is imported and run, never
edited; its prints go to stderr; its exceptions become one `LoadError` line naming the file
and line at fault. Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
import unicodedata
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType, TracebackType

from .. import collector
from ..config import Config


class LoadError(ValueError):
    """The module or its weights cannot be used; the message is one line for stderr."""


# ---------------------------------------------------------------- constructor arguments

# The one table of constructor parameters filled by name: what each is given, and the names
# public attention code uses for it (tutorials, nanoGPT and minGPT, Whisper's n_state,
# open_clip's width, lucidrains' dim / heads / dim_head, d2l's num_hiddens, the Annotated
# Transformer's h, diffusers' query_dim, torch's nhead, Hugging Face's config names). Filled
# whatever default they have (except AUTHORS_DEFAULT); every other parameter keeps its
# default or needs --init NAME=VALUE.
FILLED_BY_NAME: dict[str, tuple[str, ...]] = {
    "C": ("embed_dim", "d_model", "d_in", "d_out", "n_embd", "n_embed", "dim", "hidden_size",
          "n_state", "width", "embed_size", "emb_dim", "d_embed", "embedding_dim",
          "hidden_dim", "model_dim", "dim_model", "num_hiddens", "query_dim", "features",
          "qkv_features"),
    "h": ("num_heads", "n_heads", "n_head", "num_attention_heads", "heads", "nhead", "nheads",
          "num_head", "head_num", "h"),
    "d_h": ("head_dim", "dim_head", "d_head", "head_size", "d_k", "dim_per_head"),
    # Hugging Face's grouped-query count: as many K/V heads as query heads (plain multi-head
    # attention) where the class has no default of its own.
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_kv_head"),
    # --max-seq-len: a cache's or a mask buffer's length (the module's own default kept for
    # the others: a KV cache's max_seq_length sizes what --decode shows).
    "max_seq_len": ("max_seq_len", "context_length", "block_size"),
    "dropout": ("dropout", "attention_dropout", "attn_dropout", "attn_pdrop", "dropout_rate",
                "attention_probs_dropout_prob", "attn_drop", "dropout_p"),
}
EMBED_NAMES = FILLED_BY_NAME["C"]
HEAD_NAMES = FILLED_BY_NAME["h"]
KV_HEAD_NAMES = FILLED_BY_NAME["kv_heads"]
LENGTH_NAMES = FILLED_BY_NAME["max_seq_len"]
# The Annotated Transformer's and nn.Transformer's names too: src_mask (the source's padding,
# read by the decoder's source attention), tgt_mask (the target's causal mask), memory_mask.
MASK_NAMES = ("mask", "attn_mask", "src_mask", "tgt_mask", "memory_mask")
# A parameter that holds a whole configuration (nanoGPT's `config`, Meta's `args`): --init
# gives Python literals only, so the way in is a subclass that builds that object.
CONFIG_NAMES = ("config", "cfg", "conf", "args", "model_args", "params")
_LITERAL_TYPES = (int, float, complex, bool, str, bytes, tuple, list, dict, set, type(None))


def filled_by_name(config: Config) -> dict[str, object]:
    """What each well-known constructor parameter gets for this run."""
    given = {"C": config.embed_dim, "h": config.num_heads,
             "d_h": config.embed_dim // max(1, config.num_heads), "kv_heads": config.num_heads,
             "max_seq_len": config.max_seq_len, "dropout": 0.0}
    values: dict[str, object] = {name: given[what] for what, names in FILLED_BY_NAME.items()
                                 for name in names}
    values.update(batch_first=True, causal=config.causal)
    return values


# Filled only when the class gives no default: a module is run as its author builds it. A
# class default `dropout=0.1` handed to F.scaled_dot_product_attention(dropout_p=...) drops
# weights in eval mode too: filling 0.0 over it would hide that bug (issue 27).
AUTHORS_DEFAULT = frozenset({*FILLED_BY_NAME["dropout"], *KV_HEAD_NAMES})


def describe(value: object) -> str:
    if value is None:
        return "None"
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


# ---------------------------------------------------------------- finding the class


def shown_path(path: str) -> str:
    """A path as the user sees it: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


_IMPORTED: dict[str, ModuleType] = {}


def import_file(where: str) -> ModuleType:
    """Execute a learner's .py file as a fresh module, as `python FILE` would see it.

    It is registered under a private name (never its own stem: a file called json.py must
    not shadow json), and its folder is on sys.path only while it runs, so that it can
    import its neighbours.
    """
    path = Path(where).expanduser()
    shown = shown_path(where)
    if not path.is_file():
        reason = "is a folder" if path.is_dir() else "does not exist"
        raise LoadError(f"--module {safe(shown)} {reason}; give a .py file and a class, "
                        "e.g. my_attn.py:MultiHeadAttention")
    path = path.resolve()
    if str(path) in _IMPORTED:  # already run once in this process: never run it twice
        return _IMPORTED[str(path)]
    # One name per file: two files of one stem (unsound/alibi.py, mechanisms/alibi.py) must
    # not share a sys.modules entry, or inspect finds the other file's source for a class.
    digest = hashlib.sha1(str(path).encode("utf-8", "surrogateescape")).hexdigest()[:8]
    name = "_mha_tui_learner_." + re.sub(r"\W", "_", path.stem) + "_" + digest
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"--module {safe(shown)} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and typing look their module up by name
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        with learner_code(f"importing {shown}", str(path)):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
    _IMPORTED[str(path)] = module
    return module


def import_name(where: str) -> ModuleType:
    try:
        spec = importlib.util.find_spec(where)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        hint = f"; did you mean {where}.py:...?" if Path(f"{where}.py").is_file() else ""
        raise LoadError(f"--module: no module named {where!r} in this Python environment{hint}")
    with learner_code(f"importing {where}", spec.origin or where):
        return importlib.import_module(where)


def class_file(cls: type) -> str:
    try:
        return inspect.getsourcefile(cls) or ""
    except TypeError:
        return ""


# ---------------------------------------------------------------- learner code, run safely


@contextlib.contextmanager
def learner_code(doing: str, file: str) -> Iterator[None]:
    """Run a learner's code: its exceptions become one line naming their file and line.

    Its prints go to stderr, so that a transcript on stdout stays a transcript. It runs
    with the garbage collector on: if the app's start paused it, everything alive now is
    the start-up's and is frozen out of the collector's passes (collector.py).
    """
    collector.resume(freeze=True)
    try:
        with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    except LoadError:
        raise
    except SyntaxError as error:
        where = shown_path(error.filename or file)
        raise LoadError(f"{safe(where)}, line {error.lineno}: SyntaxError: "
                        f"{safe(error.msg)} (while {safe(doing)})") from None
    except (Exception, SystemExit) as error:
        raise LoadError(f"{_at(error.__traceback__, file)}{type(error).__name__}: "
                        f"{safe(str(error)) or '(no message)'} (while {safe(doing)})") from None


def _at(tb: TracebackType | None, file: str) -> str:
    """'my_attn.py, line 12: ' for the innermost frame in `file` (else the innermost)."""
    frames = traceback.extract_tb(tb)
    if not frames:
        return ""
    mine = [f for f in frames if os.path.realpath(f.filename) == os.path.realpath(file)]
    frame = (mine or frames)[-1]
    return f"{safe(shown_path(frame.filename))}, line {frame.lineno}: "


def safe(text: str, limit: int = 300) -> str:
    """Learner text for one stderr line: whitespace runs made single spaces, controls
    made visible, long text cut."""
    text = " ".join(text.split())
    out = "".join(
        repr(ch)[1:-1] if unicodedata.category(ch) in ("Cc", "Cf", "Cs") else ch for ch in text
    )
    return out if len(out) <= limit else out[: limit - 1] + "…"


# The constructor arguments that set the width of cross-attention's second sequence
# (CompVis' and lucidrains' context_dim, diffusers' cross_attention_dim, torch's and fairseq's
# kdim/vdim, encoder widths): --context is embedded at C, the sentence's width.
CONTEXT_WIDTH_NAMES = ("context_dim", "cross_attention_dim", "kdim", "vdim", "encoder_dim",
                       "encoder_hidden_size")


def refuse_another_context_width(cls: type, config: Config, kwargs: Mapping[str, object]) -> None:
    """--context with a module built to read a context of another width (given by --init or
    its author's default): refused in one line, before its forward fails inside a product."""
    if not config.cross:
        return
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return
    for name in CONTEXT_WIDTH_NAMES:
        value = kwargs.get(name, params[name].default if name in params else None)
        if isinstance(value, int) and not isinstance(value, bool) and value != config.embed_dim:
            C = config.embed_dim
            raise LoadError(f"--context is embedded at the sentence's width C = {C}; "
                            f"{cls.__name__}({name}={value}) reads a context {value} wide, which "
                            f"mha-tui does not build yet: --init {name}={C} (or --embed-dim "
                            f"{value} if that is also the sentence's width)")


def constructor_arguments(cls: type, config: Config, init: Mapping[str, object]) -> dict[str, object]:
    """The keyword arguments cls(...) gets: --init first, then the by-name rules; every
    other parameter keeps its default. A required one left over is refused."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    by_name = filled_by_name(config)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for name in init:
        if name not in named and not takes_any:
            raise LoadError(f"--init {name}: {cls.__name__}() has no parameter {name!r}; "
                            f"it takes: {', '.join(named) or 'nothing'}")
    kwargs: dict[str, object] = {}
    missing: list[inspect.Parameter] = []
    for name, param in params.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in init:
            if name in HEAD_NAMES and init[name] != config.num_heads:
                # The header, the stages' head labels and check's reference count --heads.
                raise LoadError(f"--init {name}={init[name]!r} disagrees with --heads "
                                f"{config.num_heads}: give --heads {init[name]!r} instead")
            kwargs[name] = init[name]
        elif name in by_name and not (name in AUTHORS_DEFAULT and param.default is not param.empty):
            kwargs[name] = by_name[name]
        elif param.default is param.empty:
            missing.append(param)  # every one named at once, after the loop
        if param.kind is param.POSITIONAL_ONLY and name in kwargs:
            raise LoadError(f"{cls.__name__}() takes {name!r} as positional-only; mha-tui "
                            "passes constructor arguments by name")
    if len(missing) == 1:
        raise LoadError(_needs_a_value(cls, missing[0].name, missing[0]))
    if missing:
        names = [p.name for p in missing]
        said = ", ".join(repr(n) for n in names[:-1]) + f" and {names[-1]!r}"
        raise LoadError(f"{cls.__name__}() needs values for {said}, which mha-tui cannot "
                        f"guess; give them with {' '.join(f'--init {n}=VALUE' for n in names)}")
    kwargs.update((k, v) for k, v in init.items() if k not in kwargs)  # into **kwargs
    return kwargs


def _needs_a_value(cls: type, name: str, param: inspect.Parameter) -> str:
    """The refusal for a required parameter no rule fills, with a way out that works."""
    cls_name = cls.__name__
    annotation = param.annotation
    if isinstance(annotation, str):  # `from __future__ import annotations` in the learner's file
        try:
            annotation = inspect.signature(cls, eval_str=True).parameters[name].annotation
        except Exception:  # an annotation that does not evaluate: no type known
            annotation = param.empty
    is_object = name in CONFIG_NAMES or (
        isinstance(annotation, type) and annotation is not param.empty
        and annotation not in _LITERAL_TYPES)
    if not is_object:
        return (f"{cls_name}() needs a value for {name!r}, which mha-tui cannot guess; give it "
                f"with --init {name}=VALUE")
    return (f"{cls_name}() needs {name!r}, an object: give it with --init "
            f"'{name}={{\"key\": VALUE}}' if the class reads {name}[\"key\"] (a dict), or run a "
            f"subclass whose __init__(self, embed_dim, num_heads) builds the {name} and calls "
            f"super().__init__({name})")


def forward_of(module: object) -> Callable[..., object]:
    """What runs a NumPy module: its `forward` (the blueprint's API), else the object itself.
    The loader probes a module with it and the NumPy tracer records through it."""
    forward = getattr(module, "forward", None)
    if callable(forward):
        return forward
    if callable(module):
        return module  # type: ignore[return-value]
    raise TypeError(f"{type(module).__name__} has neither forward() nor __call__()")
