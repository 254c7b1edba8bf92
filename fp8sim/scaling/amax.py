"""amax reductions with the NaN rules of each upstream (spec pitfall 10)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.args import as_array, is_real_float_dtype
from .._util.tensors import is_torch_tensor, numpy_view

__all__ = ["as_float32", "dtype_name", "amax_nan_skipping", "amax_nan_skipping_tensor", "amax_nan_propagating"]


def as_float32(x: Any, arg: str = "x") -> np.ndarray:
    """``fl32(x)`` as a numpy array: float16/bfloat16/float32 exactly, float64 rounded to nearest.
    torch tensors (any device) are moved to the CPU."""
    if is_torch_tensor(x):
        import torch

        t = x.detach()
        if not t.is_floating_point():
            raise TypeError(f"{arg} must be a floating tensor, got {t.dtype}")
        return numpy_view(t.to(torch.float32))  # not .numpy(): that pins a parameter's storage (FSDP2)
    arr = as_array(x, arg)
    if not is_real_float_dtype(arr.dtype):
        raise TypeError(f"{arg} must be a (real) floating array or tensor, got {arr.dtype}")
    with np.errstate(invalid="ignore", over="ignore"):
        return arr.astype(np.float32, copy=False)


def dtype_name(x: Any) -> str:
    """The dtype of a numpy array or torch tensor as a plain name ("bfloat16", "float32", ...)."""
    if hasattr(x, "dtype"):
        return str(x.dtype).replace("torch.", "")
    try:
        return str(np.asarray(x).dtype)
    except (ValueError, TypeError):  # ragged nesting: the input check that follows names the argument
        return "object"


def amax_nan_skipping(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    """max|x| as TE computes it (``fmaxf`` from 0): NaN elements are skipped, Inf wins, an empty or
    all-NaN reduction gives 0."""
    hi = np.fmax.reduce(x, axis=axis, keepdims=keepdims, initial=np.float32(0))
    lo = np.fmin.reduce(x, axis=axis, keepdims=keepdims, initial=np.float32(0))
    return np.maximum(hi, -lo)  # no |x| temporary; both reductions skip NaN


def amax_nan_skipping_tensor(x: Any) -> float:
    """:func:`amax_nan_skipping` of a torch tensor, computed by torch on its device (one ``aminmax`` pass;
    the NaN-skipping pass only when a NaN is there), as a Python float."""
    import torch

    if x.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(x.detach())
    amax = max(float(hi), -float(lo))  # one pass; any NaN makes it NaN
    if amax == amax:
        return amax
    a = x.detach().abs()  # rare: skip the NaNs
    return float(torch.where(torch.isnan(a), torch.zeros((), dtype=a.dtype), a).max())


def amax_nan_propagating(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    """max|x| as ``torch.amax`` computes it: any NaN makes the result NaN."""
    return np.max(np.abs(x), axis=axis, keepdims=keepdims, initial=np.float32(0))
