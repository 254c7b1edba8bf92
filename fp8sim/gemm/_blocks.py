"""Block-scaled ``scaled_mm`` of any tiling: A scales per (m-block x k-block), B scales per
(k-block x n-block), as a reference GEMM for blockwise kernels (CUTLASS's ``ScaleGranularityM/N/K``,
DeepGEMM, TE's 1x128 / 128x128).

A tiling is ``(block_m, block_n, block_k)``: ``scale_a`` has shape ``(ceil(M / block_m), ceil(K / block_k))``
and ``scale_b`` ``(ceil(K / block_k), ceil(N / block_n))``; edge blocks may be partial.  For each K-block
the accumulator sums its products into ``P`` (float32; tensor-core chains restart from 0 there, as the
kernels promote per K-block) and the running float32 result takes it with one FMA, in one of the orders
kernels use (``block_order``):

- ``"scale_a_first"``: ``y = fma(fl32(P * sa), sb, y)``: TE's cuBLAS-exact blockwise reference
  (``tests/pytorch/references/blockwise_fp8_gemm_reference.py``) for a 1D (``block_m = 1``) A, and
  CUTLASS's sm90 blockwise mainloop when both scales vary within a CTA tile
  (``fp8_accumulation.hpp`` ``scale_core``: ``accum += accum_temp * scaleA * scaleB``);
- ``"scale_b_first"``: ``y = fma(fl32(P * sb), sa, y)``: TE's reference for a 2D A with a 1D B;
- ``"scale_product"``: ``y = fma(P, fl32(sa * sb), y)``: CUTLASS's sm90 mainloop when at most one scale
  varies within the tile (the scale product is formed first, then ``accum += accum_temp * scale``).

``block_order=None`` follows TE's rule: ``"scale_b_first"`` when ``block_m > 1`` and ``block_n == 1``,
else ``"scale_a_first"``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._exact import fma_f32 as _fma_f32

__all__ = ["BLOCK_ORDERS", "torch_tiling", "resolve_tiling", "expand_block_scales", "blockwise"]

BLOCK_ORDERS = ("scale_a_first", "scale_b_first", "scale_product")
_HINT = (
    "\nfp8sim also takes any block tiling as a reference for blockwise kernels: block_shape=(block_m, block_n, "
    "block_k) (partial edge blocks allowed), or strict=False to infer it from the scale shapes"
)


def torch_tiling(layout: str) -> tuple[int, int, int]:
    """The tiling of torch's 1x128 / 128x128 layouts (``block_1x2``: 1x128 A, 128x128 B)."""
    return (128 if layout[6] == "2" else 1, 128 if layout[8] == "2" else 1, 128)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _divisors(x: int) -> str:
    if x == 0:  # a zero-size dim: any positive count divides it
        return "1, 2, 3, ... (any positive number)"
    ds = [d for d in range(1, x + 1) if x % d == 0]
    return ", ".join(map(str, ds[:24])) + (", ..." if len(ds) > 24 else "")


def _check_block_shape(block_shape: object) -> tuple[int, int, int]:
    ok = isinstance(block_shape, tuple | list) and len(block_shape) == 3
    ok = ok and all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v > 0 for v in block_shape)
    if not ok:
        raise ValueError(
            "block_shape must be (block_m, block_n, block_k), three positive integers (CUTLASS's scale granularity "
            f"M x N x K, e.g. (128, 64, 128) or (1, 128, 128)); got {block_shape!r}"
        )
    return tuple(int(v) for v in block_shape)  # type: ignore[return-value]


def _infer(sa: np.ndarray, sb: np.ndarray, m: int, k: int, n: int) -> tuple[int, int, int]:
    """The tiling whose blocks divide the shapes exactly, from the scale shapes (or ValueError)."""
    if sa.ndim != 2 or sb.ndim != 2:
        raise ValueError(f"block scales must be 2-D: scale_a {sa.shape}, scale_b {sb.shape}")
    checks = (
        ("scale_a", "rows", sa.shape[0], "M", m),
        ("scale_a", "columns", sa.shape[1], "K", k),
        ("scale_b", "rows", sb.shape[0], "K", k),
        ("scale_b", "columns", sb.shape[1], "N", n),
    )
    for arg, what, got, dim, size in checks:
        if got == 0 or size % got:
            raise ValueError(
                f"{arg} has {got} {what}, which does not divide {dim}={size} into equal blocks; its {what} must be "
                f"one of {_divisors(size)}; pass block_shape=(block_m, block_n, block_k) for a tiling with partial "
                "edge blocks"
            )
    if sa.shape[1] != sb.shape[0]:
        raise ValueError(
            f"scale_a has {sa.shape[1]} K-blocks and scale_b {sb.shape[0]}: A and B share one K tiling, so "
            f"scale_b must have {sa.shape[1]} rows"
        )
    return (m // sa.shape[0], n // sb.shape[1], k // sa.shape[1])


def resolve_tiling(
    sa: np.ndarray,
    sb: np.ndarray,
    m: int,
    k: int,
    n: int,
    block_shape: object,
    torch_error: str | None,
    strict: bool,
) -> tuple[int, int, int]:
    """The tiling of float32 block scales: ``block_shape`` when given (the scale shapes must match it),
    else inferred from the scale shapes (``strict=False`` only: torch's ``_scaled_mm`` takes 1x128 and
    128x128 alone; ``torch_error`` is its message for these scales)."""
    if block_shape is not None:
        bm, bn, bk = _check_block_shape(block_shape)
        for arg, s, want, dims in (
            ("scale_a", sa, (_ceil(m, bm), _ceil(k, bk)), f"M={m}, K={k}"),
            ("scale_b", sb, (_ceil(k, bk), _ceil(n, bn)), f"K={k}, N={n}"),
        ):
            if tuple(np.shape(s)) != want:
                raise ValueError(
                    f"{arg} must have shape {want} for block_shape={(bm, bn, bk)} with {dims}; got {tuple(np.shape(s))}"
                )
        return (bm, bn, bk)
    if strict:
        raise ValueError((torch_error or "Invalid scaling configuration.") + _HINT)
    return _infer(sa, sb, m, k, n)


def expand_block_scales(s: np.ndarray, rows: int, cols: int, tiling: tuple[int, int, int], side: str) -> np.ndarray:
    """Per-element float32 scales of one operand (``side`` "a": (M, K); "b": (K, N))."""
    bm, bn, bk = tiling
    v = s.astype(np.float32)
    if side == "a":
        return np.repeat(np.repeat(v, bm, axis=0), bk, axis=1)[:rows, :cols]
    return np.repeat(np.repeat(v, bk, axis=0), bn, axis=1)[:rows, :cols]


def blockwise(
    m: int,
    n: int,
    k: int,
    sa: np.ndarray,
    sb: np.ndarray,
    tiling: tuple[int, int, int],
    order: str | None,
    tile_sum: Callable[[slice], np.ndarray],
) -> np.ndarray:
    """float32 (M, N): per K-block ``P = tile_sum(k_slice)`` taken into ``y`` by one FMA in ``order``."""
    bm, bn, bk = tiling
    if order is None:
        order = "scale_b_first" if bm > 1 and bn == 1 else "scale_a_first"
    y = np.zeros((m, n), np.float32)
    for t, k0 in enumerate(range(0, k, bk)):
        p = tile_sum(slice(k0, k0 + bk))
        s_a = np.broadcast_to(np.repeat(sa[:, t : t + 1].astype(np.float32), bm, axis=0)[:m], (m, n))
        s_b = np.broadcast_to(np.repeat(sb[t : t + 1, :].astype(np.float32), bn, axis=1)[:, :n], (m, n))
        with np.errstate(invalid="ignore", over="ignore"):
            if order == "scale_a_first":
                y = _fma_f32((p * s_a).astype(np.float32), s_b, y)
            elif order == "scale_b_first":
                y = _fma_f32((p * s_b).astype(np.float32), s_a, y)
            else:
                y = _fma_f32(p, (s_a * s_b).astype(np.float32), y)
    return y
