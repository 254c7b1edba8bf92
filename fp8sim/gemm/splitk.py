"""cuBLAS split-K: which K indices each of S partial GEMMs sums, and how the partials are added.

Orders as mmaemu 0.1.0 documents them from recordings with cuBLASLt 12.8.3.14
(``mmaemu/model/plan.py``, module docstring; ``docs/splitk_tables.md``):

- ``"contiguous"`` (H100 PCIe, sm_90 nvjet kernels): K is cut into 128-wide k-tiles; with
  ``T = ceil(K / 128)`` tiles and ``q = ceil(T / S)``, split ``s`` owns tiles ``[s*q, (s+1)*q)``
  (the last splits may own fewer, or none: +0).  Partials are added serially in float32.
- ``"serial"`` and ``"pairwise"`` (RTX 4060, Ada xmma kernels): 64-wide k-tiles, tile ``t`` goes to
  split ``t mod S`` (interleaved), each split walks its own tiles in increasing ``t``.  ``"serial"``
  adds ``((p0 + p1) + p2) + ...``; ``"pairwise"`` (cuBLASLt customOption 1) forms ``h = ceil(S/2)``
  slots ``p_i + p_(i+h)`` (``p_i`` alone where ``i + h >= S - 1``) and adds them to ``p_(S-1)`` in
  slot order.

Within a split the accumulator runs as it does unsplit over the split's own K sequence: one chain
(fast accumulation) or a chain restarted every ``promote_every`` of the split's own elements (128:
two Ada k-tiles, one Hopper k-tile) and added serially in float32.  The ragged last tile is zero
padded, which adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._util.args import as_int

__all__ = ["SCHEMES", "TILE_K", "check_split_k", "split_indices", "combine_partials", "split_accumulate"]

SCHEMES = ("contiguous", "serial", "pairwise")
TILE_K = {"contiguous": 128, "serial": 64, "pairwise": 64}


def check_split_k(split_k: Any) -> tuple[int, str] | None:
    """``None`` or a validated ``(S, scheme)``; ``S == 1`` is the unsplit GEMM (returned as None;
    its scheme may also be ``"none"``)."""
    if split_k is None:
        return None
    if not (isinstance(split_k, tuple | list) and len(split_k) == 2):
        raise ValueError(
            f"split_k must be None or (S, scheme) with scheme one of {', '.join(SCHEMES)}; got {split_k!r}"
        )
    s, scheme = split_k
    s = as_int(s, "split_k's S", lo=1)
    if scheme not in SCHEMES and not (s == 1 and scheme == "none"):
        raise ValueError(f"split_k's scheme must be one of {', '.join(SCHEMES)}; got {scheme!r}")
    return None if s == 1 else (int(s), scheme)


def split_indices(k: int, s: int, scheme: str) -> list[np.ndarray]:
    """For each split, the K indices it sums in chain order (-1: zero padding of the last tile)."""
    tile = TILE_K[scheme]
    t = -(-k // tile)
    if scheme == "contiguous":
        q = -(-t // s)
        owned = [np.arange(min(i * q, t), min((i + 1) * q, t)) for i in range(s)]
    else:
        owned = [np.arange(i, t, s) for i in range(s)]
    out = []
    for tiles in owned:
        idx = (tiles[:, None] * tile + np.arange(tile)[None, :]).reshape(-1)
        out.append(np.where(idx < k, idx, -1))
    return out


def combine_partials(parts: Sequence[np.ndarray], scheme: str) -> np.ndarray:
    """float32 sum of the S partials in cuBLAS's order for ``scheme``."""
    s = len(parts)
    with np.errstate(invalid="ignore", over="ignore"):
        if scheme in ("serial", "contiguous") or s == 1:
            acc = parts[0]
            for p in parts[1:]:
                acc = (acc + p).astype(np.float32)
            return acc
        h = -(-s // 2)
        acc = parts[s - 1]
        for i in range(h):
            slot = (parts[i] + parts[i + h]).astype(np.float32) if i + h < s - 1 else parts[i]
            acc = (acc + slot).astype(np.float32)
        return acc


def _take(codes: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """Gather along K; -1 selects code 0 (+0 in every narrow format)."""
    got = np.take(codes, np.maximum(idx, 0), axis=axis)
    if (idx < 0).any():
        mask = (idx < 0)[None, :] if axis == 1 else (idx < 0)[:, None]
        got = np.where(mask, np.zeros((), codes.dtype), got)
    return got


def split_accumulate(
    ac: np.ndarray,
    bc: np.ndarray,
    split: tuple[int, str],
    partial: Callable[[np.ndarray, np.ndarray], np.ndarray],
) -> np.ndarray:
    """float32 (M, N): ``partial(a_cols, b_rows)`` (the unsplit accumulator) on each split's K
    sequence, combined as the scheme says.  ``ac``: (M, K) codes or values, ``bc``: (K, N)."""
    s, scheme = split
    m, k = ac.shape
    n = bc.shape[1]
    parts = []
    for idx in split_indices(k, s, scheme):
        if idx.size == 0:
            parts.append(np.zeros((m, n), np.float32))
            continue
        parts.append(np.asarray(partial(_take(ac, idx, 1), _take(bc, idx, 0)), np.float32))
    return combine_partials(parts, scheme)
