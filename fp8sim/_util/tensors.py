"""Recognising torch tensors without importing torch (``import fp8sim`` must not need it), and
reading them as numpy arrays without pinning their storage."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["is_torch_tensor", "numpy_view"]


def is_torch_tensor(x: Any) -> bool:
    """True if ``x`` is a ``torch.Tensor``; never imports torch (a tensor implies it is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def numpy_view(t: Any) -> np.ndarray:
    """``t`` (detached, moved to the CPU) as a numpy array sharing its memory, storage left resizable.

    ``Tensor.numpy()`` (and ``np.asarray(tensor)``) mark the tensor's storage as not resizable for
    good, so a parameter read that way can no longer be freed by FSDP2 (``free_storage``: "Trying to
    resize storage that is not resizable").  DLPack shares the memory without that mark.  The view
    is for reading during the call: the caller must not keep it past the tensor's storage.  Dtypes
    DLPack cannot carry into numpy (bfloat16, float8) come back as a copy.
    """
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    try:
        return np.from_dlpack(t)
    except (BufferError, RuntimeError, TypeError):
        return t.clone().numpy()
