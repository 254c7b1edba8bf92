"""Compiled float32 stochastic rounding (numba, optional): the numpy backend's arithmetic per element.

The counter hash of :mod:`fp8sim.cast._random` in uint32, the shift classes of
``f32_stochastic_tables``, then the code.  Where the code table has the rebase-and-clip form that
``torch_backend._sr_arith`` checks (``arith[0] >= 0``: E4M3, E5M2, the MX FP4/FP6 formats), one SIMD
loop per block computes every finite element's code, the format's subnormal range included, and
only Inf/NaN go to the exact path.  Elsewhere (E8M0, fnuz without saturation) the loop writes
code-table indices and ORs each run of ``LANE`` elements' exact-path test (Inf/NaN, the format's
subnormal range) into one flag; a second loop looks the codes up and a scalar loop over the flagged
runs lists the exact-path offsets.  Work is split in blocks of ``block`` elements (one task each);
a block's exact-path offsets go at the head of its slice of ``offsets``.  The kernels live at module
level (not in a closure) so that numba's on-disk cache serves every process instead of recompiling
and adding a cache entry per process.
"""

from __future__ import annotations

import numba
import numpy as np

from ._random import _C1, _C2, _C3

u32 = np.uint32


LANE = 64
"""Elements per exact-path flag of the table path (a constant: the per-run loops then index from 0 and
vectorise)."""


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
def _exact_class(x, a, b):  # noqa: ANN001, ANN202
    """1 where x's exponent field is in [a, b) or 255, else 0 (shifts of uint32 lanes, no bools)."""
    ef = u32(u32(x >> u32(23)) & u32(0xFF))
    inside = np.right_shift(u32(u32(ef - b) & u32(u32(ef - a) ^ u32(0xFFFFFFFF))), u32(31))
    return u32(inside | np.right_shift(u32(ef + u32(1)), u32(8)))


# In the per-element helpers below, np.minimum/np.maximum/np.right_shift and masks instead of min/max,
# ``>>`` and bool conditions keep every lane uint32: numba's own forms widen to int64 or branch, which
# measured 2-3x slower.


@numba.njit(inline="always")
def _normal_code(v, drop, off, cap):  # noqa: ANN001, ANN202
    """The sum's exponent and top mantissa bits, rebased and clipped to [0, cap]."""
    mag = np.right_shift(u32(v & u32(0x7FFFFFFF)), drop)
    return np.minimum(u32(np.maximum(mag, off) - off), cap)


@numba.njit(inline="always")
def _subnormal_code(x, h, t, sub_off):  # noqa: ANN001, ANN202
    """The format's subnormal range (fixed grid q): W = floor(|x| / q * 2^32) = M * 2^(ef - t) for the
    24-bit significand M; the magnitude is ``(W + r) >> 32 = n + carry(F + r)`` for ``W = n * 2^32 + F``."""
    ef = u32(u32(x >> u32(23)) & u32(0xFF))
    m24 = u32(u32(x & u32(0x7FFFFF)) | u32(0x800000))
    top = np.maximum(ef, t)
    up = u32(top - t)  # left shift of the significand (0..14)
    down = np.minimum(u32(top - ef), u32(31))  # or right shift (0..23 in the class)
    f = np.right_shift(np.left_shift(m24, up), down)  # W's low word (its high bits shifted out)
    n = np.right_shift(m24, np.minimum(u32(u32(32) - up), u32(31)))  # W's high word
    return u32(u32(n + u32(u32(f + h) < f)) + sub_off)


@numba.njit(nogil=True, cache=True)
def _codes(u, out, base, k0, k1, a, b, sh, arith):  # noqa: ANN001, ANN202
    """Codes in one SIMD loop over the block: the normal-range code from the sum's bits, the
    subnormal-range code (exponent field in [a, b)) from the rule, the sign (``zsign`` for code 0).
    Returns the largest exponent field (255: the block holds Inf/NaN, for the exact path)."""
    drop, off, cap, sign, zsign = u32(arith[0]), u32(arith[1]), u32(arith[2]), u32(arith[3]), u32(arith[4])
    t, sub_off = u32(arith[5]), u32(arith[6])
    dz = u32(sign ^ zsign)
    top = u32(0)
    for k in range(u.size):
        x = u[k]
        h = _hash(u32(base + u32(k)), k0, k1)
        v = _noisy_sum(x, h, b, sh)
        c = _normal_code(v, drop, off, cap)
        ef = u32(u32(x >> u32(23)) & u32(0xFF))
        insub = u32(u32(0) - np.right_shift(u32(u32(ef - b) & u32(u32(ef - a) ^ u32(0xFFFFFFFF))), u32(31)))  # a<=ef<b
        c = u32(c ^ u32(u32(c ^ _subnormal_code(x, h, t, sub_off)) & insub))
        neg = u32(u32(0) - u32(v >> u32(31)))  # v's sign is x's (no carry reaches bit 31 from a finite x)
        nonzero = u32(u32(0) - np.minimum(c, u32(1)))
        out[k] = np.uint8(c | u32(neg & u32(zsign ^ u32(dz & nonzero))))
        top = np.maximum(top, ef)
    return top


@numba.njit(nogil=True, cache=True)
def _specials(u, offsets):  # noqa: ANN001, ANN202
    """Offsets of the Inf/NaN elements (exponent field 255) at the head of ``offsets``; their count."""
    c = 0
    for j in range(u.size):
        if u[j] & u32(0x7F800000) == u32(0x7F800000):
            offsets[c] = j
            c += 1
    return c


@numba.njit(nogil=True, cache=True)
def _indices(u, index, flags, base, k0, k1, a, b, sh):  # noqa: ANN001, ANN202
    for r in range(flags.size):
        ur, ir = u[r * LANE : r * LANE + LANE], index[r * LANE : r * LANE + LANE]
        i0 = u32(base + u32(r * LANE))
        acc = u32(0)
        for k in range(ur.size):
            x = ur[k]
            ir[k] = np.uint16(_noisy_sum(x, _hash(u32(i0 + u32(k)), k0, k1), b, sh) >> u32(16))
            acc |= _exact_class(x, a, b)
        flags[r] = acc


@numba.njit(nogil=True, cache=True)
def _listing(u, flags, offsets, a, b):  # noqa: ANN001, ANN202
    """Offsets of the exact-path elements of the flagged runs at the head of ``offsets``; their count."""
    c = 0
    for r in range(flags.size):
        if flags[r]:
            for j in range(r * LANE, min(r * LANE + LANE, u.size)):
                if _exact_class(u[j], a, b):
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
        if arith[0] >= 0:
            top = _codes(u[s:e], out[s:e], base, k0, k1b, a, b, sh, arith)
            counts[blk] = _specials(u[s:e], offsets[s:e]) if top == u32(0xFF) else 0
        else:
            flags = np.empty(-(-(e - s) // LANE), np.uint32)
            index = np.empty(e - s, np.uint16)
            _indices(u[s:e], index, flags, base, k0, k1b, a, b, sh)
            for j in range(e - s):
                out[s + j] = lo_table[index[j]]
            counts[blk] = _listing(u[s:e], flags, offsets[s:e], a, b)


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
