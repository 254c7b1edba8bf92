"""Lookup tables built from the exact rounding algorithm, cached per (format, mode, saturate).

float32 -> code: for a format with at most 6 mantissa bits whose rounding position never falls
below float32 bit 16, the result of every deterministic mode depends only on the upper 16 bits of
the input and on whether any of the lower 16 bits is set (the sticky bit).  Table index:
``(bits >> 15) | (bits & 0x7FFF != 0)``, i.e. ``upper16 << 1 | sticky``.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..formats import FloatFormat
from ._rounding import _LO, round_codes


def f32_table_ok(fmt: FloatFormat) -> bool:
    """Is the 2^17-entry float32 table exact for this format?  (Half the smallest grid spacing
    must sit at or above float32 bit 16, whose weight is at least 2^-133.)"""
    return fmt.mbits <= 6 and fmt.emin - fmt.mbits - 1 >= -133


def _f32_representatives() -> np.ndarray:
    i = np.arange(1 << 17, dtype=np.uint32)
    return ((i >> 1) << 16 | (i & 1)).view(np.float32)


def _to64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # signalling-NaN patterns warn when widened
        return x.astype(np.float64)


@cache
def f32_code_table(fmt: FloatFormat, rounding: str, saturate: bool) -> np.ndarray:
    reps = _to64(_f32_representatives())
    return round_codes(np, reps, fmt, rounding, saturate).astype(np.uint8)


@cache
def f16_code_table(fmt: FloatFormat, rounding: str, saturate: bool) -> np.ndarray:
    reps = _to64(np.arange(1 << 16, dtype=np.uint16).view(np.float16))
    return round_codes(np, reps, fmt, rounding, saturate).astype(np.uint8)


SR_EXACT = 255
"""Marker in the stochastic shift table: elements of this class take the exact path."""


@cache
def f32_stochastic_tables(fmt: FloatFormat, saturate: bool) -> tuple[np.ndarray, np.ndarray]:
    """Tables for stochastic rounding of float32 by integer addition.

    Where the grid spacing at |x| is ``2^(E-m)`` (x's exponent E at or above the format's smallest
    normal exponent), the fraction f is the low ``k = 23 - m`` bits of x's bits, and
    ``floor(f * 2^32) + r >= 2^32`` holds exactly when adding ``r >> (9 + m)`` to the bits carries
    into bit k.  Truncating the sum toward zero then gives the stochastic result, also across a
    binade (the spacing doubles with the exponent).

    Returns ``shift`` (uint8, indexed by ``bits >> 23``): the right shift for r, 32 where x can never
    round away (noise 0), or SR_EXACT where the exact path is needed (Inf/NaN inputs, the format's
    subnormal range, negative float32 subnormals for non-saturating UE5M3); and ``lo`` (uint8, indexed by
    ``bits >> 16``): the code toward zero, with nearest rounding's overflow rule (exponent 0xFF entries
    are reached only by a carry, i.e. they are overflow).
    """
    ef = np.arange(512) & 0xFF
    e_in = np.maximum(ef, 1) - 127
    qe = np.maximum(e_in, fmt.emin) - fmt.mbits
    shift = np.full(512, SR_EXACT, np.int64)
    shift[(ef >= 1) & (e_in >= fmt.emin)] = 9 + fmt.mbits
    shift[e_in + 1 <= qe - 32] = 32  # |x| < 2^(qe-32): floor(f * 2^32) == 0, never rounds away
    shift[ef == 0xFF] = SR_EXACT
    if not fmt.signed and fmt.has_zero and not saturate:
        # -0 and a negative float32 subnormal share the upper 16 bits 0x8000, but a non-saturating
        # unsigned format with zero (UE5M3) gives them 0 and NaN: that class takes the exact path
        shift[0x100] = SR_EXACT
    hi = np.arange(1 << 16, dtype=np.uint32)
    exp_ff = (hi >> 7) & 0xFF == 0xFF
    hi = np.where(exp_ff, (hi & 0x8000) | 0x7F80, hi)  # carried past float32 max: treat as Inf
    reps = _to64((hi << 16).view(np.float32))
    lo = round_codes(np, reps, fmt, _LO, saturate).astype(np.uint8)
    return shift.astype(np.uint8), lo


@cache
def code_values(fmt: FloatFormat) -> np.ndarray:
    """float64 value of every code (exact; NaN for NaN codes).  Read-only: shared by every caller."""
    v = np.array([fmt.code_value(c) for c in range(fmt.num_codes)], dtype=np.float64)
    v.flags.writeable = False
    return v


@cache
def decode_table(fmt: FloatFormat) -> np.ndarray:
    """float32 value of every code (exact: every supported format fits in float32)."""
    return code_values(fmt).astype(np.float32)
