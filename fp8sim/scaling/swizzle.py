"""The 128x4 blocked ("swizzled") scale layout cuBLAS and torchao use for MX and NVFP4 block scales.

A scale matrix of shape ``(rows, cols)`` (one scale per block: rows = M or N, cols = K / block size) is
zero-padded to ``(128 * ceil(rows / 128), 4 * ceil(cols / 4))`` and cut into 128x4 tiles, taken tile row
by tile row; inside a tile, row ``r`` and column ``c`` land at ``(r % 32) * 16 + (r // 32) * 4 + c``.  The
result is flat, 512 entries per tile (cuBLAS "1D block scaling factors layout"; torchao
``prototype/mx_formats/utils.py`` ``to_blocked`` / ``from_blocked``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.args import as_array, as_int
from .._util.tensors import is_torch_tensor

__all__ = ["blocked_size", "to_blocked", "from_blocked", "with_blocked_scales", "unswizzle_mm_scales"]

_ROWS, _COLS = 128, 4


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def blocked_size(rows: int, cols: int) -> int:
    """The number of entries of the blocked layout of a ``(rows, cols)`` scale matrix (padding included)."""
    return _ceil_div(rows, _ROWS) * _ROWS * _ceil_div(cols, _COLS) * _COLS


def _as_numpy(x: Any, arg: str) -> tuple[np.ndarray, Any]:
    if is_torch_tensor(x):
        import torch

        t = x.detach().cpu()
        if t.dtype in (getattr(torch, "float8_e8m0fnu", None), torch.float8_e4m3fn):
            return t.view(torch.uint8).numpy(), x
        return t.numpy(), x
    return as_array(x, arg), None


def _like(arr: np.ndarray, ref: Any) -> Any:
    if ref is None:
        return arr
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr))
    if ref.dtype != t.dtype:
        t = t.view(ref.dtype)
    return t.to(ref.device)


def to_blocked(scales: Any) -> Any:
    """The flat blocked layout of a 2-D scale matrix (module docstring); padding entries are 0, as
    torchao's.  numpy in, numpy out; a torch tensor (uint8, float8_e8m0fnu, float8_e4m3fn, float32) in,
    the same dtype and device out."""
    arr, ref = _as_numpy(scales, "scales")
    if arr.ndim != 2:
        raise ValueError(f"scales must be a 2-D (rows, cols) matrix of block scales; got shape {arr.shape}")
    rows, cols = arr.shape
    rb, cb = _ceil_div(rows, _ROWS), _ceil_div(cols, _COLS)
    padded = np.zeros((rb * _ROWS, cb * _COLS), arr.dtype)
    padded[:rows, :cols] = arr
    tiles = padded.reshape(rb, _ROWS, cb, _COLS).transpose(0, 2, 1, 3)  # (rb, cb, 128, 4)
    out = tiles.reshape(rb, cb, 4, 32, _COLS).transpose(0, 1, 3, 2, 4)  # row r = 32 * (r // 32) + r % 32
    return _like(out.reshape(-1), ref)


def from_blocked(blocked: Any, rows: int, cols: int) -> Any:
    """The ``(rows, cols)`` scale matrix back from its flat blocked layout (the padding dropped)."""
    arr, ref = _as_numpy(blocked, "blocked")
    rows, cols = as_int(rows, "rows", lo=0), as_int(cols, "cols", lo=0)
    want = blocked_size(rows, cols)
    if arr.size != want:
        raise ValueError(
            f"blocked scales hold {arr.size} entries; a ({rows}, {cols}) scale matrix has {want} in the 128x4 layout"
        )
    rb, cb = _ceil_div(rows, _ROWS), _ceil_div(cols, _COLS)
    tiles = arr.reshape(rb, cb, 32, 4, _COLS).transpose(0, 1, 3, 2, 4).reshape(rb, cb, _ROWS, _COLS)
    out = tiles.transpose(0, 2, 1, 3).reshape(rb * _ROWS, cb * _COLS)[:rows, :cols]
    return _like(np.ascontiguousarray(out), ref)


def with_blocked_scales(qt: Any) -> Any:
    """``qt`` (a 2-D MX/NVFP4 :class:`~fp8sim.scaling.quantized.QuantizedData`) with ``blocked_scales``
    filled as ``torch._scaled_mm`` takes them: blocks along the last dim (``mat1``, ``(M, K/bs)`` scales)
    swizzle as they are; blocks along dim 0 (``mat2``, ``(K/bs, N)``) swizzle the ``(N, K/bs)`` transpose."""
    import dataclasses

    if qt.scales.ndim != 2 or qt.scale_format is None:
        raise ValueError(f"swizzle=True needs a 2-D tensor with MX/NVFP4 block scales; got scales {qt.scales.shape}")
    scales = qt.scales if qt.block[0] == 1 else qt.scales.T
    return dataclasses.replace(qt, blocked_scales=to_blocked(np.ascontiguousarray(scales)))


def unswizzle_mm_scales(
    scale_a: Any, scale_b: Any, sa: np.ndarray, sb: np.ndarray, m: int, k: int, n: int, fp4: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``scaled_mm``'s scales in its plain layout (``(M, K/bs)``, ``(K/bs, N)``) when both are flat uint8
    codes in the 128x4 blocked layout (as ``torch._scaled_mm`` takes MX/NVFP4 scales); otherwise
    ``sa, sb`` unchanged.  The block size is 16 for E4M3 scales of FP4 operands (NVFP4), else 32; numpy
    codes of FP4 operands are read as NVFP4 when both sizes fit."""
    if sa is None or sb is None or sa.ndim != 1 or sb.ndim != 1 or sa.dtype != np.uint8 or sb.dtype != np.uint8:
        return sa, sb
    e4m3 = "float8_e4m3fn" in str(getattr(scale_a, "dtype", ""))
    e8m0 = "float8_e8m0fnu" in str(getattr(scale_a, "dtype", ""))
    sizes = (16, 32) if fp4 and not e8m0 else (32,)
    if e4m3:
        sizes = (16,)
    for bs in sizes:
        kb = _ceil_div(k, bs)
        if sa.size == blocked_size(m, kb) and sb.size == blocked_size(n, kb):
            return from_blocked(sa, m, kb), np.ascontiguousarray(from_blocked(sb, n, kb).T)
    return sa, sb
