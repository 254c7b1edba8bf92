"""TE's quantized tensors as fp8sim's one quantized-data record (:class:`fp8sim.scaling.QuantizedData`).

``QuantizedTensor.quantized_data(columnwise=False)`` of each TE class (``Float8Tensor``, ``MXFP8Tensor``,
``Float8BlockwiseQTensor``, ``NVFP4Tensor``) reads its own codes and scales into the record (a copy:
reading a parameter through ``.numpy()`` would pin the storage FSDP2 frees), in the layout the scaling
layer's quantizers give: the module layer builds its GEMM operands from it, nothing re-quantized.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..._util.tensors import numpy_view
from ...formats import E2M1, E4M3, E8M0, get_format
from ...scaling.nvfp4 import _te_encode_scale
from ...scaling.packing import unpack_fp4
from ...scaling.quantized import QuantizedData
from ..constants import DType
from .storage.float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage
from .storage.float8_tensor_storage import Float8TensorStorage
from .storage.mxfp8_tensor_storage import MXFP8TensorStorage
from .storage.nvfp4_tensor_storage import NVFP4TensorStorage

__all__ = ["quantized_data", "float8_data", "mxfp8_data", "blockwise_data", "nvfp4_data"]


def quantized_data(t: Any, columnwise: bool = False) -> QuantizedData:
    """The record of TE tensor ``t``: its rowwise copy, or with ``columnwise`` its columnwise copy (the
    layout the dgrad/wgrad GEMM reads; per-tensor FP8 has one copy).  Block-scaled 2-D views only."""
    if isinstance(t, Float8TensorStorage):
        return float8_data(t)
    if isinstance(t, MXFP8TensorStorage):
        return mxfp8_data(t, columnwise)
    if isinstance(t, Float8BlockwiseQTensorStorage):
        return blockwise_data(t, columnwise)
    if isinstance(t, NVFP4TensorStorage):
        return nvfp4_data(t, columnwise)
    raise NotImplementedError(f"{type(t).__name__} has no fp8sim quantized-data record")


def float8_data(t: Any) -> QuantizedData:
    """A per-tensor FP8 tensor: its codes (rowwise ``_data``, else the columnwise ``_transpose`` moved
    back) and ``scale_inv``, one block over the whole tensor."""
    if t._data is not None:
        codes = t._data.reshape(t.shape)
    elif t._transpose is not None:
        codes = t._transpose.movedim(0, -1) if t._transpose.dim() > 1 else t._transpose
    else:
        raise RuntimeError("Float8TensorStorage has neither rowwise nor columnwise data")
    shape = tuple(t.shape)
    sinv = np.float32(t._scale_inv.reshape(-1)[0].item())
    scales = np.full((1,) * len(shape), sinv, np.float32)
    block = tuple(max(d, 1) for d in shape)
    dtype = str(t.dtype).replace("torch.", "")
    return QuantizedData(_np(codes), scales, _element_format(t._fp8_dtype), block, shape, dtype)


def mxfp8_data(w: Any, columnwise: bool) -> QuantizedData:

    m, k = _flatten(w.shape)
    fmt = _element_format(w._fp8_dtype)
    if columnwise:
        codes, scales, block = w._columnwise_data, w._columnwise_scale_inv[: m // 32, :k], (32, 1)
    else:
        codes, scales, block = w._rowwise_data, w._rowwise_scale_inv[:m, : k // 32], (1, 32)
    return QuantizedData(_np(codes.reshape(m, k)), _np(scales), fmt, block, (m, k), "float32", scale_format=E8M0)


def blockwise_data(w: Any, columnwise: bool) -> QuantizedData:
    """TE's 1x128 layouts: rowwise scale ``[j, m]`` (block j of row m), columnwise data (K, M) with
    scale ``[i, k]``; 128x128: one scale per tile, rowwise ``[i, j]``."""
    m, k = _flatten(w.shape)
    fmt = _element_format(w._fp8_dtype)
    b = 128
    if w._is_2D_scaled and w._rowwise_data is None and w._columnwise_data is not None:
        # one set of tiles: the columnwise copy holds the rowwise codes and tile scales transposed
        codes = _pad(_np(w._columnwise_data.reshape(k, m)).T, b, b)
        scales = _np(w._columnwise_scale_inv[: -(-k // b), : -(-m // b)]).T
        block = (b, b)
    elif w._is_2D_scaled:
        codes = _pad(_np(w._rowwise_data.reshape(m, k)), b, b)
        scales = _np(w._rowwise_scale_inv[: -(-m // b), : -(-k // b)])
        block = (b, b)
    elif columnwise:
        codes = _pad(_np(w._columnwise_data.reshape(k, m)).T, b, 1)
        scales, block = _np(w._columnwise_scale_inv[: -(-m // b), :k]), (b, 1)
    else:
        codes = _pad(_np(w._rowwise_data.reshape(m, k)), 1, b)
        scales, block = _np(w._rowwise_scale_inv[: -(-k // b), :m]).T, (1, b)
    return QuantizedData(codes, np.ascontiguousarray(scales, np.float32), fmt, block, (m, k), "float32")


def nvfp4_data(w: Any, columnwise: bool) -> QuantizedData:
    """Unpacked E2M1 codes, E4M3 block scales (one per 16x16 tile with 2D quantization, TE's rowwise
    layout repeating it on each row of the tile), and the global scale ``1 / S_enc(amax)``."""

    m, k = _flatten(w.shape)
    rows, cols = (k, m) if columnwise else (m, k)
    data = w._columnwise_data if columnwise else w._rowwise_data
    scale = w._columnwise_scale_inv if columnwise else w._rowwise_scale_inv
    amax = (w._amax_columnwise if columnwise else w._amax_rowwise).reshape(-1)
    if amax.numel() not in (1, rows):
        raise ValueError(f"NVFP4 amax has {amax.numel()} values; expected 1 or one per row ({rows}, row-scaled)")
    # row-scaled NVFP4 (TE's row_scaled_nvfp4): one global amax, hence one S_enc, per row of this copy
    per_row = amax.numel() != 1
    a = _np(amax).astype(np.float32).reshape(rows, 1) if per_row else np.float32(amax[0].item())
    codes = unpack_fp4(data.reshape(rows, cols // 2).cpu()).numpy()
    scales = _np(scale[:rows, : -(-cols // 16)])
    block = (1, 16)
    if w._with_2d_quantization:
        scales, block = scales[::16], (16, 16)
    emax = int(getattr(w, "_nvfp4_e4m3_max", 448)) if getattr(w, "_nvfp4_use_4over6", False) else 448
    if emax == 448:
        s_enc = _te_encode_scale(np.asarray(a, np.float32), False)
    else:  # a 4over6 tensor's own E4M3 max (quantize_4over6_nvfp4.cuh: S_enc = 6 E / amax)
        with np.errstate(divide="ignore", over="ignore"):
            s_enc = np.fmin(np.float32(6 * emax) / a, np.finfo(np.float32).max)
        s_enc = np.where((a == 0) | (s_enc == 0), np.float32(1), s_enc).astype(np.float32)
    g = np.float32(1) / np.asarray(s_enc, np.float32)
    return QuantizedData(
        codes,
        np.ascontiguousarray(scales),
        E2M1,
        block,
        (rows, cols),
        "float32",
        scale_format=E4M3,
        global_scale=g.astype(np.float32) if per_row else float(g),
        global_amax=a if per_row else float(a),
    )


def _flatten(shape: Any) -> tuple[int, int]:
    return int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1])


def _element_format(fp8_dtype: Any) -> Any:
    return get_format("e4m3" if fp8_dtype == DType.kFloat8E4M3 else "e5m2")


def _np(t: torch.Tensor) -> np.ndarray:
    return np.array(numpy_view(t), copy=True)  # a copy: .numpy() pins the storage FSDP2 frees


def _pad(codes: np.ndarray, rb: int, cb: int) -> np.ndarray:
    r, c = codes.shape
    out = np.zeros((-(-r // rb) * rb, -(-c // cb) * cb), np.uint8)
    out[:r, :c] = codes
    return out
