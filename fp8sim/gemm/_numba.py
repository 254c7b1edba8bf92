"""Compiled tensor-core chains (optional, ``pip install fp8sim[fast]``): the same arithmetic as
:func:`fp8sim.gemm.instructions.align_sum` for finite operands without block scales.

Per K-block of each output: the block's largest exponent E, then
``sum(trunc(p * 2^(n - E))) + trunc(c * 2^(n - E))`` and the truncation to ``out_mbits`` fraction
bits, without the numpy path's temporaries.  The main kernel runs SIMD across 64 output columns
(8-row x 64-column tasks, so a K-block of a and b stays in L1): float32 products scaled by a float32
unit (exact for FP8: at most 8 significant bits) truncated into int32 sums (exact while
``block * 2^(n+1)`` fits), everything else branch-free over the lanes.  Where those widths would not
be exact (:func:`_lanes_exact`), a per-output float64 kernel runs instead.
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


@cache
def _kernel_lanes() -> Any:
    import numba

    # SIMD across 64 output columns: each step is a branch-free loop over the lanes jj (selects, not
    # branches); powers of two and exponents go through the int64/float64 views of one buffer.  No
    # fastmath: (va * vb) * unit must stay in that order (exact); the int32 sums vectorise as they are.
    @numba.njit(parallel=True, nogil=True, cache=True)
    def chain(va, ea, vb, eb, block, n, out_mbits, every, out):  # noqa: ANN001, ANN202
        kk = va.shape[1]
        m = out.shape[0]
        ntj = vb.shape[0]
        nn = out.shape[1]
        for t in numba.prange(((m + 7) // 8) * ntj):
            ti = t // ntj
            i0 = ti * 8
            tj = t % ntj
            j0 = tj * 64
            ni = min(8, m - i0)
            nj = min(64, nn - j0)
            cs = np.zeros((8, 64), np.float64)
            ecs = np.full((8, 64), -126, np.int32)
            regs = np.zeros((8, 64), np.float32)
            big = np.empty(64, np.int32)
            ex = np.empty(64, np.int32)
            tot = np.empty(64, np.int32)
            ib = np.empty(64, np.int64)
            fb = ib.view(np.float64)
            u32 = np.empty(64, np.float32)
            u64 = np.empty(64, np.float64)
            tf = np.empty(64, np.float64)
            sc = np.empty(64, np.float64)
            for k0 in range(0, kk, block):
                promote = every > 0 and k0 > 0 and k0 % every == 0
                for ii in range(ni):
                    if promote:
                        for jj in range(nj):
                            regs[ii, jj] = np.float32(regs[ii, jj] + np.float32(cs[ii, jj]))
                            cs[ii, jj] = 0.0
                            ecs[ii, jj] = -126
                    for jj in range(nj):
                        big[jj] = ecs[ii, jj]
                    for k in range(k0, k0 + block):
                        eai = ea[ti, k, ii]
                        for jj in range(nj):
                            e = eai + eb[tj, k, jj]
                            big[jj] = e if e > big[jj] else big[jj]
                    for jj in range(nj):  # unit = 2^(n - big)
                        ib[jj] = np.int64(n - big[jj] + 1023) << 52
                    for jj in range(nj):  # float32 copy clamped at 2^127: above it every product is 0
                        u64[jj] = fb[jj]
                        u32[jj] = np.float32(min(fb[jj], 1.7014118346046923e38))
                        tot[jj] = 0
                    for k in range(k0, k0 + block):
                        vai = va[ti, k, ii]
                        for jj in range(nj):  # exact product, exact scaling, truncation toward zero
                            tot[jj] += np.int32((vai * vb[tj, k, jj]) * u32[jj])
                    for jj in range(nj):
                        tf[jj] = np.float64(tot[jj]) + np.trunc(cs[ii, jj] * u64[jj])
                        fb[jj] = abs(tf[jj])
                    for jj in range(nj):  # exponent of the value, then the grid 2^qe
                        ex[jj] = np.int32(((ib[jj] >> 52) & 0x7FF) - 1023) + big[jj] - n
                        tot[jj] = max(ex[jj] - out_mbits, -126 - out_mbits)
                    for jj in range(nj):
                        ib[jj] = np.int64(big[jj] - n - tot[jj] + 1023) << 52
                    for jj in range(nj):
                        sc[jj] = fb[jj]
                        ib[jj] = np.int64(min(tot[jj], 1023) + 1023) << 52
                    for jj in range(nj):
                        r = np.trunc(abs(tf[jj]) * sc[jj]) * fb[jj]
                        r = math.inf if ex[jj] > 127 else r
                        cs[ii, jj] = -r if tf[jj] < 0 else r
                        ecs[ii, jj] = min(max(ex[jj], -126), 127)  # 127 keeps an Inf chain's unit finite
            for ii in range(ni):
                for jj in range(nj):
                    c = cs[ii, jj]
                    out[i0 + ii, j0 + jj] = np.float32(regs[ii, jj] + np.float32(c)) if every > 0 else np.float32(c)

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
    out = np.zeros((ac.shape[0], bt.shape[0]), np.float32)  # zeros: an output the kernel missed shows
    if _lanes_exact(tables_a, tables_b, block, frac_bits):
        pa = _panels(ac, 8)
        va, ea = tables_a[0].astype(np.float32)[pa], tables_a[1].astype(np.int32)[pa]
        pb = _panels(bt, 64)
        vb, eb = tables_b[0].astype(np.float32)[pb], tables_b[1].astype(np.int32)[pb]
        _kernel_lanes()(va, ea, vb, eb, block, frac_bits, out_mbits, every or 0, out)
        return out
    va, ea = tables_a[0][ac], tables_a[1].astype(np.int32)[ac]
    vb, eb = tables_b[0][bt], tables_b[1].astype(np.int32)[bt]
    _kernel()(va, ea, vb, eb, block, frac_bits, out_mbits, every or 0, _pow2(), out)
    return out


def _panels(x: np.ndarray, w: int) -> np.ndarray:
    """(R, K) codes as (R/w, K, w) panels, zero-padded (code 0 is +0): one task's K-block is then
    contiguous (rows K apart would fall into the same few L1 sets and evict each other)."""
    nt = -(-x.shape[0] // w)
    p = np.zeros((nt * w, x.shape[1]), x.dtype)
    p[: x.shape[0]] = x
    return np.ascontiguousarray(p.reshape(nt, w, -1).transpose(0, 2, 1))


def _lanes_exact(ta: tuple[np.ndarray, np.ndarray], tb: tuple[np.ndarray, np.ndarray], block: int, n: int) -> bool:
    """The lane kernel's float32/int32 arithmetic is exact: products of two values fit float32's 24
    bits, a nonzero product's exponent is at least ``n - 127`` (so the float32 unit never needs to
    exceed 2^127), and ``block`` truncated terms below 2^(n+1) fit int32."""

    def sig_bits(v: np.ndarray) -> int:
        return _bits(np.abs(v[np.isfinite(v) & (v != 0)]))

    na, nb = ta[0] != 0, tb[0] != 0
    min_e = int(ta[1][na & np.isfinite(ta[0])].min()) + int(tb[1][nb & np.isfinite(tb[0])].min())
    return sig_bits(ta[0]) + sig_bits(tb[0]) <= 24 and min_e >= n - 127 and block * (2 ** (n + 1) - 1) <= 2**31 - 1


def _bits(m: np.ndarray) -> int:
    """Significant bits of the widest of the (positive, finite) values ``m``."""
    mant = np.frexp(m)[0] * 2.0**53  # an integer below 2^53
    widest = 0
    for x in np.unique(mant.astype(np.int64)):
        x = int(x)
        widest = max(widest, x.bit_length() - (x & -x).bit_length() + 1)
    return widest
