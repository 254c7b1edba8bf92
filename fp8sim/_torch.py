"""Recognising torch tensors without importing torch (``import fp8sim`` must not need it)."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["is_torch_tensor"]


def is_torch_tensor(x: Any) -> bool:
    """True if ``x`` is a ``torch.Tensor``; never imports torch (a tensor implies it is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
