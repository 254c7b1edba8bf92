"""Compiled tensor-core chains (optional, ``pip install fp8sim[fast]``): the same arithmetic as
:func:`fp8sim.gemm.instructions.align_sum` for finite operands without block scales.

One fused loop per output element: the block's largest exponent, then
``sum(trunc(p * 2^(n - E))) + trunc(c * 2^(n - E))`` in float64 (every term an integer below 2^53,
so exact) and the truncation to ``out_mbits`` fraction bits, without the numpy path's temporaries.
The numpy path stays the reference; ``FP8SIM_NUMBA=0`` turns this one off, and the
tests check both give the same bits.
"""

from __future__ import annotations

import math
import os
from functools import cache
from typing import Any

import numpy as np

__all__ = ["available", "chain_gemm"]


_P2_OFF = 1100  # pow2[x + _P2_OFF] == 2.0**x for -1074 <= x <= 1023 (libm calls per block cost more than the block)


@cache
def _pow2() -> np.ndarray:
    x = np.arange(-_P2_OFF, 2 * _P2_OFF) - 0
    return np.ldexp(1.0, np.clip(x, -1074, 1023)).astype(np.float64)


@cache
def _kernel() -> Any:
    import numba

    # reassociation is exact here (integer-valued terms, sums below 2^53) and lets the sums vectorise
    @numba.njit(parallel=True, nogil=True, cache=True, fastmath={"reassoc", "nsz"})
    def chain(va, ea, vb, eb, block, n, out_mbits, every, p2, out):  # noqa: ANN001, ANN202
        m, kk = va.shape
        nn = vb.shape[0]
        off = 1100
        ti = 8  # rows per task: each column of b is then read from cache 8 times instead of from memory once each
        for t in numba.prange((m + ti - 1) // ti):
            buf = np.empty(1, np.float64)
            bits = buf.view(np.int64)
            for ij in range(nn * min(ti, m - t * ti)):
                j = ij // min(ti, m - t * ti)
                i = t * ti + ij % min(ti, m - t * ti)
                reg = np.float32(0.0)
                c = 0.0
                ec = -126  # floor(log2|c|), floor -126
                for k0 in range(0, kk, block):
                    if every > 0 and k0 > 0 and k0 % every == 0:
                        reg = np.float32(reg + np.float32(c))
                        c = 0.0
                        ec = -126
                    if math.isinf(c):
                        continue  # an overflowed chain stays Inf, as the model's np.where keeps it
                    big = np.int32(ec)
                    for k in range(k0, k0 + block):  # int32 throughout, so the maximum vectorises
                        e = np.int32(ea[i, k] + eb[j, k])
                        big = e if e > big else big
                    unit = p2[n - big + off]
                    total = np.trunc(c * unit)
                    for k in range(k0, k0 + block):
                        total += np.trunc(va[i, k] * vb[j, k] * unit)
                    if total == 0.0:
                        c = 0.0
                        ec = -126
                        continue
                    mag = abs(total)
                    buf[0] = mag
                    ex = ((bits[0] >> 52) & 0x7FF) - 1023 + big - n  # total is an integer: a normal float64
                    if ex > 127:
                        c = math.inf if total > 0 else -math.inf
                        continue
                    qe = max(ex - out_mbits, -126 - out_mbits)
                    r = np.trunc(mag * p2[big - n - qe + off]) * p2[qe + off]
                    c = r if total > 0 else -r
                    ec = max(ex, -126)
                out[i, j] = np.float32(reg + np.float32(c)) if every > 0 else np.float32(c)

    return chain


def available() -> bool:
    """numba is installed and not turned off with ``FP8SIM_NUMBA=0``."""
    if os.environ.get("FP8SIM_NUMBA", "1") == "0":
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def chain_gemm(
    ac: np.ndarray,
    bt: np.ndarray,
    tables_a: tuple[np.ndarray, np.ndarray],
    tables_b: tuple[np.ndarray, np.ndarray],
    block: int,
    frac_bits: int,
    out_mbits: int,
    every: int | None,
) -> np.ndarray:
    """float32 (M, N): chains of ``block``-product steps over K (a multiple of ``block``); ``bt`` is b
    transposed (N, K); tables: per-code (value, exponent) of finite codes; ``every``: promotion interval."""
    va, ea = tables_a[0][ac], tables_a[1].astype(np.int32)[ac]
    vb, eb = tables_b[0][bt], tables_b[1].astype(np.int32)[bt]
    out = np.empty((ac.shape[0], bt.shape[0]), np.float32)
    _kernel()(va, ea, vb, eb, block, frac_bits, out_mbits, every or 0, _pow2(), out)
    return out
