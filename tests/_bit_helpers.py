"""Shared by the fp8sim.testing tests (torch-free): float32 arrays from bit patterns, an assertion's message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest


def f32(bits: list[int]) -> np.ndarray:
    """float32 values from their IEEE bit patterns."""
    return np.array(bits, np.uint32).view(np.float32)


def raises(fn: Callable[..., Any], *args: Any, **kw: Any) -> str:
    """The message of the AssertionError ``fn(*args, **kw)`` must raise."""
    with pytest.raises(AssertionError) as info:
        fn(*args, **kw)
    return str(info.value)
