"""`--hf`: a Hugging Face causal language model and its tokenizer, from disk, run once.

Finds the model in a local directory or in the local Hugging Face cache, loads it with
`transformers` in eval mode with the eager attention implementation (so the attention
weights exist as tensors), runs the model's own forward on the tokenised sentence, and
captures, with forward hooks, where each attention layer's input comes from: the token and
position embeddings, the residual stream entering the block, the layer norm's output.
Every tensor shown is the model's own; the few checks that recompute something to compare
(a lookup, a sum, the layer norm) say so in their label.

Must never download: `local_files_only=True` everywhere, and the hub's offline switches are
set before `transformers` is imported. Must never load weights in a way that can execute
code: safetensors, or `torch.load(weights_only=True)`, and never a model's own remote code.
Imported only for `--hf`; `transformers` is the optional extra `mha-tui[hf]`.
Never import rich, textual or typer here.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import MAX_SEQ_LEN, Config, ModelSource
from .records import Check, ModuleInfo, Recorded, Recording, Source, Stage, TensorRecord, Trace

INSTALL_HINT = 'pip install "mha-tui[hf]"'
# Where a block keeps its self-attention, across the families transformers ships
# (GPT-2 and GPT-J: attn; Llama, OPT, Mistral: self_attn; GPT-NeoX: attention; Falcon,
# Bloom: self_attention).
ATTENTION_NAMES = ("attn", "self_attn", "attention", "self_attention")
SPACE_MARK = "\u2423"  # ␣, the visible space
ASCII_SPACE_MARK = "_"
# Every layer's stages are recorded in the one forward pass while the copies the tracer
# keeps stay below this many bytes (estimated from the model's sizes: see all_layers_limit).
ALL_LAYERS_BUDGET = 256 * 2**20
# What one recorded GPT-2 attention layer keeps, measured: about 7 (h, T, T) maps (raw,
# scaled and masked scores, softmax, its cast, dropout, and one more) and 24 (T, C)-sized
# tensors (the fused projection counts 3, its split 3, views, transposes, heads, c_proj),
# float32 each.
MAPS_PER_LAYER = 7
CHANNEL_TENSORS_PER_LAYER = 24
_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model", "vocab.txt")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


class HfError(ValueError):
    """A model, tokenizer or layer mha-tui cannot use; the message is one line for the learner."""


def _offline() -> None:
    """Tell the hub libraries, before they are imported, that there is no network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _transformers() -> Any:
    _offline()
    try:
        import transformers
    except ImportError:
        raise HfError(f"--hf needs Hugging Face transformers, which is not installed: "
                      f"{INSTALL_HINT}") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


# ---------------------------------------------------------------- where the model is


def hub_cache() -> Path:
    """The hub's cache folder, read from the environment now, in the hub's documented order."""
    env = os.environ
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(os.path.expandvars(env[name])).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def _cached_snapshot(cache: Path, repo_id: str) -> Path | None:
    """snapshots/<refs/main> of one cached model repo, as the hub lays it out, if complete."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if not ref.is_file():
        return None
    snapshot = repo / "snapshots" / ref.read_text(encoding="utf-8").strip()
    return snapshot if (snapshot / "config.json").is_file() else None


def locate(source: str) -> Path:
    """A model directory: source itself, or its snapshot in the local Hugging Face cache."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise HfError(f"--hf {source} is a file; give a model directory (with config.json) "
                      f"or a model name from the Hugging Face cache, e.g. gpt2")
    cache = hub_cache()
    if _REPO_ID.match(source):
        found = _cached_snapshot(cache, source)
        if found is None and "/" not in source and cache.is_dir():
            # `gpt2` is cached as openai-community/gpt2 when fetched under its current name.
            owners = sorted(cache.glob(f"models--*--{source}"))
            snapshots = [s for s in (_cached_snapshot(cache, o.name[len("models--"):].replace("--", "/"))
                                     for o in owners) if s is not None]
            found = snapshots[0] if len(snapshots) == 1 else None
        if found is not None:
            return found
    fetch = source if _REPO_ID.match(source) else "ORG/NAME"
    raise HfError(f"--hf {source}: no such directory and not in the Hugging Face cache at {cache}; "
                  f"mha-tui never downloads: fetch it once with `hf download {fetch}` "
                  f"(or pass a directory made by save_pretrained)")


# ---------------------------------------------------------------- the loaded model


@dataclass(frozen=True)
class ModelInfo:
    """What the header says about the model."""

    name: str
    path: str
    class_name: str
    n_layers: int
    embed_dim: int
    num_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int | None
    # Numbers in one layer's attention parameters (the recorder keeps a float32 copy of each
    # per recorded layer); None: estimated as a GPT-2 layer's, 4 C x C weights and 4 C biases.
    attention_params: int | None = None


@dataclass(eq=False)
class Loaded:
    """A causal LM in eval mode with its tokenizer and the path to every layer's attention."""

    model: nn.Module
    tokenizer: Any
    info: ModelInfo
    blocks_path: str
    attention_name: str
    blocks: Sequence[nn.Module] = field(repr=False)

    def attention(self, layer: int) -> nn.Module:
        return getattr(self.blocks[layer], self.attention_name)

    def attention_path(self, layer: int) -> str:
        return f"{self.blocks_path}.{layer}.{self.attention_name}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _find_blocks(model: nn.Module, n_layers: int) -> tuple[str, nn.ModuleList, str] | None:
    """The model's list of layers and the name of the self-attention inside each."""
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) != n_layers or not n_layers:
            continue
        for name in ATTENTION_NAMES:
            if all(isinstance(getattr(block, name, None), nn.Module) for block in module):
                return path, module, name
        names = [child for child, sub in module[0].named_children()
                 if type(sub).__name__.endswith("Attention") and "cross" not in child.lower()]
        if len(names) == 1 and all(isinstance(getattr(b, names[0], None), nn.Module) for b in module):
            return path, module, names[0]
    return None


def load(source: str, sentence: str | None = None) -> Loaded:
    """Find, check and load the model and tokenizer; every refusal is an HfError.

    sentence: when given, it is tokenized and refused if it has more tokens than the
    model's config.json says the model reads, before any weight is loaded.
    """
    transformers = _transformers()
    path = locate(source)
    if not (path / "config.json").is_file():
        raise HfError(f"--hf {source}: {path} has no config.json; give a directory made by "
                      f"save_pretrained (or `hf download`)")
    if not any(next(path.glob(pattern), None) for pattern in _TOKENIZER_FILES):
        raise HfError(f"--hf {source}: {path} has no tokenizer (tokenizer.json, or vocab.json and "
                      f"merges.txt); save it beside the model with tokenizer.save_pretrained")
    if not any(next(path.glob(pattern), None) for pattern in _WEIGHT_FILES):
        raise HfError(f"--hf {source}: {path} has no weights (model.safetensors or "
                      f"pytorch_model.bin)")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=False)
    except Exception as error:
        raise HfError(f"--hf {source}: could not load the tokenizer in {path}: "
                      f"{_first_line(error)}") from None
    if sentence is not None:
        _refuse_too_long(source, path, tokenizer, sentence)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, trust_remote_code=False, weights_only=True,
            attn_implementation="eager", dtype=torch.float32,
        )
    except Exception as error:  # transformers raises many kinds; the learner gets one line
        raise HfError(f"--hf {source}: could not load a causal language model from {path}: "
                      f"{_first_line(error)}") from None
    model.eval()
    config = model.config
    n_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    found = _find_blocks(model, n_layers)
    if found is None:
        raise HfError(f"--hf {source}: {type(model).__name__} has no recognisable self-attention "
                      f"submodule in its layers (looked for {', '.join(ATTENTION_NAMES)}); "
                      f"mha-tui explains attention models such as GPT-2")
    blocks_path, blocks, attention_name = found
    embed_dim = int(config.hidden_size)
    num_heads = int(config.num_attention_heads)
    attention = getattr(blocks[0], attention_name)
    info = ModelInfo(
        name=source, path=str(path), class_name=type(model).__name__, n_layers=n_layers,
        embed_dim=embed_dim, num_heads=num_heads,
        head_dim=int(getattr(attention, "head_dim", embed_dim // num_heads)),
        vocab_size=int(config.vocab_size),
        max_positions=getattr(config, "max_position_embeddings", None),
        attention_params=sum(p.numel() for p in attention.parameters()),
    )
    return Loaded(model=model, tokenizer=tokenizer, info=info, blocks_path=blocks_path,
                  attention_name=attention_name, blocks=blocks)


def _refuse_too_long(source: str, path: Path, tokenizer: Any, sentence: str) -> None:
    """More tokens than config.json's max_position_embeddings (n_positions): refused from
    the tokenizer and the config alone, before the weights load."""
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(
            path, local_files_only=True, trust_remote_code=False)
    except Exception as error:
        raise HfError(f"--hf {source}: could not read {path / 'config.json'}: "
                      f"{_first_line(error)}") from None
    limit = getattr(config, "max_position_embeddings", None)
    n = len(tokenizer(sentence, add_special_tokens=True)["input_ids"])
    if limit is not None and n > limit:
        raise HfError(f"the sentence has {n} tokens but {source} reads at most {limit}")


def check_layer(loaded: Loaded, layer: int) -> None:
    n = loaded.info.n_layers
    if not 0 <= layer < n:
        raise HfError(f"--layer {layer} is out of range: {loaded.info.name} has {n} layers, "
                      f"0 to {n - 1}")


def recorded_bytes(info: ModelInfo, T: int, layers: int | None = None) -> int:
    """About how many bytes the tracer keeps for `layers` layers on a T-token sentence: each
    layer's recorded activations and its copy of the layer's parameters, float32."""
    C = info.embed_dim
    params = info.attention_params if info.attention_params is not None else 4 * C * C + 4 * C
    per_layer = 4 * (MAPS_PER_LAYER * info.num_heads * T * T
                     + CHANNEL_TENSORS_PER_LAYER * C * T + params)
    return (info.n_layers if layers is None else layers) * per_layer


def all_layers_limit(info: ModelInfo, budget: int = ALL_LAYERS_BUDGET) -> int:
    """The longest sentence (in tokens) for which every layer is recorded in one pass.

    Memory grows with layers * (h * T^2 + C * T); beyond this length only the layer shown
    is recorded, and moving to another layer runs the forward again.
    """
    T = 1
    while recorded_bytes(info, T + 1) <= budget:
        T += 1
    return T


# ---------------------------------------------------------------- tokens


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as one printable character (its published map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_OF = {char: byte for byte, char in _bytes_to_unicode().items()}


def _is_byte_level(tokenizer: Any) -> bool:
    from tokenizers import decoders

    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return isinstance(decoder, decoders.ByteLevel)


def readable_token(piece: str, *, byte_level: bool, ascii_only: bool = False) -> str:
    """A tokenizer's piece as a learner reads it: `Ġcat` -> `␣cat`, bytes decoded to text.

    A byte-level piece that holds part of a character (an emoji cut in two) keeps the bytes
    that do not form text as `\\xNN`. Spaces become a visible mark; other control characters
    are left for render.printable to make visible.
    """
    text = piece
    if byte_level and piece and all(char in _BYTE_OF for char in piece):
        text = bytes(_BYTE_OF[char] for char in piece).decode("utf-8", "backslashreplace")
    elif "\u2581" in piece:  # SentencePiece's word-start mark
        text = piece.replace("\u2581", " ")
    return text.replace(" ", ASCII_SPACE_MARK if ascii_only else SPACE_MARK)


def tokenize(loaded: Loaded, sentence: str, *, ascii_only: bool = False
             ) -> tuple[list[int], tuple[str, ...]]:
    """The tokenizer's ids for the sentence and each piece made readable."""
    tokenizer = loaded.tokenizer
    ids = list(tokenizer(sentence, add_special_tokens=True)["input_ids"])
    if not ids:
        raise HfError("the sentence gives no tokens; give at least one word, e.g. \"The cat sat\"")
    limit = loaded.info.max_positions
    if limit is not None and len(ids) > limit:
        raise HfError(f"the sentence has {len(ids)} tokens but {loaded.info.name} reads at most "
                      f"{limit}")
    byte_level = _is_byte_level(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(ids)
    return ids, tuple(readable_token(str(p), byte_level=byte_level, ascii_only=ascii_only)
                      for p in pieces)


# ---------------------------------------------------------------- one forward, hooked


@dataclass(frozen=True)
class Line:
    """A statement of the model's own code that called a submodule: file, line, text."""

    file: str
    line: int
    text: str


_TORCH_DIR = os.path.dirname(torch.__file__)


def _caller() -> Line:
    """The first frame outside torch: the model's line that called the hooked module."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None:
        return Line("", 0, "")
    file, line = frame.f_code.co_filename, frame.f_lineno
    return Line(file, line, linecache.getline(file, line).strip())


@dataclass(eq=False)
class LayerInput:
    """Where one attention layer's input came from, as the model computed it (no grad)."""

    residual: torch.Tensor  # (B, T, C) the residual stream entering the block
    residual_line: Line  # the model's line that called the block
    attention_input: torch.Tensor  # (B, T, C) what the attention module received
    norm_name: str | None  # the block's layer norm whose output that is
    norm: nn.Module | None
    norm_line: Line | None
    attention_line: Line  # the block's line that called the attention module
    output: torch.Tensor  # (B, T, C) the attention module's own output
    weights: torch.Tensor | None  # (B, h, T, T) the attention weights it returned


@dataclass(eq=False)
class ForwardRun:
    """The model's own forward on the ids, and what the hooks saw."""

    ids: torch.Tensor  # (B, T)
    token_embeddings: torch.Tensor  # (B, T, C)
    token_line: Line
    token_name: str
    position_embeddings: torch.Tensor | None  # (B, T, C), None when positions are rotary
    position_line: Line | None
    position_name: str | None
    embedded: torch.Tensor  # (B, T, C) what entered the first block
    embedded_line: Line
    layers: dict[int, LayerInput]
    value: Any = None  # what the model's forward returned


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    value = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(value, torch.Tensor):
        raise HfError("the attention layer was not called with a hidden-states tensor; "
                      "mha-tui cannot explain this model")
    return value


def _position_embedding(loaded: Loaded) -> tuple[str, nn.Module] | None:
    for path, module in loaded.model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        if isinstance(module, nn.Embedding) and leaf in ("wpe", "embed_positions",
                                                          "position_embeddings"):
            return path, module
    return None


def _module_path(model: nn.Module, target: nn.Module) -> str:
    return next((path for path, module in model.named_modules() if module is target), "")


def run_forward(loaded: Loaded, ids: Sequence[int], layers: Sequence[int],
                around: Callable[[Callable[[], Any]], Any] | None = None) -> ForwardRun:
    """Run the model's own forward once; hooks keep every named layer's input and output.

    around(call) runs call() (the model's forward) and may watch it (the tracer): the model
    is never run twice. Hooks only keep references to the tensors the model made.
    """
    model = loaded.model
    seen: dict[str, tuple[Any, Line]] = {}
    handles = []

    def after(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            seen.setdefault(key, (output, _caller()))
        return hook

    def before(key: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen.setdefault(key, (_hidden(args, kwargs), _caller()))
        return hook

    token_module = model.get_input_embeddings()
    handles.append(token_module.register_forward_hook(after("tokens")))
    positions = _position_embedding(loaded)
    if positions is not None:
        handles.append(positions[1].register_forward_hook(after("positions")))
    handles.append(loaded.blocks[0].register_forward_pre_hook(before("embedded"), with_kwargs=True))
    norms: dict[int, list[tuple[str, nn.Module]]] = {}
    for layer in layers:
        block = loaded.blocks[layer]
        attention = loaded.attention(layer)
        handles.append(block.register_forward_pre_hook(before(f"residual{layer}"), with_kwargs=True))
        handles.append(attention.register_forward_pre_hook(before(f"input{layer}"), with_kwargs=True))
        handles.append(attention.register_forward_hook(after(f"output{layer}")))
        norms[layer] = [(name, child) for name, child in block.named_children()
                        if "norm" in type(child).__name__.lower() or name.startswith("ln")]
        for name, child in norms[layer]:
            handles.append(child.register_forward_hook(after(f"norm{layer}.{name}")))
    batch = torch.tensor([list(ids)])  # (B, T)

    def call() -> Any:
        return model(input_ids=batch, use_cache=False)

    try:
        with torch.no_grad():
            value = call() if around is None else around(call)
    finally:
        for handle in handles:
            handle.remove()

    run_layers = {}
    for layer in layers:
        attention_input, attention_line = seen[f"input{layer}"]
        norm_name, norm, norm_line = None, None, None
        for name, child in norms[layer]:
            output, line = seen.get(f"norm{layer}.{name}", (None, None))
            if output is attention_input:
                norm_name, norm, norm_line = name, child, line
        output = seen[f"output{layer}"][0]
        out, weights = (output[0], output[1] if len(output) > 1 else None) if isinstance(
            output, tuple) else (output, None)
        run_layers[layer] = LayerInput(
            residual=seen[f"residual{layer}"][0], residual_line=seen[f"residual{layer}"][1],
            attention_input=attention_input, norm_name=norm_name, norm=norm, norm_line=norm_line,
            attention_line=attention_line, output=out,
            weights=weights if isinstance(weights, torch.Tensor) else None)
    position = seen.get("positions")
    return ForwardRun(
        ids=batch, token_embeddings=seen["tokens"][0], token_line=seen["tokens"][1],
        token_name=_module_path(model, token_module),
        position_embeddings=None if position is None else position[0],
        position_line=None if position is None else position[1],
        position_name=None if positions is None else positions[0],
        embedded=seen["embedded"][0], embedded_line=seen["embedded"][1], layers=run_layers,
        value=value,
    )


# ---------------------------------------------------------------- the first stage


def _record(name: str, t: torch.Tensor, dims: tuple[str, ...], *, kind: str = "signed",
            caption: str = "", source: tuple[str, torch.Tensor] | None = None) -> TensorRecord:
    """A window onto the model's own tensor (no copy, no recomputation)."""
    t = t.detach()
    return TensorRecord(
        name=name, dims=dims, values=t.numpy(), strides=tuple(t.stride()),
        contiguous=t.is_contiguous(),
        shares_storage=None if source is None else (
            t.untyped_storage().data_ptr() == source[1].untyped_storage().data_ptr()),
        shares_with=source[0] if source else "", kind=kind,  # type: ignore[arg-type]
        caption=caption,
    )


def _code(*lines: Line | None) -> str:
    """The model's own lines, each with the file and line number it was read from."""
    shown = [line for line in lines if line is not None and line.text]
    width = max((len(line.text) for line in shown), default=0)
    return "\n".join(f"{line.text:<{width}}  # {os.path.basename(line.file)}:{line.line}"
                     for line in shown)


def input_stage(loaded: Loaded, run: ForwardRun, layer: int) -> Stage:
    """Where layer L's attention input comes from: embeddings, residual stream, layer norm.

    Every tensor is one the model computed (captured by hooks); the checks recompute a
    lookup, a sum and the layer norm only to compare, and say so.
    """
    info, captured = loaded.info, run.layers[layer]
    T = run.ids.shape[1]
    tokens, positions = run.token_embeddings, run.position_embeddings
    token_table = loaded.model.get_input_embeddings().weight
    x = captured.attention_input
    BTC = ("B", "T", "C")
    records = [
        _record("input_ids", run.ids, ("B", "T"), kind="int",
                caption=f"the tokenizer's ids, one per token (vocabulary of {info.vocab_size})"),
        _record(f"{run.token_name}(input_ids)", tokens, BTC,
                caption=f"token embeddings: row t is row input_ids[t] of {run.token_name}.weight"),
    ]
    checks = [Check(f"row t of the token embeddings is row input_ids[t] of {run.token_name}.weight "
                    f"for all {T} tokens", torch.equal(tokens[0], token_table[run.ids[0]]))]
    if positions is not None and run.position_name is not None:
        position_table = loaded.model.get_submodule(run.position_name).weight
        records.append(_record(f"{run.position_name}(position_ids)", positions, BTC,
                               caption=f"position embeddings: row t is row t of "
                                       f"{run.position_name}.weight, whatever the token"))
        checks.append(Check(f"row t of the position embeddings is row t of "
                            f"{run.position_name}.weight, t = 0..{T - 1}",
                            torch.equal(positions.reshape(T, -1), position_table[:T])))
        summed = tokens + positions  # recomputed only for the check below
        checks.append(Check("block 0's input is token + position embeddings "
                            "(recomputed by mha-tui for this check; dropout is off in eval mode): "
                            f"torch.equal = {torch.equal(run.embedded, summed)}",
                            torch.equal(run.embedded, summed)))
    records.append(_record(f"{loaded.blocks_path}.0 input", run.embedded, BTC,
                           caption="the residual stream as it enters the first block"))
    if layer > 0:
        records.append(_record(
            f"{loaded.blocks_path}.{layer} input", captured.residual, BTC,
            caption=f"the residual stream after {layer} block{'s' if layer > 1 else ''}: "
                    f"the embeddings plus every earlier block's attention and MLP outputs"))
        checks.append(Check(
            f"spread (std) of the residual stream: {run.embedded.std().item():.4f} entering "
            f"block 0 -> {captured.residual.std().item():.4f} entering block {layer}", None))
    norm = captured.norm_name
    if norm is not None and captured.norm is not None:
        records.append(_record(f"x = {norm}(hidden_states)", x, BTC,
                               caption=f"layer {layer}'s layer norm: what the attention module "
                                       f"receives as x"))
        with torch.no_grad():
            again = captured.norm(captured.residual)  # recomputed only for the check
        checks.append(Check(f"x is {norm} applied to block {layer}'s input (recomputed by "
                            f"mha-tui for this check): torch.equal = {torch.equal(x, again)}",
                            torch.equal(x, again)))
    else:
        records.append(_record("x", x, BTC, caption="what the attention module receives"))
    source = (f"layer {layer}'s input" if norm is None
              else f"the residual stream through {norm}")
    explanation = (
        f"The tokenizer cut the sentence into {T} tokens. {run.token_name} turns each id into a "
        f"learned row of C={info.embed_dim} numbers (what the token is)"
        + (f", and {run.position_name} adds a row for its position (where it is)"
           if positions is not None else "; positions are not added here")
        + ". That sum enters block 0. Each block adds its attention and MLP outputs back onto "
          "this residual stream, so layer " + str(layer) + " reads the stream after "
        + str(layer) + f" block{'s' if layer != 1 else ''}"
        + (f"; its layer norm {norm} rescales every token's C numbers before attention sees "
           "them." if norm else ".")
    )
    return Stage(
        id="embed", title=f"Where layer {layer}'s input comes from: {source}",
        code=_code(run.token_line, run.position_line, captured.residual_line, captured.norm_line),
        explanation=explanation, shape_in=tuple(run.ids.shape), shape_out=tuple(x.shape),
        dims_in=("B", "T"), dims_out=BTC, tensors=tuple(records), checks=tuple(checks),
        kind="embed", source=_source(captured.norm_line or captured.attention_line),
    )


def _source(line: Line) -> Source:
    """The model's statement at line, as the tracer reads statements."""
    from .tracing.torch_ops import source_at

    return source_at(line.file, line.line) if line.file else Source(file="", line=0, text="")


# ---------------------------------------------------------------- a sentence, every layer


class Session:
    """One model and one sentence: configs and traces by layer, each from the model's forward.

    While the sentence has at most all_layers_limit tokens, the first trace asked for runs
    the forward once and records every layer; longer sentences record only the layer asked
    for (one forward per layer visited, the previous layer's records dropped).
    """

    def __init__(self, loaded: Loaded, sentence: str, *, ascii_only: bool = False,
                 one_layer: bool = False) -> None:
        """one_layer: record only the layer asked for (a transcript shows one layer)."""
        self.loaded = loaded
        self.sentence = sentence
        self.ids, self.tokens = tokenize(loaded, sentence, ascii_only=ascii_only)
        self.limit = all_layers_limit(loaded.info)
        self.all_layers = len(self.ids) <= self.limit and not one_layer
        self._traces: dict[int, Trace] = {}
        self._lock = threading.Lock()

    @property
    def n_layers(self) -> int:
        return self.loaded.info.n_layers

    def config(self, layer: int) -> Config:
        info = self.loaded.info
        model = ModelSource(
            name=info.name, class_name=info.class_name, layer=layer, n_layers=info.n_layers,
            vocab_size=info.vocab_size, tokens=self.tokens, ids=tuple(self.ids),
            all_layers_limit=self.limit, attention=self.loaded.attention_path(layer),
        )
        return Config(self.sentence, embed_dim=info.embed_dim, num_heads=info.num_heads,
                      max_seq_len=min(MAX_SEQ_LEN, max(len(self.ids), info.max_positions or 0)),
                      model=model)

    def recorded(self, layer: int) -> bool:
        """Whether layer's trace is ready (moving there costs no forward pass)."""
        return layer in self._traces

    def trace(self, layer: int) -> Trace:
        check_layer(self.loaded, layer)
        with self._lock:
            if layer not in self._traces:
                layers = range(self.n_layers) if self.all_layers else [layer]
                traces = trace_layers(self.loaded, self, layers)
                if not self.all_layers:
                    self._traces.clear()
                self._traces.update(traces)
            return self._traces[layer]


def trace_layers(loaded: Loaded, session: Session, layers: Sequence[int]) -> dict[int, Trace]:
    """Run the model's forward once, recording the attention of every layer in layers."""
    from .tracing import record

    roots = {loaded.attention_path(layer): loaded.attention(layer) for layer in layers}
    result: Any = None

    def around(call: Callable[[], Any]) -> Any:
        nonlocal result
        result = record(call, roots)
        if result.error is not None:
            raise HfError(f"{loaded.info.name}: the model's forward raised "
                          f"{type(result.error).__name__}: {_first_line(result.error)}")
        return result.value

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_forward(loaded, session.ids, layers, around)
    traces = {}
    for layer in layers:
        config = session.config(layer)
        recording = result.recordings[loaded.attention_path(layer)]
        stages = _attention_stages(config, recording, run.layers[layer], loaded.attention(layer))
        module = ModuleInfo(class_name=recording.module_class, file=recording.module_file)
        traces[layer] = Trace(config=config, stages=(input_stage(loaded, run, layer), *stages),
                              module=module, recording=recording)
    return traces


def _attention_stages(config: Config, recording: Recording, captured: LayerInput,
                      attention: nn.Module) -> tuple[Stage, ...]:
    """The recogniser's stages for one layer's recorded attention forward, and a last check:
    the recorded output is the very tensor the module returned inside the model's forward."""
    from .pipeline import stages_of

    n_params = sum(p.numel() for p in attention.parameters())
    stages = stages_of(Recorded(recording, config, n_params=n_params))
    if recording.output is None or not stages:
        return stages
    recorded = torch.from_numpy(recording.snapshot(recording.output).values)
    same = bool(torch.equal(recorded, captured.output))
    check = Check(f"the last tensor equals the output the attention module returned inside the "
                  f"model's forward (seen by a forward hook): torch.equal = {same}", same)
    return (*stages[:-1], replace(stages[-1], checks=(*stages[-1].checks, check)))
