"""Argument checks shared by the public API, so every refusal names the argument and what it takes.

``as_int`` accepts what ``operator.index`` accepts (Python ints, numpy integers, 0-d integer arrays,
0-d integer torch tensors, any object with ``__index__``) and refuses ``True``/``False`` (an int
subclass, but never a count or a size), floats (``4.0`` is not an index, as in ``range(4.0)``) and
everything else with a TypeError naming the argument; a value out of range is a ValueError naming
the argument and the range.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["as_int", "as_bool", "as_real", "as_array", "is_complex_dtype", "is_real_float_dtype"]


def as_int(value: Any, arg: str, *, lo: int | None = None, hi: int | None = None, what: str = "") -> int:
    """``value`` as a Python int in ``[lo, hi]`` (either bound optional; ``hi`` inclusive).
    ``what`` adds a hint to the range message (e.g. "TE uses 128")."""
    if isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        raise TypeError(f"{arg} must be an int, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        shown = repr(value) if len(repr(value)) <= 40 else type(value).__name__
        raise TypeError(f"{arg} must be an int, got {type(value).__name__} {shown}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        if hi is None:
            rng = f">= {lo}"
        elif lo is None:
            rng = f"<= {hi}"
        else:
            rng = f"in [{lo}, {hi}]"
        raise ValueError(f"{arg} must be an int {rng}{f' ({what})' if what else ''}, got {v}")
    return v


def is_complex_dtype(dt: Any) -> bool:
    """numpy's complex dtypes and ml_dtypes' (``complex32``, ``bcomplex32``: kind "W", not "c")."""
    dt = np.dtype(dt)
    return dt.kind == "c" or (dt.type.__module__.startswith("ml_dtypes") and "complex" in dt.type.__name__)


def is_real_float_dtype(dt: Any) -> bool:
    """numpy float16/32/64 and every real ml_dtypes float (bfloat16, the float8/6/4 types); not
    ml_dtypes' integer or complex types, which share their kind "V"/"W" codes."""
    dt = np.dtype(dt)
    if is_complex_dtype(dt):
        return False
    if dt.type.__module__.startswith("ml_dtypes"):
        import ml_dtypes

        try:
            ml_dtypes.finfo(dt)
        except (TypeError, ValueError):
            return False
        return True
    return dt.kind == "f"


def as_bool(value: Any, arg: str, *, none: bool = False) -> bool | None:
    """``True``/``False`` (numpy bools too; ``None`` where ``none``); anything else, truthy or not, is a
    TypeError naming ``arg`` (a string such as ``"no"`` would otherwise count as True)."""
    if none and value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    allowed = "True, False or None" if none else "True or False"
    shown = repr(value) if len(repr(value)) <= 40 else type(value).__name__
    raise TypeError(f"{arg} must be {allowed}, got {shown}")


def as_real(value: Any, arg: str, *, finite: bool = False, lo: float | None = None) -> float:
    """A real number (Python or numpy int/float, a one-element real array or tensor) as a float; bools,
    strings, complex and larger arrays are a TypeError naming ``arg``; ``finite`` refuses NaN and
    infinities, ``lo`` smaller values (ValueError)."""
    if isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        raise TypeError(f"{arg} must be a real number, got {value!r}")
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy() if value.numel() == 1 and not value.is_complex() else object()
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size == 1 and value.dtype.kind in "iuf" else object()
    if not isinstance(value, (int, float, np.integer, np.floating)):
        shown = repr(value) if len(repr(value)) <= 40 else type(value).__name__
        raise TypeError(f"{arg} must be a real number, got {shown}")
    v = float(value)
    if finite and not np.isfinite(v):
        raise ValueError(f"{arg} must be a finite number, got {v}")
    if lo is not None and not v >= lo:
        raise ValueError(f"{arg} must be a number >= {lo}, got {v}")
    return v


def as_array(value: Any, arg: str) -> np.ndarray:
    """``np.asarray(value)``, with numpy's errors for ragged nesting or unconvertible objects turned
    into a ValueError naming ``arg``."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{arg} is not a rectangular array of numbers: {exc}") from None
    if arr.dtype == object:
        raise TypeError(f"{arg} must be an array of numbers; got {type(value).__name__} holding Python objects")
    return arr
