"""The left-to-right scans TE's fusion functions run (TE 2.20.0.dev0 ``ops/fused/*.py``
``fuse_forward_ops`` / ``fuse_backward_ops``): at each position the next ``width`` ops are offered to
``make``; a fused op replaces them, else the first op is kept and the window moves by one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["scan"]


def scan(ops: list, width: int, make: Callable[[list], Any]) -> list:
    out, i = [], 0
    while i < len(ops):
        fused = make(ops[i : i + width]) if i + width <= len(ops) else None
        if fused is None:
            out.append(ops[i])
            i += 1
        else:
            out.append(fused)
            i += width
    return out
