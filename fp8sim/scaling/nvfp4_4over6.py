"""TE's "4over6" NVFP4 quantization (``common/cast/nvfp4/quantize_4over6_nvfp4.cuh``, 1x16 blocks): each
16-element block is encoded twice and the encoding with the smaller dequantization error is kept.

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
``cvt.rn.satfinite`` gives NaN, taken here as +6 (0x7, inferred: spec 10).  TE's ``fast_math`` error path
(f16 arithmetic), 2-D tiles, row-scaled amaxes and the columnwise copy are not emulated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cast import decode, encode
from ..formats import E2M1, E4M3
from .amax import dtype_name
from .quantized import QuantizedTensor

__all__ = ["ERR_MODES", "quantize_nvfp4_4over6"]

ERR_MODES = ("MAE", "MSE")
_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)


def _as_f32(x: Any) -> tuple[np.ndarray, str]:
    if hasattr(x, "detach"):
        name = dtype_name(x)
        return x.detach().cpu().float().numpy(), name
    arr = np.asarray(x)
    return arr.astype(np.float32), arr.dtype.name


def quantize_nvfp4_4over6(
    x: Any, *, err_mode: str = "MAE", e4m3_max: int = 256, global_amax: Any = None
) -> QuantizedTensor:
    """TE 4over6 NVFP4 of ``x`` along its last dim (a multiple of 16); see the module docstring.

    Returns a :class:`QuantizedTensor` with E2M1 codes, uint8 E4M3 block scales, ``global_scale`` =
    ``fl32(1/S_enc)`` and ``global_amax``."""
    if err_mode not in ERR_MODES:
        raise ValueError(f"unknown err_mode {err_mode!r}; known: {', '.join(ERR_MODES)}")
    if e4m3_max not in (256, 448):
        raise ValueError(f"e4m3_max must be 256 or 448 (TE: 'Unsupported NVFP4 E4M3 max.'); got {e4m3_max!r}")
    x32, dtype = _as_f32(x)
    shape = x32.shape
    if not shape or shape[-1] % 16:
        raise ValueError(f"x: last dim must be a multiple of 16 for NVFP4 1x16 blocks; got shape {shape}")
    amax = np.fmax.reduce(np.abs(x32).reshape(-1), initial=_F32(0)) if global_amax is None else _F32(global_amax)
    num = _F32(6 * e4m3_max)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        s_enc = np.fmin(num / amax, _FLT_MAX)
        s_enc = _F32(1) if (amax == 0 or s_enc == 0) else _F32(s_enc)
        s_dec = _F32(1) / s_enc
        blocks = x32.reshape(-1, 16)
        bmax = np.fmax.reduce(np.abs(blocks), axis=1, initial=_F32(0))
        base = (bmax / _F32(6)) * s_enc
        cands = []
        for s_val in (np.fmin(base * _F32(1.5), _F32(448)), np.fmin(base, _F32(448))):  # map4, map6
            sc = encode(s_val, E4M3, saturate=True)
            sf = decode(sc, E4M3)
            inv = np.fmin(_F32(1) / (sf * s_dec), _FLT_MAX)
            v = blocks * inv[:, None]
            codes = encode(v, E2M1, saturate=True)
            codes[np.isnan(v)] = 0x7
            deq = decode(codes, E2M1)
            err = np.zeros(blocks.shape[0], np.float32)
            for i in range(16):  # the kernel's float32 running sum, element by element
                d = ((deq[:, i] * sf) * amax) / num - blocks[:, i]
                err = err + (np.abs(d) if err_mode == "MAE" else d * d)
            cands.append((codes, sc, err))
    (c4, s4, e4), (c6, s6, e6) = cands
    pick4 = e4 < e6
    codes = np.where(pick4[:, None], c4, c6).reshape(shape).astype(np.uint8)
    scales = np.where(pick4, s4, s6).reshape(*shape[:-1], shape[-1] // 16).astype(np.uint8)
    block = (1,) * (len(shape) - 1) + (16,)
    return QuantizedTensor(
        codes, scales, E2M1, block, shape, dtype, scale_format=E4M3, global_scale=float(s_dec), global_amax=float(amax)
    )
