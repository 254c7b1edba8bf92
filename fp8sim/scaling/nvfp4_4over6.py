"""TE's "4over6" NVFP4 quantization (``common/cast/nvfp4/quantize_4over6_nvfp4.cuh``): each 16-element block
(or 16x16 tile) is encoded twice and the encoding with the smaller dequantization error is kept.

With ``E = e4m3_max`` (TE's default for 4over6 tensors: 256; else 448), all float32 steps rounded once::

    S_enc  = fmin(fl32(6E / global_amax), FLT_MAX)      # 1 when global_amax == 0 or S_enc == 0
    base   = fl32(fl32(block_amax / 6) * S_enc)          # block_amax: max |x| of the block, NaN skipped
    s6     = e4m3_satfinite(fmin(base, 448))             # "map-to-6": the usual TE scale
    s4     = e4m3_satfinite(fmin(fl32(base * 1.5), 448)) # "map-to-4": FP4 4 reaches what 6 reaches in s6
    inv_s  = fmin(fl32(1 / fl32(s * fl32(1 / S_enc))), FLT_MAX)
    code_s = E2M1_RN_satfinite(fl32(x * inv_s))
    err_s  = sum over the 16 elements in order of |d| (``"MAE"``) or fl32(d * d) (``"MSE"``), with
             d = fl32(fl32(fl32(fl32(e2m1(code_s) * s) * global_amax) / 6E) - x), a float32 running sum

``s4`` is chosen iff ``err_4 < err_6`` (ties and NaN errors keep ``s6``).  A NaN element gets the E2M1 code
``cvt.rn.satfinite`` gives NaN, taken here as +6 (0x7, inferred: spec 10).  ``block_2d`` (16x16 tiles,
``quantize_stage_rowwise`` with ``USE_2D_QUANTIZATION``): the tile amax is the block amax and each row's
16-element error is summed over the tile's 16 rows in the warp's shuffle-down tree order
(``reduce_group_sum_16``: rows ``i + 8``, then ``i + 4``, ``i + 2``, ``i + 1``).  ``row_scaled``: one global
amax per row (``ROW_SCALED_NVFP4``).  TE's columnwise copy (``quantize_stage_colwise``) is this same
computation on the transposed 2-D tensor with the same global amax (:func:`quantize_nvfp4_4over6` of
``x.T``).  :func:`dequantize_nvfp4_te` is TE's ``dequantize_fp4_kernel`` for either E4M3 max.  ``err_fast_math``
(TE's ``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH``, read by :func:`te_err_use_fast_math`): the kernel's
``accumulate_fp16_scaled_error_pair``, the error taken in the E4M3-scaled domain,
``d = fl32(f16(f16(e2m1(code_s)) * f16(s)) - fl32(x * S_enc))``; the f16 product is exact (2 x 4 significant
bits, within f16's range), so this is ``fl32(fl32(e2m1(code_s) * s) - fl32(x * S_enc))``.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from ..cast import decode, encode
from ..formats import E2M1, E4M3
from .amax import dtype_name
from .quantized import QuantizedData, expand_blocks

__all__ = [
    "ERR_MODES",
    "quantize_nvfp4_4over6",
    "quantize_nvfp4_4over6_columnwise",
    "dequantize_nvfp4_te",
    "te_err_use_fast_math",
]

ERR_MODES = ("MAE", "MSE")
_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)


def _as_f32(x: Any) -> tuple[np.ndarray, str]:
    if hasattr(x, "detach"):
        name = dtype_name(x)
        return x.detach().cpu().float().numpy(), name
    arr = np.asarray(x)
    return arr.astype(np.float32), arr.dtype.name


def _check_e4m3_max(e4m3_max: Any) -> None:
    if e4m3_max not in (256, 448):
        raise ValueError(f"e4m3_max must be 256 or 448 (TE: 'Unsupported NVFP4 E4M3 max.'); got {e4m3_max!r}")


def _tree16(err: np.ndarray) -> np.ndarray:
    """``reduce_group_sum_16`` over axis 1 (16 rows of a tile), in the shuffle-down order."""
    for half in (8, 4, 2, 1):
        err = err[:, :half] + err[:, half : 2 * half]
    return err[:, 0]


def quantize_nvfp4_4over6(
    x: Any,
    *,
    err_mode: str = "MAE",
    e4m3_max: int = 256,
    global_amax: Any = None,
    block_2d: bool = False,
    row_scaled: bool = False,
    reference_zero_handling: bool = False,
    err_fast_math: bool = False,
) -> QuantizedData:
    """TE 4over6 NVFP4 of ``x`` along its last dim (a multiple of 16); see the module docstring.

    ``reference_zero_handling``: the codes of TE's Python reference (``custom_recipes/reference_nvfp4.py``
    ``cast_to_fp4x2``): a scaled value that is exactly ±0 or NaN gets code 0x0.  ``err_fast_math``: TE's
    fast-math candidate error (the kernel's ``accumulate_fp16_scaled_error_pair``, the reference's
    ``nvfp4_4over6_err_use_fast_math``), taken in the E4M3-scaled domain:
    ``d = fl32(fl32(e2m1(code_s) * s) - fl32(x * S_enc))`` (the product is exact in f16 and float32).

    ``block_2d``: 16x16 tiles over the 2-D view (rows a multiple of 16).  ``row_scaled``: one global amax
    per row of the 2-D view (``global_amax`` then has one value per row).  Returns a
    :class:`QuantizedData` with E2M1 codes, uint8 E4M3 block scales (one per 1x16 block or 16x16 tile),
    ``global_scale`` = ``fl32(1/S_enc)`` and ``global_amax`` (arrays of shape ``shape[:-1] + (1,)`` when
    ``row_scaled``)."""
    if err_mode not in ERR_MODES:
        raise ValueError(f"unknown err_mode {err_mode!r}; known: {', '.join(ERR_MODES)}")
    _check_e4m3_max(e4m3_max)
    if block_2d and row_scaled:
        raise ValueError("row_scaled: TE 'Row-scaled NVFP4 quantization does not support 2D quantization.'")
    x32, dtype = _as_f32(x)
    shape = x32.shape
    if not shape or shape[-1] % 16:
        raise ValueError(f"x: last dim must be a multiple of 16 for NVFP4 1x16 blocks; got shape {shape}")
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if block_2d and rows % 16:
        raise ValueError(
            f"x: NVFP4 4over6 columnwise or 2D quantization requires rows divisible by 16; got shape {shape}"
        )
    x2 = x32.reshape(rows, shape[-1] // 16, 16)
    mag = np.abs(x2)
    if global_amax is not None:
        amax = np.asarray(global_amax, np.float32).reshape(-1)
        if amax.size != (rows if row_scaled else 1):
            raise ValueError(f"global_amax: expected {rows if row_scaled else 1} values, got {amax.size}")
    elif row_scaled:
        amax = np.fmax.reduce(mag.reshape(rows, -1), axis=1, initial=_F32(0))
    else:
        amax = np.fmax.reduce(mag.reshape(-1), initial=_F32(0)).reshape(1)
    amax = amax.reshape(-1, 1)  # (rows or 1, 1): broadcasts over the blocks of a row
    num = _F32(6 * e4m3_max)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = np.fmin(num / amax, _FLT_MAX)
        s_enc = np.where((amax == 0) | (s_enc == 0), _F32(1), s_enc).astype(np.float32)
        s_dec = _F32(1) / s_enc
        bmax = np.fmax.reduce(mag, axis=2, initial=_F32(0))  # (rows, groups)
        if block_2d:  # the tile amax on every row of the tile
            t = np.fmax.reduce(bmax.reshape(rows // 16, 16, -1), axis=1, initial=_F32(0))
            bmax = np.repeat(t, 16, axis=0)
        base = (bmax / _F32(6)) * s_enc
        cands = []
        for s_val in (np.fmin(base * _F32(1.5), _F32(448)), np.fmin(base, _F32(448))):  # map4, map6
            sc = encode(s_val, E4M3, saturate=True)
            sf = decode(sc, E4M3)
            inv = np.fmin(_F32(1) / (sf * s_dec), _FLT_MAX)
            v = x2 * inv[..., None]
            codes = encode(v, E2M1, saturate=True)
            codes[np.isnan(v)] = 0x7
            if reference_zero_handling:
                codes[(v == 0) | np.isnan(v)] = 0
            deq = decode(codes, E2M1)
            err = np.zeros(bmax.shape, np.float32)
            for i in range(16):  # the kernel's float32 running sum, element by element
                if err_fast_math:
                    d = deq[..., i] * sf - x2[..., i] * s_enc
                else:
                    d = ((deq[..., i] * sf) * amax) / num - x2[..., i]
                err = err + (np.abs(d) if err_mode == "MAE" else d * d)
            if block_2d:
                err = np.repeat(_tree16(err.reshape(rows // 16, 16, -1)), 16, axis=0)
            cands.append((codes, sc, err))
    (c4, s4, e4), (c6, s6, e6) = cands
    pick4 = e4 < e6
    codes = np.where(pick4[..., None], c4, c6).reshape(shape).astype(np.uint8)
    scales = np.where(pick4, s4, s6).astype(np.uint8)
    if block_2d:
        scales = scales[::16].reshape(*shape[:-2], shape[-2] // 16, shape[-1] // 16)
        block = (1,) * (len(shape) - 2) + (16, 16)
    else:
        scales = scales.reshape(*shape[:-1], shape[-1] // 16)
        block = (1,) * (len(shape) - 1) + (16,)
    if row_scaled:
        glob: Any = s_dec.reshape(*shape[:-1], 1)
        amax_kept: Any = amax.reshape(*shape[:-1], 1)
    else:
        glob, amax_kept = float(s_dec.reshape(-1)[0]), float(amax.reshape(-1)[0])
    return QuantizedData(
        codes, scales, E2M1, block, shape, dtype, scale_format=E4M3, global_scale=glob, global_amax=amax_kept
    )


def quantize_nvfp4_4over6_columnwise(
    x: Any,
    *,
    err_mode: str = "MAE",
    e4m3_max: int = 256,
    global_amax: Any = None,
    block_2d: bool = False,
    err_fast_math: bool = False,
) -> QuantizedData:
    """TE's columnwise 4over6 copy (``quantize_stage_colwise``): the 2-D view ``(M, K)`` transposed to
    ``(K, M)``, blocks of 16 along ``M`` (a multiple of 16), with ``x``'s global amax (the kernel reads the
    columnwise amax, which ``NVFP4Quantizer`` sets to the rowwise one); row-scaled tensors have none in TE."""
    x32, _ = _as_f32(x)
    x2 = x32.reshape(-1, x32.shape[-1]) if x32.ndim else x32.reshape(1, 1)
    if x2.shape[0] % 16:
        raise ValueError(
            f"x: NVFP4 4over6 columnwise or 2D quantization requires rows divisible by 16; got shape {x32.shape}"
        )
    if global_amax is None:
        global_amax = np.fmax.reduce(np.abs(x2).reshape(-1), initial=_F32(0))
    return quantize_nvfp4_4over6(
        np.ascontiguousarray(x2.T),
        err_mode=err_mode,
        e4m3_max=e4m3_max,
        global_amax=global_amax,
        block_2d=block_2d,
        err_fast_math=err_fast_math,
    )


def dequantize_nvfp4_te(codes: np.ndarray, scales: np.ndarray, amax: Any, e4m3_max: int = 448) -> np.ndarray:
    """TE ``dequantize_fp4_kernel`` (``common/cast/nvfp4/dequantize_nvfp4.cuh``) in float32: E2M1 ``codes``
    (rows, cols), uint8 E4M3 ``scales`` (rows, cols/16), ``amax`` one value or one per row;
    ``final = fl32(fl32(s * amax) * fl32(1 / (6 * e4m3_max)))`` per block, ``out = fl32(code * final)``.
    The E4M3 max is the tensor's (256 for 4over6 tensors that use it), which changes the factor."""
    _check_e4m3_max(e4m3_max)
    factor_inv = _F32(1) / _F32(6 * e4m3_max)  # TE: constexpr float 1.0f / (6.0f * E4M3_MAX)
    a = np.asarray(amax, np.float32).reshape(-1, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        final = (decode(scales, E4M3) * a) * factor_inv
        return decode(codes, E2M1) * expand_blocks(final.astype(np.float32), (1, 16))


def te_err_use_fast_math() -> bool:
    """``NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH`` as TE's ``getenv<bool>`` reads it (``common/util/system.h``:
    unset or empty is false, else ``istringstream >> bool``: a leading 0 or 1, anything else an error);
    TE's quantizer reads it on every cast (``csrc/quantizer.cpp`` ``NVFP4Quantizer::quantize_impl``)."""
    value = os.environ.get("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "")
    if not value:
        return False
    m = re.match(r"\s*[+-]?(\d+)", value)
    if m is None or int(m.group(0)) not in (0, 1):
        raise ValueError(f"NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH: Invalid environment variable value {value!r}")
    return int(m.group(0)) == 1
