"""The words of the recorded ops, shared by the recogniser and the check: which op names are
products, shape plumbing, softmaxes, dropouts, and what counts as a mask value.

One copy only: a kind module or the check that needs an op set imports it from here.
Never import torch, rich, textual or typer here.
"""

from __future__ import annotations

import numpy as np

MATMULS = {"matmul", "bmm", "mm", "einsum", "baddbmm", "rmatmul"}
PROJECTIONS = {"linear", "addmm", "matmul", "mm", "einsum", "rmatmul"}
SHAPE_OPS = {"view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze",
             "expand", "expand_as", "flatten", "unflatten", "swapaxes", "swapdims", "movedim",
             "t", "T", "mT", "float", "to", "type", "type_as", "clone", "detach", "getitem",
             "split", "chunk", "unbind", "tensor_split", "half", "double", "bool",
             "astype", "copy", "ravel"}  # NumPy's spellings
SPLITS = {"split", "chunk", "unbind", "tensor_split"}
CONCATS = {"cat", "concat", "concatenate"}  # torch.cat, its alias, np.concatenate
SOFTMAXES = {"softmax", "_softmax", "softmax_"}
DROPOUTS = {"dropout", "dropout_", "feature_dropout", "alpha_dropout"}
# The check's names for what a step does to the scores.
SCALE_OPS = {"div", "mul", "div_", "mul_", "true_divide"}
MASK_OPS = {"add", "add_", "sub", "sub_", "masked_fill", "masked_fill_", "where"}
PRODUCTS = {"linear", "addmm", "matmul", "mm", "einsum", "bmm", "baddbmm"}
LARGE_NEGATIVE = -1e4  # a "mask value": -inf, finfo.min, -1e9, -10000 ...


def very_negative(values: np.ndarray) -> bool:
    """Some entry is a mask value (at most LARGE_NEGATIVE: -inf, finfo.min, -1e9)."""
    return values.dtype.kind == "f" and bool((values <= LARGE_NEGATIVE).any())


def softmax(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along an axis, computed in the values' own dtype (the recogniser's float32
    expansion of a fused op stays float32; the check passes float64). NaN where a row has
    nothing to normalise (every entry -inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = values - np.max(values, axis=axis, keepdims=True)
        shifted = np.where(np.isnan(shifted), -np.inf, shifted)
        e = np.exp(shifted)
        return (e / np.sum(e, axis=axis, keepdims=True)).astype(values.dtype)
