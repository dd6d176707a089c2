"""`--hf`, streamed: only what layer L needs is in memory, the model's own forward unchanged.

The model is built with its parameters on torch's meta device (shapes, no memory) and its
buffers computed as its own `__init__` computes them (rotary `inv_freq`, position ids).
What lies outside the blocks (the embeddings, their norm, the final norm) is read from the
checkpoint; the output head is not (the forward never reaches it). Then, for one forward
recording layers `layers` (`Streamer.running`):

- a block before the deepest recorded layer is read from the checkpoint in a forward
  pre-hook (`safe_open(...).get_tensor`) and dropped back to meta in its forward hook, so
  that one block at a time is in memory; its output is kept (a (B, T, C) tensor) so that
  the next forward skips it: the block's `forward` returns the kept output instead of
  running, and the model's own loop around it runs unchanged;
- a recorded layer's block is read and kept until the next forward (the first stage
  recomputes its layer norm to compare);
- no block after the deepest recorded layer runs: a forward hook on it raises `Stopped`,
  which `until_stopped` turns into a normal return, before the tracer sees it.

The model's forward, each block's and the attention's code are the model's own: the
recorded lines, ops and numbers are those of the full load (tests/test_hf_stream.py checks
the transcripts byte for byte). A checkpoint this cannot read tensor by tensor (a `.bin`
pickle, a parameter missing under its name, a shape that differs) is not streamed:
`open_checkpoint` says why and `load.hf` loads it whole, as before.

Weights are read only from safetensors (no code runs). Never import rich, textual, typer,
the tracer or transformers here (the model and its class come from `load.hf`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook

from .hf_error import HfError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


class Stopped(Exception):
    """Raised by the hook on the deepest recorded block: the forward ends there."""


# ---------------------------------------------------------------- the checkpoint's tensors


@dataclass(frozen=True)
class Checkpoint:
    """Where each tensor of a safetensors checkpoint is: key -> file (one file or shards)."""

    files: dict[str, Path]
    shapes: dict[str, tuple[int, ...]]

    @contextmanager
    def reading(self) -> Iterator[Callable[[str], torch.Tensor]]:
        """read(key): one tensor, copied out of its file (safetensors: no code runs). The
        files are mapped only while this is open, so that the pages read are not kept."""
        from safetensors import safe_open

        with ExitStack() as stack:
            handles: dict[Path, Any] = {}

            def read(key: str) -> torch.Tensor:
                file = self.files[key]
                if file not in handles:
                    handles[file] = stack.enter_context(
                        safe_open(str(file), framework="pt", device="cpu"))
                return handles[file].get_tensor(key)
            yield read


def open_checkpoint(path: Path) -> Checkpoint | str:
    """The checkpoint's tensor index, or why it cannot be read tensor by tensor."""
    try:
        from safetensors import safe_open
    except ImportError:
        return "safetensors is not installed"
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"{INDEX} is not a safetensors index"
        names = sorted(set(weight_map.values()))
    elif (path / SINGLE).is_file():
        names = [SINGLE]
    else:
        return "its weights are not in safetensors files (a .bin is read whole)"
    files: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name in names:
        file = path / name
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for key in handle.keys():
                    files[key] = file
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        except Exception as error:  # safetensors raises its own kinds on a bad file
            return f"{name} could not be read ({type(error).__name__})"
    return Checkpoint(files, shapes)


# ---------------------------------------------------------------- the empty model


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While open, every parameter a module registers is moved to the meta device (shape and
    dtype, no memory) before its initialisation runs; buffers stay real (torch's public
    global registration hook: what accelerate's init_empty_weights(include_buffers=False)
    does by patching register_parameter)."""

    def hook(module: nn.Module, name: str, param: nn.Parameter | None) -> nn.Parameter | None:
        if param is None or param.is_meta:
            return None
        return nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    handle = register_module_parameter_registration_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (model.get_submodule(path) if path else model), leaf


# ---------------------------------------------------------------- the streamer


class Streamer:
    """A model on meta, its checkpoint, and the blocks read in and dropped as a forward runs."""

    def __init__(self, model: nn.Module, checkpoint: Checkpoint, blocks_path: str,
                 blocks: Sequence[nn.Module], prefix: str) -> None:
        self.model = model
        self.checkpoint = checkpoint
        self.blocks_path = blocks_path
        self.blocks = blocks
        self.prefix = prefix  # the base model's prefix (bert.), which a checkpoint may carry
        # Every block read from the checkpoint, in order (the tests check which were).
        self.reads: list[int] = []
        self._kept: set[int] = set()  # blocks in memory between forwards
        self._outputs: dict[int, Any] = {}  # block -> its output on self._ids
        self._ids: tuple[int, ...] | None = None

    # ------------------------------------------------------------ names and tensors

    def key(self, name: str) -> str | None:
        """The checkpoint's key for the model's parameter or buffer `name`."""
        shapes, prefix = self.checkpoint.shapes, self.prefix
        candidates = [name]
        if prefix:
            candidates += [f"{prefix}.{name}", name.removeprefix(f"{prefix}.")]
        return next((key for key in candidates if key in shapes), None)

    def check(self) -> str | None:
        """Why some block parameter cannot be read by its name and shape, or None."""
        for index, block in enumerate(self.blocks):
            for name, param in block.named_parameters():
                full = f"{self.blocks_path}.{index}.{name}"
                key = self.key(full)
                if key is None:
                    return f"{full} is not in the checkpoint under that name"
                if self.checkpoint.shapes[key] != tuple(param.shape):
                    return (f"{full} is {tuple(param.shape)} in the model but "
                            f"{self.checkpoint.shapes[key]} in the checkpoint")
        return None

    def _read(self, module: nn.Module, path: str) -> None:
        """Read module's parameters (every level) from the checkpoint, in the model's dtype.
        A parameter shared between two places stays shared."""
        done: dict[int, nn.Parameter] = {}
        with self.checkpoint.reading() as read:
            for sub_path, sub in module.named_modules(prefix=path, remove_duplicate=False):
                for leaf, param in list(sub.named_parameters(recurse=False)):
                    if id(param) not in done:
                        if not param.is_meta:
                            done[id(param)] = param
                            continue
                        key = self.key(f"{sub_path}.{leaf}" if sub_path else leaf)
                        if key is None:
                            raise HfError(f"{sub_path}.{leaf} is not in the checkpoint; run "
                                          f"with --no-stream to load the model whole")
                        tensor = read(key).to(param.dtype)
                        done[id(param)] = nn.Parameter(tensor, requires_grad=param.requires_grad)
                    setattr(sub, leaf, done[id(param)])

    @staticmethod
    def _drop(module: nn.Module) -> None:
        """Back to meta: the block's parameters free their memory."""
        done: dict[int, nn.Parameter] = {}
        for sub in module.modules():
            for leaf, param in list(sub.named_parameters(recurse=False)):
                if id(param) not in done:
                    done[id(param)] = nn.Parameter(param.to("meta"),
                                                   requires_grad=param.requires_grad)
                setattr(sub, leaf, done[id(param)])

    def load_outside_blocks(self) -> None:
        """Everything outside the blocks that is in the checkpoint, but the output head when it
        is not the input embeddings (the forward stops before it); persistent buffers too."""
        model = self.model
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        in_blocks = {id(sub) for block in self.blocks for sub in block.modules()}
        with self.checkpoint.reading() as read:
            for path, sub in model.named_modules():
                if id(sub) in in_blocks or sub is head:
                    continue
                for leaf, param in list(sub.named_parameters(recurse=False)):
                    key = self.key(f"{path}.{leaf}" if path else leaf)
                    if param.is_meta and key is not None:
                        setattr(sub, leaf, nn.Parameter(read(key).to(param.dtype),
                                                        requires_grad=param.requires_grad))
            # The ties the config states (an output head that is the input embeddings, T5's
            # encoder.embed_tokens that is `shared`), as from_pretrained makes them.
            model.tie_weights()
            for name, buffer in model.named_buffers():
                key = self.key(name)
                if key is not None and self.checkpoint.shapes[key] == tuple(buffer.shape):
                    owner, leaf = _owner(model, name)
                    owner._buffers[leaf] = read(key).to(buffer.dtype)

    def _read_block(self, index: int) -> None:
        self._read(self.blocks[index], f"{self.blocks_path}.{index}")
        self.reads.append(index)

    # ------------------------------------------------------------ one forward

    @contextmanager
    def running(self, ids: Sequence[int], layers: Sequence[int]) -> Iterator[None]:
        """Hooks for one forward that records `layers` on `ids`: see the module docstring.
        The forward must be called through `until_stopped`."""
        ids = tuple(ids)
        if ids != self._ids:
            self._outputs, self._ids = {}, ids
        wanted, last = set(layers), max(layers)
        for index in sorted(self._kept - wanted):
            self._drop(self.blocks[index])
            self._kept.discard(index)
        handles: list[Any] = []
        skipped: list[nn.Module] = []
        outputs = self._outputs

        def keep(index: int, *, drop: bool) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any, output: Any) -> None:
                outputs[index] = _detached_copy(output)
                if drop:
                    self._drop(module)
                if index == last:
                    raise Stopped
            return hook

        def read(index: int) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any) -> None:
                self._read_block(index)
            return hook

        try:
            for index in range(last + 1):
                block = self.blocks[index]
                if index in wanted:
                    if index not in self._kept:
                        self._read_block(index)
                        self._kept.add(index)
                    handles.append(block.register_forward_hook(keep(index, drop=False)))
                elif index in outputs and "forward" not in vars(block):
                    block.forward = _returning(outputs[index])  # type: ignore[method-assign]
                    skipped.append(block)
                else:
                    handles.append(block.register_forward_pre_hook(read(index)))
                    handles.append(block.register_forward_hook(keep(index, drop=True)))
            handles.extend(self._guards())
            yield
        finally:
            for handle in handles:
                handle.remove()
            for block in skipped:
                del block.forward
            for index, block in enumerate(self.blocks):  # a forward that raised midway
                if index not in self._kept and any(not p.is_meta for p in block.parameters()):
                    self._drop(block)

    def _guards(self) -> list[Any]:
        """A module outside the blocks whose weights were not read (not in the checkpoint)
        says so if the forward calls it, instead of failing on a meta tensor."""
        in_blocks = {id(sub) for block in self.blocks for sub in block.modules()}
        handles = []
        for path, sub in self.model.named_modules():
            if id(sub) in in_blocks or not any(p.is_meta for p in sub.parameters(recurse=False)):
                continue

            def guard(module: nn.Module, args: Any, path: str = path) -> None:
                raise HfError(f"{path} has no weights in the checkpoint under its name; run "
                              f"with --no-stream to load the model whole")
            handles.append(sub.register_forward_pre_hook(guard))
        return handles

    @staticmethod
    def until_stopped(call: Callable[[], Any]) -> Callable[[], Any]:
        """call, returning None where the forward stopped after the deepest recorded block."""
        def run() -> Any:
            try:
                return call()
            except Stopped:
                return None
        return run

    def resident_bytes(self) -> int:
        """Bytes of the model's parameters and buffers in memory now (not on meta)."""
        seen: set[int] = set()
        total = 0
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            if id(tensor) not in seen and not tensor.is_meta:
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
        return total


def _returning(output: Any) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        return output
    return forward


def _detached_copy(value: Any) -> Any:
    """The block's output, its tensors copied (the model may reuse its own in place)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_detached_copy(v) for v in value)
    return value


def build(auto: Any, path: Path, config: Any, dtype: torch.dtype, blocks_of: Callable[
        [nn.Module], tuple[str, Sequence[nn.Module], str] | None]) -> tuple[Any, str] | str:
    """The model on meta with what lies outside its blocks read, and its Streamer; or why it
    cannot be streamed (the caller then loads it whole).

    blocks_of(model) finds the model's blocks (`load.hf._find_blocks`), as for a full load.
    """
    checkpoint = open_checkpoint(path)
    if isinstance(checkpoint, str):
        return checkpoint
    with parameters_on_meta():
        model = auto.from_config(config, attn_implementation="eager", dtype=dtype,
                                 trust_remote_code=False)
    model.eval()
    found = blocks_of(model)
    if found is None:
        return "its blocks were not found"
    blocks_path, blocks, attention_name = found
    streamer = Streamer(model, checkpoint, blocks_path, blocks,
                        str(getattr(model, "base_model_prefix", "") or ""))
    problem = streamer.check()
    if problem is not None:
        return problem
    streamer.load_outside_blocks()
    return streamer, attention_name
