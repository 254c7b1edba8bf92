"""Compiled float32 stochastic rounding (numba, optional): the numpy backend's arithmetic per element.

The counter hash of :mod:`fp8sim.cast._random` in uint32, the shift classes of
``f32_stochastic_tables``, then the code from the sum's upper bits: computed in the same SIMD loop
where the code table has the rebase-and-clip form that ``torch_backend._sr_arith`` checks
(``arith[0] >= 0``), else looked up in the table in a second loop.  Work is split in blocks of
``block`` elements (one task each); within a block, the SIMD loop ORs each run of ``LANE``
elements' exact-path test (Inf/NaN, the format's subnormal range) into one flag, and a scalar loop
over the flagged runs lists those elements' offsets at the head of the block's slice of ``offsets``.
The kernels live at module level (not in a closure) so that numba's on-disk cache is reused by every
process instead of recompiling and adding a cache entry per process.
"""

from __future__ import annotations

import numba
import numpy as np

from ._random import _C1, _C2, _C3

u32 = np.uint32


LANE = 64
"""Elements per exact-path flag (a constant: the per-run loops then index from 0 and vectorise)."""


@numba.njit(inline="always")
def _hash(i, k0, k1):  # noqa: ANN001, ANN202 - uint32 throughout: LLVM vectorises it
    """The random bits of counter ``i`` (``_random._numpy_mix``; the high-index word is in ``k1``)."""
    h = u32(i * u32(_C3))
    h = u32(h ^ k0)
    h = u32(h * u32(_C1))
    h = u32(h ^ u32(h >> u32(15)))
    h = u32(h ^ k1)
    h = u32(h * u32(_C2))
    return u32(h ^ u32(h >> u32(16)))


@numba.njit(inline="always")
def _noisy_sum(x, h, b, sh):  # noqa: ANN001, ANN202
    """``x`` plus the random bits ``h`` shifted for x's class (none below exponent field b)."""
    noisy = u32(u32(0) - u32(u32(u32(x >> u32(23)) & u32(0xFF)) >= b))  # all ones where the shift is sh
    return u32(x + u32(np.right_shift(h, sh) & noisy))  # np.right_shift: a 32-bit shift, not numba's int64 one


@numba.njit(inline="always")
def _exact_class(x, a, wa):  # noqa: ANN001, ANN202 - exponent field in [a, a + wa) or 255
    ef = u32(u32(x >> u32(23)) & u32(0xFF))
    return u32(u32(u32(ef - a) < wa) | u32(ef == u32(0xFF)))


@numba.njit(nogil=True, cache=True)
def _codes(u, out, flags, base, k0, k1, a, b, sh, arith):  # noqa: ANN001, ANN202
    """Codes in the SIMD loop.  Normal range: the sum's exponent and top mantissa bits, rebased and
    clipped.  The format's subnormal range (exponent field in [a, b)) has a fixed grid, so there the
    rule itself: with W = floor(|x| / q * 2^32) (q the grid spacing), the magnitude is
    ``(W + r) >> 32``, i.e. ``n + carry(F + r)`` for ``W = n * 2^32 + F``, all in uint32 lanes.
    Only Inf/NaN are flagged for the exact path."""
    drop, off, cap, sign, zsign = u32(arith[0]), u32(arith[1]), u32(arith[2]), u32(arith[3]), u32(arith[4])
    t, sub_off = u32(arith[5]), u32(arith[6])  # W = M * 2^(ef - t); the code of magnitude 0's offset
    wa = u32(b - a)
    for r in range(flags.size):
        ur, outr = u[r * LANE : r * LANE + LANE], out[r * LANE : r * LANE + LANE]
        i0 = u32(base + u32(r * LANE))
        acc = u32(0)
        for k in range(ur.size):
            x = ur[k]
            h = _hash(u32(i0 + u32(k)), k0, k1)
            v = _noisy_sum(x, h, b, sh)
            mag = np.right_shift(u32(v & u32(0x7FFFFFFF)), drop)  # exponent and top mantissa bits
            c = u32(min(u32(u32(max(mag, off)) - off), cap))  # clip(mag - off, 0, cap) in unsigned lanes
            ef = u32(u32(x >> u32(23)) & u32(0xFF))
            m24 = u32(u32(x & u32(0x7FFFFF)) | u32(0x800000))
            up = u32(u32(max(ef, t)) - t)  # left shift of the significand (0..14)
            down = u32(min(u32(u32(max(ef, t)) - ef), u32(31)))  # or right shift (0..23 in the class)
            f = np.right_shift(np.left_shift(m24, up), down)  # W's low word (its high bits shifted out)
            n = np.right_shift(m24, u32(min(u32(u32(32) - up), u32(31))))  # W's high word
            csub = u32(u32(n + u32(u32(f + h) < f)) + sub_off)
            c = csub if u32(ef - a) < wa else c
            neg = u32(u32(0) - u32(v >> u32(31)))  # v == x outside the noisy class
            outr[k] = np.uint8(c | (neg & (sign if c != u32(0) else zsign)))
            acc |= u32(ef == u32(0xFF))
        flags[r] = acc


@numba.njit(nogil=True, cache=True)
def _indices(u, index, flags, base, k0, k1, a, b, sh):  # noqa: ANN001, ANN202
    wa = u32(b - a)
    for r in range(flags.size):
        ur, ir = u[r * LANE : r * LANE + LANE], index[r * LANE : r * LANE + LANE]
        i0 = u32(base + u32(r * LANE))
        acc = u32(0)
        for k in range(ur.size):
            x = ur[k]
            ir[k] = np.uint16(_noisy_sum(x, _hash(u32(i0 + u32(k)), k0, k1), b, sh) >> u32(16))
            acc |= _exact_class(x, a, wa)
        flags[r] = acc


@numba.njit(nogil=True, cache=True)
def _listing(u, flags, offsets, a, wa):  # noqa: ANN001, ANN202
    c = 0
    for r in range(flags.size):
        if flags[r]:
            for j in range(r * LANE, min(r * LANE + LANE, u.size)):
                if _exact_class(u[j], a, wa):
                    offsets[c] = j
                    c += 1
    return c


@numba.njit(parallel=True, nogil=True, cache=True)
def sr(u, lo_table, arith, k0, k1, a, b, sh, block, out, offsets, counts):  # noqa: ANN001, ANN201
    """Codes of float32 bits ``u`` into ``out``; ``counts[i]`` exact-path offsets head block i's slice."""
    n = u.size
    for blk in numba.prange(counts.size):
        s = blk * block
        e = min(s + block, n)
        hi = u32(((np.int64(s) >> 32) * _C3) & 0xFFFFFFFF)  # the hash's high-index word, fixed per block
        base, k1b = u32(s & 0xFFFFFFFF), u32(k1 ^ hi)
        flags = np.empty(-(-(e - s) // LANE), np.uint32)
        if arith[0] >= 0:
            _codes(u[s:e], out[s:e], flags, base, k0, k1b, a, b, sh, arith)
            wa = u32(0)  # only Inf/NaN left for the exact path
        else:
            wa = u32(b - a)
            index = np.empty(e - s, np.uint16)
            _indices(u[s:e], index, flags, base, k0, k1b, a, b, sh)
            for j in range(e - s):
                out[s + j] = lo_table[index[j]]
        counts[blk] = _listing(u[s:e], flags, offsets[s:e], a, wa)


@numba.njit(nogil=True, cache=True)
def gather(offsets, counts, block):  # noqa: ANN001, ANN201
    """Flat indices of the exact-path elements that :func:`sr` listed, in order."""
    index = np.empty(counts.sum(), np.int64)
    j = 0
    for blk in range(counts.size):
        s = blk * block
        for k in range(counts[blk]):
            index[j] = s + np.int64(offsets[s + k])
            j += 1
    return index
