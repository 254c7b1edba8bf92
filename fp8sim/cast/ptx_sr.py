"""Hardware stochastic rounding as PTX ``cvt.rs.satfinite.{e4m3x4,e5m2x4,e2m3x4,e3m2x4,e2m1x4}.f32``
(sm_100a/sm_103a, PTX ISA 8.7+): four float32 inputs ``{a, b, e, f}`` and one 32-bit ``rbits`` word.

The rule (PTX ISA, cvt ".rs"): the result is rounded toward or away from zero by the carry out of the
integer addition of the random bits to the discarded mantissa bits of the input.  With ``r`` random bits
``u`` and ``f`` the fraction of the way from the grid point below ``|x|`` to the one above, that is
"away iff ``floor(f * 2^r) + u >= 2^r``" (gfloat's ``RoundMode.StochasticFastest`` with ``srnumbits=r``);
``.satfinite`` sends overflow and Inf to ``+-max``, and NaN to the NaN code (``0x7F`` with the input's
sign), or to ``+max`` for the formats without NaN (E2M1, E2M3, E3M2; as TE's software fallback
``stochastic_round_fp4_e2m1`` in ``common/util/ptx.cuh``).  Which bits each input takes (PTX ISA, cvt,
"rbits"):

- 8- and 6-bit formats (``r = 16``): ``a`` and ``b`` both use ``rbits[31:16]``, ``e`` and ``f`` both use
  ``rbits[15:0]``.
- E2M1 (``r = 8``): "upper 8-bits from both 16-bit halves" go to ``a, b`` and the lower 8 bits of both
  halves to ``e, f``; fp8sim takes ``a = rbits[31:24]``, ``b = rbits[15:8]``, ``e = rbits[23:16]``,
  ``f = rbits[7:0]`` (the ISA names the bytes, not which of the pair gets which: inferred, spec 10).

The packed result (``d[31:24] = a`` ... ``d[7:0] = f`` for FP8; ``d[15:12] = a`` ... ``d[3:0] = f`` for
E2M1) puts ``f`` lowest, so TE passes its elements as ``{x3, x2, x1, x0}``: element ``i`` of a group of
four is operand ``(f, e, b, a)[i]``.  :func:`encode_ptx_rs` takes the elements in memory order and
applies that mapping.  fp8sim's own counter-based ``rounding="stochastic"`` is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import FloatFormat, get_format
from ._rounding import SR_BITS, round_codes

__all__ = ["PTX_RS_FORMATS", "ptx_rs_bits", "encode_ptx_rs"]

PTX_RS_FORMATS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")


def ptx_rs_bits(rbits: Any, fmt: str | FloatFormat) -> np.ndarray:
    """The random bits each element of a group of four (memory order x0..x3) takes from its word:
    shape ``rbits.shape + (4,)``, values in ``[0, 2^r)``; ``r`` = 8 for E2M1, else 16."""
    f = _check_fmt(fmt)
    w = np.asarray(rbits)
    if w.dtype.kind not in "ui" or (w.size and (w.min() < 0 or w.max() > 0xFFFFFFFF)):
        raise ValueError("rbits must be uint32 words (integers in [0, 2^32))")
    w = w.astype(np.int64)
    if f.name == "e2m1":
        a, b, e, ff = (w >> 24) & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF, w & 0xFF
    else:
        a = b = (w >> 16) & 0xFFFF
        e = ff = w & 0xFFFF
    return np.stack([ff, e, b, a], axis=-1)  # memory order: x0 = f, x1 = e, x2 = b, x3 = a


def encode_ptx_rs(x: Any, fmt: str | FloatFormat, rbits: Any) -> np.ndarray:
    """Codes (uint8, one per element, unpacked) of float32 ``x`` under ``cvt.rs.satfinite.<fmt>x4.f32``.

    ``x``: float32 array (or torch tensor) whose size is a multiple of 4; consecutive groups of four
    elements (flattened, C order) form one instruction, and ``rbits`` holds one uint32 word per group
    (``x.size // 4`` words, any shape)."""
    f = _check_fmt(fmt)
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype != np.float32:
        raise TypeError(f"x must be float32 (cvt.rs takes .f32 sources only); got {arr.dtype}")
    if arr.size % 4:
        raise ValueError(f"x must hold a multiple of 4 elements (one cvt.rs per group of four); got {arr.size}")
    words = np.asarray(rbits).reshape(-1)
    if words.size != arr.size // 4:
        raise ValueError(f"rbits must hold one word per group of four: {arr.size // 4} words; got {words.size}")
    r = 8 if f.name == "e2m1" else 16
    u = ptx_rs_bits(words, f).reshape(-1)
    flat = arr.reshape(-1).astype(np.float64)
    codes = round_codes(np, flat, f, "stochastic", True, rbits=u << (SR_BITS - r)).astype(np.uint8)
    nan = np.isnan(flat)
    if not f.has_nan:  # satfinite: NaN becomes +MAX_NORM where the format has no NaN (TE ptx.cuh, e2m1 SR)
        codes[nan] = f.max_code
    else:  # CUDA writes FP8 NaN as 0x7F | sign for E5M2 too (ml_dtypes: 0x7E)
        codes[nan] = np.uint8(0x7F) | (np.signbit(flat[nan]).astype(np.uint8) << 7)
    return codes.reshape(arr.shape)


def _check_fmt(fmt: str | FloatFormat) -> FloatFormat:
    f = get_format(fmt)
    if f.name not in PTX_RS_FORMATS:
        raise ValueError(f"cvt.rs has no .{f.name}x4 destination; known: {', '.join(PTX_RS_FORMATS)}")
    return f
