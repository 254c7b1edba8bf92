"""Which rule made this output?  Infer the rounding rule, format and overflow policy of a captured cast or
elementwise output from its input.

``infer_rule(x, y)``: ``x`` is what the kernel rounded (float32 or float64: the exact value before the
cast, e.g. an RMSNorm computed in float64), ``y`` what it wrote.  Every candidate ``(format, rule,
saturation)`` rounds ``x`` and counts the elements on which it gives ``y``'s value (NaN matches NaN, and
-0 only -0).  Rules: the five deterministic modes of :mod:`fp8sim.cast` (``nearest_even`` RN-even,
``nearest_away`` RN-away, ``toward_zero`` RZ, ``up`` RU, ``down`` RD) and ``stochastic``: SR-compatible,
every output one of the input's two neighbours in the format (RD or RU), which any stochastic rounding
satisfies.  Saturation: ``satfinite`` (overflow and Inf to +-max) or non-saturating (IEEE; see
:func:`fp8sim.cast.encode`).  Formats: every fp8sim format (through :func:`fp8sim.cast.encode`) and the
IEEE ``bfloat16``, ``float16``, ``float32`` (rounded here from their two neighbours).  NaN inputs carry no
rounding rule: they are left out of the fractions and reported apart (bit truncation turns some NaNs
into Inf, aiter#5151's ``OPUS_FP32_to_BF16_DEFAULT=2``).

The result (:class:`Inference`) lists every candidate with the fraction it explains, best first: the
deterministic rules that explain every element (several when the data cannot tell them apart: no ties,
no overflow), else an SR-compatible verdict, else the closest candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor
from ..cast import decode, encode
from ..formats import FORMATS, get_format
from ._inference import Candidate, Inference

__all__ = ["infer_rule", "RULES", "WIDE_FORMATS"]

RULES = {"nearest_even": "RN-even", "nearest_away": "RN-away", "toward_zero": "RZ", "up": "RU", "down": "RD"}
SR = "stochastic"
WIDE_FORMATS = ("bfloat16", "float16", "float32")
_WIDE_ALIASES = {"bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16", "fp32": "float32"}


# ---- inputs -------------------------------------------------------------------------------------------------
def _np(x: Any) -> np.ndarray:
    if is_torch_tensor(x):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            import ml_dtypes

            return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if x.is_floating_point() and x.dtype not in (torch.float16, torch.float32, torch.float64):
            fmt = next((f for f in FORMATS.values() if f.torch_dtype == x.dtype), None)
            if fmt is None or fmt.ml_dtype is None:
                raise TypeError(f"y has dtype {x.dtype}, which fp8sim has no format for")
            return x.view(torch.uint8).numpy().view(fmt.ml_dtype)
        return x.numpy()
    return np.asarray(x)


def _format_of_dtype(dt: np.dtype) -> str | None:
    """The format a float dtype stores (None for float64 or an unknown dtype)."""
    if dt == np.float16:
        return "float16"
    if dt == np.float32:
        return "float32"
    if dt.name == "bfloat16":
        return "bfloat16"
    return next((f.name for f in FORMATS.values() if f.ml_dtypes_name == dt.name), None)


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"format must be a format name or a list of them; got {name!r}")
    low = name.lower()
    if low in WIDE_FORMATS or low in _WIDE_ALIASES:
        return _WIDE_ALIASES.get(low, low)
    try:
        return get_format(low).name
    except (ValueError, KeyError):
        known = ", ".join([*FORMATS, *WIDE_FORMATS])
        raise ValueError(f"unknown format {name!r}; known: {known}") from None


def _wide_dtype(name: str) -> tuple[Any, Any]:
    import ml_dtypes

    return {"bfloat16": (ml_dtypes.bfloat16, np.uint16), "float16": (np.float16, np.uint16)}.get(
        name, (np.float32, np.uint32)
    )


def _y_values(y: np.ndarray, fmt: str) -> np.ndarray:
    """float64 values of ``y``: float data as they are, integer data as codes of ``fmt``."""
    if y.dtype.kind in "iu":
        if fmt in WIDE_FORMATS:
            dt, ut = _wide_dtype(fmt)
            if y.dtype.itemsize != np.dtype(ut).itemsize:
                raise ValueError(f"y holds {y.dtype} codes, but {fmt} codes are {np.dtype(ut).itemsize * 8}-bit")
            return y.astype(ut, copy=False).view(dt).astype(np.float64)
        return decode(y.astype(np.uint8), fmt).astype(np.float64)
    with np.errstate(invalid="ignore"):  # signalling NaN payloads
        return y.astype(np.float64)


# ---- candidates ---------------------------------------------------------------------------------------------
def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    b = bits.astype(np.int64)
    sign = 1 << (width - 1)
    return np.where(b & sign, -(b ^ sign) - 1, b)  # -0 -> -1, +0 -> 0: one step apart, like the values


def _from_ordered(k: np.ndarray, width: int) -> np.ndarray:
    return np.where(k >= 0, k, (-(k + 1)) | (1 << (width - 1)))


def _wide_rounded(x: np.ndarray, name: str) -> dict[tuple[str, bool], np.ndarray]:
    """Values of ``x`` (float64, no NaN) under every mode and saturation in an IEEE format, from the two
    neighbours ``lo <= x <= hi`` (ties: the even code for RN-even, the larger magnitude for RN-away)."""
    dt, ut = _wide_dtype(name)
    width = np.dtype(ut).itemsize * 8
    fi = _ml_finfo(dt)
    big, ulp_max = float(fi.max), float(fi.eps) * 2.0 ** (fi.maxexp - 1)  # ulp_max: the spacing below max
    fin = np.isfinite(x) & (np.abs(x) <= big)
    xs = np.where(fin, x, 0.0)
    t = xs.astype(dt)  # a neighbour of x (RN, possibly through float32: still one of the two)
    k = _ordered(t.view(ut), width)
    tv = t.astype(np.float64)
    k_lo = np.where(tv > xs, k - 1, k)
    k_hi = np.where(tv < xs, k + 1, k)
    codes_lo, codes_hi = _from_ordered(k_lo, width), _from_ordered(k_hi, width)
    lo = codes_lo.astype(ut).view(dt).astype(np.float64)
    hi = codes_hi.astype(ut).view(dt).astype(np.float64)
    mid = (lo + hi) / 2  # exact: adjacent values of a format of at most 24 bits
    even_lo = (codes_lo & 1) == 0
    tie = xs == mid
    nearest = np.where(xs < mid, lo, hi)
    pos = xs > 0
    ups = {"nearest_even": np.where(tie, np.where(even_lo, lo, hi), nearest)}
    ups["nearest_away"] = np.where(tie, np.where(pos, hi, lo), nearest)
    ups["toward_zero"] = np.where(pos, lo, hi)
    ups["up"], ups["down"] = hi, lo
    neg, inf = np.signbit(x), np.isinf(x)
    over = ~fin & ~np.isnan(x)  # finite overflow or Inf
    out = {}
    for mode, v in ups.items():
        for sat in (True, False):
            if sat:
                ov = np.where(neg, -big, big)
            else:
                to_inf = {
                    "nearest_even": np.abs(x) >= big + ulp_max / 2,
                    "nearest_away": np.abs(x) >= big + ulp_max / 2,
                    "toward_zero": np.zeros(x.shape, bool),
                    "up": ~neg,
                    "down": neg,
                }[mode] | inf
                ov = np.where(to_inf, np.where(neg, -np.inf, np.inf), np.where(neg, -big, big))
            out[mode, sat] = np.where(over, ov, v)
    return out


def _ml_finfo(dt: Any) -> Any:
    import ml_dtypes

    return ml_dtypes.finfo(dt)


def _fp8sim_rounded(x: np.ndarray, name: str) -> dict[tuple[str, bool], np.ndarray]:
    f = FORMATS[name]
    return {
        (mode, sat): decode(encode(x, f, rounding=mode, saturate=sat), f).astype(np.float64)
        for mode in RULES
        for sat in (True, False)
    }


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def _sat_name(sat: bool) -> str:
    return "satfinite" if sat else "non-saturating"


def infer_rule(
    x: Any,
    y: Any,
    *,
    format: str | Sequence[str] | None = None,  # noqa: A002 - the word users know (torch, ml_dtypes)
    rules: Sequence[str] = (*RULES, SR),
) -> Inference:
    """Which ``(format, rounding rule, saturation)`` turns ``x`` into ``y``, elementwise.

    ``x``: the values the kernel rounded (numpy or torch, float16/bfloat16/float32/float64); ``y``: its
    output, the same shape, as a typed array (torch or numpy/ml_dtypes: bfloat16, float16, float32, the
    float8 types; its dtype names the format) or as integer codes (then ``format`` is required).
    ``format``: a name or a list of names to try (fp8sim formats and ``bfloat16``, ``float16``,
    ``float32``); values in a wider dtype (float32 holding E4M3 values) are compared as values.
    ``rules``: among ``nearest_even``, ``nearest_away``, ``toward_zero``, ``up``, ``down``, ``stochastic``.
    """
    xa, ya = _np(x), _np(y)
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have the same shape; got {xa.shape} and {ya.shape}")
    if xa.dtype.kind not in "fV" or (xa.dtype.kind == "V" and _format_of_dtype(xa.dtype) is None):
        raise TypeError(f"x must be a float array or tensor; got dtype {xa.dtype}")
    bad = [r for r in rules if r not in RULES and r != SR]
    if bad or not rules:
        raise ValueError(f"rules must be among {', '.join([*RULES, SR])}; got {list(rules)}")
    if format is None:
        fmt = _format_of_dtype(ya.dtype)
        if fmt is None or ya.dtype.kind in "iu":
            raise ValueError(f"y has dtype {ya.dtype}, which names no format: pass format= (e.g. format='e4m3')")
        if ya.dtype == xa.dtype:
            raise ValueError(f"y has x's own dtype {ya.dtype}: pass format= (the format its values were rounded to)")
        formats = [fmt]
    else:
        formats = [_canonical(f) for f in ([format] if isinstance(format, str) else list(format))]
        if not formats:
            raise ValueError("format is an empty list; pass a format name or a list of them")
        if ya.dtype.kind in "iu" and len(formats) != 1:
            raise ValueError(f"y holds integer codes: pass exactly one format, not {formats}")
    with np.errstate(invalid="ignore"):  # signalling NaN payloads
        x64 = xa.astype(np.float64).reshape(-1)
    nan_in = np.isnan(x64)
    keep = ~nan_in
    xk = x64[keep]
    narrow = xa.dtype != np.float64  # float32 holds it exactly: the cast's table path
    x_cast = xa.reshape(-1).astype(np.float32)[keep] if narrow else xk
    n = int(keep.sum())
    cands: list[Candidate] = []
    notes: list[str] = []
    for fmt in formats:
        yv = _y_values(ya, fmt).reshape(-1)
        got = yv[keep]
        table = _wide_rounded(xk, fmt) if fmt in WIDE_FORMATS else _fp8sim_rounded(x_cast, fmt)
        for sat in (True, False):
            for mode in rules:
                if mode == SR:
                    ok = _same(got, table["down", sat]) | _same(got, table["up", sat])
                    name, det = f"{fmt} SR-compatible (RD or RU), {_sat_name(sat)}", False
                else:
                    ok = _same(got, table[mode, sat])
                    name, det = f"{fmt} {RULES[mode]} ({mode}), {_sat_name(sat)}", True
                frac = float(ok.mean()) if n else 1.0
                cands.append(Candidate(name, frac, det, {"format": fmt, "rounding": mode, "saturate": sat}))
        if nan_in.any():
            out_nan = int(np.isnan(yv[nan_in]).sum())
            notes.append(
                f"{int(nan_in.sum())} NaN inputs (not counted): {out_nan} gave NaN in {fmt}, "
                f"{int(np.isinf(yv[nan_in]).sum())} Inf, {int(np.isfinite(yv[nan_in]).sum())} a number"
            )
    order = {m: i for i, m in enumerate([*RULES, SR])}
    cands.sort(key=lambda c: (-c.fraction, not c.deterministic, order[c.params["rounding"]], not c.params["saturate"]))
    return Inference("rule", n, tuple(cands), tuple(notes))
