"""The E8M0 cast with an explicit tie rule and lowest-binade rule.

E8M0 holds only powers of two, so a round-to-nearest tie is an input exactly halfway between two of
them in the linear domain: ``1.5 * 2^k`` (between codes ``k + 127`` and ``k + 128``).

- ``ties="up"`` (the default): the implicit bit is the LSB, so every exact tie rounds up (to
  ``2^(k+1)``): ml_dtypes since 0.5.1, torch, and fp8sim's :func:`~fp8sim.cast.encode`.
- ``ties="even"``: the IEEE reading: the tie goes to the neighbour whose *code* is even, i.e. down
  when ``k + 128`` is odd (``k`` odd), up otherwise (ml_dtypes 0.5.0, gfloat ``TiesToEven``).
- ``sliver="nearest"`` (the default): inputs in (2^-127, 2^-126) round to the nearer of the two, the
  tie as ``ties`` says (ml_dtypes 0.7, :func:`~fp8sim.cast.encode`).
- ``sliver="up"``: every input in (2^-127, 2^-126) gives 2^-126 (code 0x01): ml_dtypes before 0.7
  and torch, whose conversion treats code 0x00 as a subnormal below 2^-126.

Every other input, NaN, overflow and values at or below 2^-127 are as in ``encode``.  The rules of
each ml_dtypes release, with their source lines: ``docs/versions.md``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor
from ..formats import get_format
from . import encode

__all__ = ["E8M0_TIES", "E8M0_SLIVER", "encode_e8m0"]

E8M0_TIES = ("up", "even")
E8M0_SLIVER = ("nearest", "up")


def _exact_float64(x: Any) -> np.ndarray:
    """``x`` as float64 numpy, exactly (every float type fp8sim takes is exact in float64)."""
    if is_torch_tensor(x):
        return x.detach().cpu().double().numpy()
    arr = np.asarray(x)
    with np.errstate(invalid="ignore", over="ignore"):
        return arr.astype(np.float64)


def encode_e8m0(x: Any, *, ties: str = "up", sliver: str = "nearest", saturate: bool = True) -> Any:
    """E8M0 codes of ``x`` with round to nearest, the tie rule ``ties`` and the lowest-binade rule
    ``sliver`` (module docstring).

    ``x`` and ``saturate`` are as for :func:`~fp8sim.cast.encode` (``fmt="e8m0"``); the result has its
    type (uint8 numpy array, or uint8 torch tensor for a torch input)."""
    if not isinstance(ties, str) or ties not in E8M0_TIES:
        raise ValueError(f"unknown ties {ties!r}; known: {', '.join(E8M0_TIES)}")
    if not isinstance(sliver, str) or sliver not in E8M0_SLIVER:
        raise ValueError(f"unknown sliver {sliver!r}; known: {', '.join(E8M0_SLIVER)}")
    codes = encode(x, get_format("e8m0"), saturate=saturate)
    if ties == "up" and sliver == "nearest":
        return codes
    x64 = _exact_float64(x)
    fix = np.zeros(np.shape(x64), bool)
    value = np.zeros(np.shape(x64), np.uint8)
    if ties == "even":
        with np.errstate(invalid="ignore"):
            mant, exp = np.frexp(x64)  # x = mant * 2^exp, mant in [0.5, 1): a tie 1.5 * 2^k has mant 0.75
            k = exp.astype(np.int64) - 1
            tie = (mant == 0.75) & (k >= -127) & (k <= 127)
        down = tie & (k % 2 == 1)  # code k + 127 is even: nearest-even takes 2^k
        fix |= down
        value = np.where(down, (k + 127).astype(np.uint8), value)
    if sliver == "up":
        with np.errstate(invalid="ignore"):
            lowest = (x64 > 2.0**-127) & (x64 < 2.0**-126)
        fix |= lowest
        value = np.where(lowest, np.uint8(1), value)
    if not fix.any():
        return codes
    if is_torch_tensor(codes):
        import torch

        dev = codes.device
        return torch.where(torch.from_numpy(fix).to(dev), torch.from_numpy(value.astype(np.uint8)).to(dev), codes)
    out = np.where(fix, value, codes).astype(np.uint8)
    if isinstance(codes, np.ndarray):
        return out
    return int(out) if isinstance(codes, int) else out[()]  # a Python float gives an int, a numpy scalar a scalar
