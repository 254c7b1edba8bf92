"""The exact rounding algorithm, written once for numpy and torch (``xp`` is either module).

Works on float64 inputs, so float16/bfloat16/float32 inputs are exact and float64 inputs are
rounded once (never through float32).  Semantics: spec sections 2.1, 2.2 and 2.4.
"""

from __future__ import annotations

from typing import Any

from ..formats import FloatFormat

ROUNDING_MODES = ("nearest_even", "toward_zero", "up", "down", "nearest_away", "stochastic")
# Internal modes used to build stochastic-rounding tables: the grid neighbour below / above |x|,
# with the overflow rule of nearest rounding.
_LO, _AWAY = "_lo", "_away"

SR_BITS = 32
"""Random bits per stochastically rounded element: |x| rounds away from zero iff
``floor(f * 2^32) + r >= 2^32`` with f the fraction of the way to the next grid point
(gfloat's ``StochasticFastest``; exact and unbiased for float32 inputs)."""


def _is_numpy(xp: Any) -> bool:
    return xp.__name__ == "numpy"


def _i64(xp: Any, a: Any) -> Any:
    return a.astype(xp.int64) if _is_numpy(xp) else a.to(xp.int64)


def _exp2(xp: Any, k: Any) -> Any:
    """Exact 2.0**k as float64 for int64 k in [-1022, 1023], built from bits."""
    bits = (k + 1023) << 52
    return bits.view(xp.float64)


def _clip(xp: Any, a: Any, lo: Any = None, hi: Any = None) -> Any:
    if _is_numpy(xp):
        return xp.clip(a, lo, hi)
    return a.clamp(min=lo, max=hi)


def _where(xp: Any, cond: Any, a: Any, b: Any) -> Any:
    if _is_numpy(xp):
        return xp.where(cond, a, b)
    return xp.where(cond, xp.as_tensor(a, device=cond.device), xp.as_tensor(b, device=cond.device))


def overflow_to_max(rounding: str, negative: Any, saturate: bool) -> Any:
    """Boolean mask: does a finite overflow land on +-max (True) or on the overflow code?"""
    if saturate or rounding == "toward_zero":
        return negative | True
    if rounding == "up":
        return negative
    if rounding == "down":
        return ~negative
    return negative & False


def special_codes(fmt: FloatFormat) -> tuple[int, int, int]:
    """(positive overflow code, positive NaN code, NaN code for negative NaN input).

    Formats without NaN take ml_dtypes' convention for NaN input: the -0 code, sign-flipped by the
    input's sign (so +NaN -> 0x8 and -NaN -> 0x0 in E2M1).  Formats without Inf overflow to NaN,
    and formats without either to max.
    """
    sm = fmt.sign_mask
    if fmt.has_nan:
        nan = fmt.nan_code
        neg_nan = nan if fmt.specials == "fnuz" or not fmt.signed else nan | sm
    else:
        nan, neg_nan = sm, 0
    if fmt.has_inf:
        ovf = fmt.inf_code
    elif fmt.has_nan:
        ovf = nan
    else:
        ovf = fmt.max_code
    return ovf, nan, neg_nan


def round_codes(
    xp: Any,
    x: Any,
    fmt: FloatFormat,
    rounding: str,
    saturate: bool,
    rbits: Any = None,
    want_quantum: bool = False,
) -> Any:
    """Codes (int64) of float64 ``x`` in ``fmt``; ``rbits`` (int64 in [0, 2^32)) for stochastic.

    With ``want_quantum`` also returns the exponent of the grid spacing used for each element.
    """
    m = fmt.mbits
    negative = xp.signbit(x)
    a = xp.abs(x)
    nan = xp.isnan(x)
    inf = xp.isinf(x)
    regular = ~(nan | inf) & (a != 0)
    # Beyond 2^(emax+2) every mode overflows the same way, so clamping keeps results exact and
    # keeps the power-of-two scale below in range.
    a = _where(xp, regular, _clip(xp, a, hi=float(2.0 ** (fmt.emax + 2))), 1.0)
    e = _clip(xp, _i64(xp, xp.frexp(a)[1]) - 1, lo=fmt.emin)
    qe = e - m
    t = a * _exp2(xp, -qe)
    n_f = xp.floor(t)
    f = t - n_f
    n = _i64(xp, n_f)

    if rounding == "nearest_even":
        if m:
            odd = (n & 1) == 1  # the mantissa LSB is the code's LSB
        elif fmt.subnormals:
            odd = (n != 0) & (((e + fmt.bias) & 1) == 1)  # no mantissa: the exponent LSB is the code's
        else:
            odd = n == n  # E8M0 (ml_dtypes >= 0.5.1): the implicit bit is the LSB, so ties go up
        up = (f > 0.5) | ((f == 0.5) & odd)
    elif rounding == "nearest_away":
        up = f >= 0.5
    elif rounding in ("toward_zero", _LO):
        up = f < 0  # all False
    elif rounding == "up":
        up = (f > 0) & ~negative
    elif rounding == "down":
        up = (f > 0) & negative
    elif rounding == _AWAY:
        up = f > 0
    elif rounding == "stochastic":
        if rbits is None:
            raise ValueError("stochastic rounding needs random bits")
        fb = _i64(xp, xp.floor(f * float(2**SR_BITS)))
        up = fb + rbits >= 2**SR_BITS
    else:
        raise ValueError(f"unknown rounding {rounding!r}; known: {', '.join(ROUNDING_MODES)}")
    n = n + _i64(xp, up)
    if not fmt.has_zero:
        n = _clip(xp, n, lo=1)  # nothing below the smallest value: it is the floor
    mag = ((e + fmt.bias) << m) + n - (1 << m)

    ovf_code, nan_code, neg_nan_code = special_codes(fmt)
    base_mode = "nearest_even" if rounding in (_LO, _AWAY, "stochastic") else rounding
    to_max = overflow_to_max(base_mode, negative, saturate)
    over = mag > fmt.max_code
    mag = _where(xp, over, _where(xp, to_max, fmt.max_code, ovf_code), mag)
    mag = _where(xp, inf, fmt.max_code if saturate else ovf_code, mag)
    zero = x == 0
    if fmt.has_zero:
        mag = _where(xp, zero, 0, mag)
    else:
        mag = _where(xp, zero, 0 if saturate else nan_code, mag)

    if fmt.signed:
        keep_sign = negative & (mag != 0) if fmt.specials == "fnuz" else negative
        code = mag | _i64(xp, keep_sign) * fmt.sign_mask
        code = _where(xp, nan, _where(xp, negative, neg_nan_code, nan_code), code)
    else:
        # Unsigned: negative inputs (and -inf) have no code; saturation clamps them to the lowest.
        neg_nonzero = negative & ~zero & ~nan
        code = _where(xp, neg_nonzero, 0 if saturate else nan_code, mag)
        code = _where(xp, nan, nan_code, code)
    if want_quantum:
        return code, qe
    return code
