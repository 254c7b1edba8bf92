"""numpy reference backend: exact, vectorised, chunked so each pass stays in cache."""

from __future__ import annotations

import numpy as np

from ..formats import FloatFormat
from ._random import numpy_bits, numpy_bits_at
from ._rounding import round_codes
from ._tables import SR_EXACT, f16_code_table, f32_code_table, f32_stochastic_tables, f32_table_ok

_CHUNK = 1 << 16  # elements per pass: measured fastest on 2 cores (benchmarks/README.md)
_CHUNK64 = 1 << 18


def encode(x: np.ndarray, fmt: FloatFormat, rounding: str, saturate: bool, seed: int | None) -> np.ndarray:
    """Codes (uint8, same shape) of a float16/float32/float64 array; bfloat16 arrives as float32."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.shape, np.uint8)
    if flat.dtype == np.float16 and rounding != "stochastic":
        np.take(f16_code_table(fmt, rounding, saturate), flat.view(np.uint16), out=out)
    elif flat.dtype in (np.float16, np.float32) and f32_table_ok(fmt):
        flat = flat.astype(np.float32, copy=False)
        if rounding == "stochastic":
            _encode_f32_stochastic(flat, out, fmt, saturate, seed)
        else:
            _encode_f32_table(flat, out, f32_code_table(fmt, rounding, saturate))
    else:
        _encode_exact(flat, out, fmt, rounding, saturate, seed)
    return out.reshape(x.shape)


def encode_scaled_with_amax(
    x: np.ndarray, scale: np.float32, fmt: FloatFormat, saturate: bool = True
) -> tuple[np.ndarray, np.float32]:
    """``encode(fl32(x * scale))`` with nearest-even rounding, fused with TE's amax of the unscaled
    float32 ``x`` (max|x|, NaN skipped, 0 if empty): one pass over memory instead of three."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(flat.shape, np.uint8)
    amax = np.float32(0)
    if not f32_table_ok(fmt):
        with np.errstate(invalid="ignore", over="ignore"):
            _encode_exact(flat * np.float32(scale), out, fmt, "nearest_even", saturate, None)
        hi = np.fmax.reduce(flat, initial=np.float32(0)) if flat.size else np.float32(0)
        lo = np.fmin.reduce(flat, initial=np.float32(0)) if flat.size else np.float32(0)
        return out.reshape(x.shape), np.float32(max(hi, -lo))
    table = f32_code_table(fmt, "nearest_even", saturate)
    c = min(flat.size, _CHUNK)
    buf = np.empty(c, np.float32)
    u_buf = buf.view(np.uint32)
    idx, tmp = np.empty(c, np.uint32), np.empty(c, np.uint32)
    for s in range(0, flat.size, _CHUNK):
        part = flat[s : s + _CHUNK]
        k = part.size
        amax = max(amax, np.fmax.reduce(part, initial=np.float32(0)), -np.fmin.reduce(part, initial=np.float32(0)))
        with np.errstate(invalid="ignore", over="ignore"):
            np.multiply(part, scale, out=buf[:k])
        _f32_class_index(u_buf[:k], idx[:k], tmp[:k])
        np.take(table, idx[:k], out=out[s : s + k])
    return out.reshape(x.shape), np.float32(amax)


def _f32_class_index(u: np.ndarray, idx: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """``upper16 << 1 | sticky``: bit 15 lands in bit 0, where it is also a sticky bit."""
    np.right_shift(u, 15, out=idx)
    np.bitwise_and(u, 0x7FFF, out=tmp)
    np.minimum(tmp, 1, out=tmp)
    np.bitwise_or(idx, tmp, out=idx)
    return idx


def _encode_f32_table(flat: np.ndarray, out: np.ndarray, table: np.ndarray) -> None:
    n = flat.size
    u_all = flat.view(np.uint32)
    idx = np.empty(min(n, _CHUNK), np.uint32)
    tmp = np.empty_like(idx)
    for s in range(0, n, _CHUNK):
        u = u_all[s : s + _CHUNK]
        k = u.size
        _f32_class_index(u, idx[:k], tmp[:k])
        np.take(table, idx[:k], out=out[s : s + k])


def _encode_f32_stochastic(flat: np.ndarray, out: np.ndarray, fmt: FloatFormat, saturate: bool, seed: int) -> None:
    shift_table, lo_table = f32_stochastic_tables(fmt, saturate)
    n = flat.size
    u_all = flat.view(np.uint32)
    c = min(n, _CHUNK)
    exp, v = np.empty(c, np.uint32), np.empty(c, np.uint32)
    shift = np.empty(c, np.uint8)
    exact: list[np.ndarray] = []
    for s in range(0, n, _CHUNK):
        u = u_all[s : s + _CHUNK]
        k = u.size
        np.right_shift(u, 23, out=exp[:k])
        np.take(shift_table, exp[:k], out=shift[:k])
        if shift[:k].max() == SR_EXACT:
            exact.append(s + np.flatnonzero(shift[:k] == SR_EXACT))
        r = numpy_bits(seed, s, k)
        np.right_shift(r, shift[:k], out=v[:k])
        np.add(v[:k], u, out=v[:k])
        np.right_shift(v[:k], 16, out=v[:k])
        np.take(lo_table, v[:k], out=out[s : s + k])
    if exact:
        index = np.concatenate(exact)
        with np.errstate(invalid="ignore"):
            x64 = flat[index].astype(np.float64)
        rbits = numpy_bits_at(seed, index).astype(np.int64)
        out[index] = round_codes(np, x64, fmt, "stochastic", saturate, rbits)


def _encode_exact(
    flat: np.ndarray, out: np.ndarray, fmt: FloatFormat, rounding: str, saturate: bool, seed: int | None
) -> None:
    for s in range(0, flat.size, _CHUNK64):
        with np.errstate(invalid="ignore"):
            part = flat[s : s + _CHUNK64].astype(np.float64)
        rbits = numpy_bits(seed, s, part.size).astype(np.int64) if rounding == "stochastic" else None
        out[s : s + part.size] = round_codes(np, part, fmt, rounding, saturate, rbits)
