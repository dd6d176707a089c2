"""What `mha-tui check` needs run again, done here because it takes torch.

* `second_recording`: the same forward recorded a second time on the same input, so the
  judge can tell a dropout that is active (two runs differ) from a deterministic module.
* `reference_output`: the "mygpt" chapter's MultiHeadAttention with a module's weights
  copied in by role (Q, K, V, O; biases kept; no output projection becomes the identity),
  run on the same x. The judge compares it with the module's own output.
* `parameter_shapes`: every parameter's name and shape (a declared but unused W_O).

Only plain values cross to the judge room (NumPy arrays, recordings, tuples): the judge
never imports torch. Never import rich, textual or typer here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..records import Recording


def parameter_shapes(module: nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every parameter, in declaration order."""
    return tuple((name, tuple(p.shape)) for name, p in module.named_parameters())


def second_recording(module: nn.Module, x: torch.Tensor,
                     call: Callable[[nn.Module, torch.Tensor], object]) -> Recording | None:
    """Record the forward once more on the same x (None if it raises)."""
    from .torch_ops import record

    with torch.no_grad():
        result = record(lambda: call(module, x), {"": module})
    if result.error is not None:
        return None
    return result.recordings.get("")


def _linear(weight: np.ndarray, bias: np.ndarray | None) -> nn.Linear:
    out_features, in_features = weight.shape
    layer = nn.Linear(in_features, out_features, bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32)))
        if bias is not None:
            layer.bias.copy_(torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float32)))
    return layer


def reference_output(x: np.ndarray, weights: object, heads: int, causal: bool) -> np.ndarray:
    """The mygpt module, weights copied in by role, run on x: (B, T, C) as NumPy (float64).

    weights: an object with q, k, v, o attributes, each (weight (out, in), bias or None);
    o None means no output projection (the identity, no bias).
    """
    from ..examples.mygpt import MultiHeadAttention

    data = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    _, T, C = data.shape  # (B, T, C)
    module = MultiHeadAttention(C, heads, max_seq_len=max(64, T), causal=causal)
    module.W_Q = _linear(*weights.q)  # type: ignore[attr-defined]
    module.W_K = _linear(*weights.k)  # type: ignore[attr-defined]
    module.W_V = _linear(*weights.v)  # type: ignore[attr-defined]
    o = weights.o  # type: ignore[attr-defined]
    module.W_O = _linear(*o) if o is not None else _linear(np.eye(C), None)
    module.eval()
    with torch.no_grad():
        return module(data).double().numpy()


def cross_reference_output(x: np.ndarray, weights: object, heads: int, causal: bool, *,
                           context: np.ndarray | None = None,
                           padding: np.ndarray | None = None) -> np.ndarray:
    """Cross-attention's and a padded batch's reference: the `cross` tutorial module
    (examples/cross.py), weights copied in by role, queries from x (B, T_q, C), keys and
    values from the context (B, T_k, C) when given (no causal mask across two sequences),
    else from x; padding (B, T_k), True = padding: those keys blocked for every query."""
    from ..examples.cross import CrossAttention

    data = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))  # (B, T_q, C)
    other = torch.from_numpy(np.ascontiguousarray(context if context is not None else x,
                                                   dtype=np.float32))  # (B, T_k, C)
    C = data.shape[-1]
    module = CrossAttention(C, heads)
    module.W_q = _linear(*weights.q)  # type: ignore[attr-defined]
    module.W_k = _linear(*weights.k)  # type: ignore[attr-defined]
    module.W_v = _linear(*weights.v)  # type: ignore[attr-defined]
    o = weights.o  # type: ignore[attr-defined]
    module.W_o = _linear(*o) if o is not None else _linear(np.eye(C), None)
    module.eval()
    T_q, T_k = data.shape[1], (other if context is not None else data).shape[1]
    blocked = torch.zeros(data.shape[0], 1, T_q, T_k, dtype=torch.bool)  # (B, 1, T_q, T_k)
    if causal and context is None:
        blocked = blocked | torch.triu(torch.ones(T_q, T_k, dtype=torch.bool), diagonal=1)
    if padding is not None:
        blocked = blocked | torch.from_numpy(np.asarray(padding, dtype=bool))[:, None, None, :]
    with torch.no_grad():
        return module(data, other if context is not None else None,
                      mask=blocked if blocked.any() else None).double().numpy()


def parameter_values(module: nn.Module) -> dict[str, np.ndarray]:
    """Every parameter by name, as NumPy (float64 copies)."""
    return {name: p.detach().double().numpy().copy() for name, p in module.named_parameters()}


def set_parameters(module: nn.Module, values: dict[str, np.ndarray]) -> None:
    """Write new values into the module's parameters (each keeps its own dtype)."""
    named = dict(module.named_parameters())
    with torch.no_grad():
        for name, array in values.items():
            target = named[name]
            target.copy_(torch.from_numpy(np.ascontiguousarray(array)).to(target.dtype))
