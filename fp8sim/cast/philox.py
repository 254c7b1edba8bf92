"""Philox4x32-10 (Salmon et al., SC'11; Random123), vectorized in numpy, and the random-word stream of
TE's stochastic rounding.

One Philox call maps a 128-bit counter ``(c0, c1, c2, c3)`` and a 64-bit key ``(k0, k1)`` to four
uint32 words through ``rounds`` rounds (10 by default)::

    hi0:lo0 = 0xD2511F53 * c0        hi1:lo1 = 0xCD9E8D57 * c2        (32x32 -> 64-bit products)
    c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);  k += (0x9E3779B9, 0xBB67AE85)   (between rounds)

TE's ``curanddx::detail::philox4x32_native_state`` (``common/util/curanddx.hpp``) keys with
``(seed & 0xFFFFFFFF, seed >> 32)`` and starts at the 128-bit counter ``subsequence * 2^64 + offset``;
each ``generate4()`` returns the four words of the current counter and adds 1.  TE's NVFP4 kernels take
the words in that order, one per ``cvt.rs...x4`` (``common/cast/nvfp4/core_nvfp4.cuh`` ``get_rbits``).
Note: cuRAND's ``curand_init(seed, subsequence, offset)`` counts ``offset`` in 32-bit outputs, TE's
``init`` in 128-bit blocks; torch's CUDA generator hands TE ``(seed, offset)`` through
``philox_cuda_state``.  Which ``subsequence`` each thread of a TE kernel uses is not emulated here.
"""

from __future__ import annotations

import numpy as np

from .._util.args import as_int

__all__ = ["MAX_ROUNDS", "PHILOX_M", "PHILOX_W", "philox4x32", "te_philox_words"]

PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
_MASK = np.uint64(0xFFFFFFFF)
MAX_ROUNDS = 64  # Random123 defines 7 to 10; a round count is never a size, so keep it small


def _u32(x: object, name: str, shape_tail: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "ui" or arr.shape[-1:] != (shape_tail,):
        raise ValueError(f"{name} must be integers with a last dim of {shape_tail}; got {arr.dtype} {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError(f"{name} words must lie in [0, 2^32)")
    return arr.astype(np.uint64)


def philox4x32(counter: object, key: object, rounds: int = 10) -> np.ndarray:
    """Philox4x32-``rounds`` of ``counter`` (``(..., 4)`` uint32 words, c0 first) under ``key`` (``(..., 2)``,
    broadcast against the counters); returns ``(..., 4)`` uint32."""
    rounds = as_int(rounds, "rounds", lo=1, hi=MAX_ROUNDS, what="Philox4x32-10 has 10")
    c = _u32(counter, "counter", 4)
    k = _u32(key, "key", 2)
    c0, c1, c2, c3 = (c[..., i] for i in range(4))
    k0, k1 = np.broadcast_to(k[..., 0], c0.shape).copy(), np.broadcast_to(k[..., 1], c0.shape).copy()
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    w0, w1 = np.uint64(PHILOX_W[0]), np.uint64(PHILOX_W[1])
    for r in range(rounds):
        p0, p1 = m0 * c0, m1 * c2  # < 2^64: exact in uint64
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & _MASK, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & _MASK
        if r < rounds - 1:
            k0, k1 = (k0 + w0) & _MASK, (k1 + w1) & _MASK
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def te_philox_words(seed: int, offset: int, count: int, *, subsequence: int = 0, rounds: int = 10) -> np.ndarray:
    """The first ``count`` uint32 words a TE ``philox4x32_native_state`` initialised with
    ``init(seed, subsequence, offset)`` hands out through ``generate4()`` (module docstring)."""
    for name, v in (("seed", seed), ("offset", offset), ("subsequence", subsequence)):
        as_int(v, name, lo=0, hi=2**64 - 1)
    as_int(count, "count", lo=0)
    blocks = -(-int(count) // 4)
    start = int(subsequence) * 2**64 + int(offset)
    ctr = [(start + i) % 2**128 for i in range(blocks)] if blocks < 4096 else None
    if ctr is None:  # large draws: 128-bit increments in uint64 halves
        lo0, hi0 = np.uint64(start & (2**64 - 1)), np.uint64(start >> 64)
        i = np.arange(blocks, dtype=np.uint64)
        lo = lo0 + i
        hi = hi0 + (lo < lo0).astype(np.uint64)
        words = np.stack([lo & _MASK, lo >> np.uint64(32), hi & _MASK, hi >> np.uint64(32)], axis=-1)
    else:
        words = np.array([[(c >> (32 * j)) & 0xFFFFFFFF for j in range(4)] for c in ctr], np.uint64).reshape(-1, 4)
    key = np.array([int(seed) & 0xFFFFFFFF, int(seed) >> 32], np.uint64)
    return philox4x32(words, key, rounds).reshape(-1)[: int(count)]
