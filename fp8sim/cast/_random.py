"""Counter-based random bits for stochastic rounding.

Element ``i`` (its flat, C-order index in the input) of a cast with seed ``s`` gets
``bits(s, i)``, a pure function of the two: the same seed gives the same bits on every backend and
device, whatever the chunking or thread count.  The mixer is a short xor-multiply-xorshift integer
hash keyed by the seed; its multipliers are below 2^31 so that torch can run it in int64 without
overflow.  It is a statistical generator for rounding noise, not a cryptographic one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.args import as_int

_M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x1B873593
_C3 = 0x2C1B3C6D


def seed_keys(seed: int) -> tuple[int, int]:
    """Two 32-bit keys from a non-negative integer seed (up to 64 bits)."""
    seed = as_int(seed, "seed")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")

    def mix(h: int) -> int:
        h = ((h ^ (h >> 16)) * _C1) & _M32
        h = ((h ^ (h >> 15)) * _C2) & _M32
        return h ^ (h >> 16)

    k0 = mix((seed & _M32) ^ 0x9E3779B9)
    k1 = mix(((seed >> 32) ^ k0 ^ 0x85EBCA6B) & _M32)
    return k0, k1


def numpy_bits(seed: int, start: int, count: int) -> np.ndarray:
    """uint32 random bits for flat indices ``start .. start+count-1``."""
    if start + count <= 2**32:
        return _numpy_mix(seed, np.arange(start, start + count, dtype=np.uint32), None)
    return numpy_bits_at(seed, np.arange(start, start + count, dtype=np.uint64))


def numpy_bits_at(seed: int, index: np.ndarray) -> np.ndarray:
    """uint32 random bits for an array of flat indices."""
    index = index.astype(np.uint64, copy=False)
    lo = (index & np.uint64(_M32)).astype(np.uint32)
    hi = (index >> np.uint64(32)).astype(np.uint32)
    return _numpy_mix(seed, lo, hi if hi.any() else None)


def _numpy_mix(seed: int, h: np.ndarray, hi: np.ndarray | None) -> np.ndarray:
    k0, k1 = seed_keys(seed)
    h *= np.uint32(_C3)
    h ^= np.uint32(k0)
    h *= np.uint32(_C1)
    h ^= h >> np.uint32(15)
    h ^= np.uint32(k1)
    if hi is not None:
        h ^= hi * np.uint32(_C3)
    h *= np.uint32(_C2)
    h ^= h >> np.uint32(16)
    return h


def torch_bits_at(seed: int, index: Any) -> Any:
    """int64 tensor of random bits in [0, 2^32) for int64 flat indices; equals numpy_bits_at."""
    k0, k1 = seed_keys(seed)
    h = (((index & _M32) * _C3) & _M32) ^ k0
    h = (h * _C1) & _M32
    h = h ^ (h >> 15) ^ k1 ^ (((index >> 32) * _C3) & _M32)
    h = (h * _C2) & _M32
    return h ^ (h >> 16)


def torch_bits(seed: int, start: int, count: int, device: Any) -> Any:
    """int64 tensor of random bits in [0, 2^32) for flat indices ``start .. start+count-1``."""
    import torch

    return torch_bits_at(seed, torch.arange(start, start + count, dtype=torch.int64, device=device))
