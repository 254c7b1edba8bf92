"""The E8M0 cast with an explicit tie rule.

E8M0 holds only powers of two, so a round-to-nearest tie is an input exactly halfway between two of
them in the linear domain: ``1.5 * 2^k`` (between codes ``k + 127`` and ``k + 128``).

- ``ties="up"`` (the default): ml_dtypes 0.6.0, whose ``float8_e8m0fnu`` treats the implicit bit as the
  LSB and so rounds every exact tie up (to ``2^(k+1)``); fp8sim's :func:`~fp8sim.cast.encode` does the same.
- ``ties="even"``: the IEEE reading (an open ml_dtypes change proposes it): the tie goes to the neighbour
  whose *code* is even, i.e. down when ``k + 128`` is odd (``k`` odd), up otherwise.

Only exact ties differ; every other input, NaN, overflow and the lowest binade are as in ``encode``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor
from ..formats import get_format
from . import encode

__all__ = ["E8M0_TIES", "encode_e8m0"]

E8M0_TIES = ("up", "even")


def _exact_float64(x: Any) -> np.ndarray:
    """``x`` as float64 numpy, exactly (every float type fp8sim takes is exact in float64)."""
    if is_torch_tensor(x):
        return x.detach().cpu().double().numpy()
    arr = np.asarray(x)
    with np.errstate(invalid="ignore", over="ignore"):
        return arr.astype(np.float64)


def encode_e8m0(x: Any, *, ties: str = "up", saturate: bool = True) -> Any:
    """E8M0 codes of ``x`` with round to nearest and the tie rule ``ties`` (module docstring).

    ``x`` and ``saturate`` are as for :func:`~fp8sim.cast.encode` (``fmt="e8m0"``); the result has its
    type (uint8 numpy array, or uint8 torch tensor for a torch input)."""
    if not isinstance(ties, str) or ties not in E8M0_TIES:
        raise ValueError(f"unknown ties {ties!r}; known: {', '.join(E8M0_TIES)}")
    codes = encode(x, get_format("e8m0"), saturate=saturate)
    if ties == "up":
        return codes
    x64 = _exact_float64(x)
    with np.errstate(invalid="ignore"):
        mant, exp = np.frexp(x64)  # x = mant * 2^exp, mant in [0.5, 1): a tie 1.5 * 2^k has mant 0.75
        k = exp.astype(np.int64) - 1
        tie = (mant == 0.75) & (k >= -127) & (k <= 127)
    down = tie & (k % 2 == 1)  # code k + 127 is even: nearest-even takes 2^k
    if not down.any():
        return codes
    fixed = (k + 127).astype(np.uint8)
    if is_torch_tensor(codes):
        import torch

        return torch.where(torch.from_numpy(down).to(codes.device), torch.from_numpy(fixed).to(codes.device), codes)
    return np.where(down, fixed, codes).astype(np.uint8)
