"""torchao's NVFP4 flavour (``torchao/prototype/mx_formats/nvfp4_tensor.py`` ``nvfp4_quantize``, as it runs on a
CPU) for :func:`fp8sim.scaling.nvfp4.quantize_nvfp4`: two-level (per-tensor scale) and single-level
(``per_tensor_scale=None``) block scaling, with torchao's NaN codes and torch's NaN amax bits."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.tensors import is_torch_tensor
from ..cast import decode, encode
from ..formats import E2M1, E4M3
from .quantized import expand_blocks

_F32 = np.float32
_ONE = _F32(1.0)
_FP4_MAX = _F32(6.0)
_E4M3_MAX = _F32(448.0)
_E4M3_TINY = _F32(2.0**-6)  # torch.finfo(float8_e4m3fn).tiny, torchao's lower clamp
_GLOBAL_NUM = _F32(2688.0)  # 448 * 6, exact
_BLOCK = 16


def _block_amax(mag: np.ndarray, block_2d: bool, skip_nan: bool) -> np.ndarray:
    """Per-block max of ``mag`` (shape ``padded // block``), NaN-skipping like CUDA ``fmaxf`` or
    NaN-propagating like ``torch.amax``."""
    bs = _BLOCK
    *lead, k = mag.shape
    if block_2d:
        t = mag.reshape(*lead[:-1], lead[-1] // bs, bs, k // bs, bs).swapaxes(-3, -2)
        t = t.reshape(*t.shape[:-2], bs * bs)
    else:
        t = mag.reshape(*lead, k // bs, bs)
    if skip_nan:
        return np.fmax.reduce(t, axis=-1, initial=_F32(0))
    return np.max(t, axis=-1)


def _torchao_nan_codes(v: np.ndarray) -> np.ndarray:
    """torchao ``_f32_to_floatx_unpacked`` on NaN: its normal branch applied to the NaN's bits."""
    bits = v.view(np.uint32).astype(np.int64)
    mag = bits & 0x7FFFFFFF
    mant_odd = (mag >> 22) & 1
    code = ((mag + ((1 - 127) << 23) + (2**21 - 1) + mant_odd) >> 22) & 0xFF
    return (code | ((bits >> 31) << 3)).astype(np.uint8)


def _torch_e4m3_values(codes: np.ndarray) -> np.ndarray:
    """E4M3 codes as float32 the way torch converts them: a NaN code becomes the float32 NaN
    ``sign | 0x7FF00000`` (the code's mantissa bits shifted into the payload), which then
    propagates through torchao's arithmetic and decides its E2M1 code."""
    vals = decode(codes, E4M3)
    nan = np.isnan(vals)
    if nan.any():
        bits = (codes.astype(np.uint32) >> 7 << 31) | np.uint32(0x7F800000) | ((codes.astype(np.uint32) & 7) << 20)
        vals = np.where(nan, bits.view(np.float32), vals)
    return vals


def _torch_global_amax(x: Any) -> np.float32:
    """torchao's ``torch.max(torch.abs(x))``: run by torch for a torch input (its NaN bits, spec 0 "6.2"),
    numpy's NaN-propagating max otherwise; an empty tensor has amax 0."""
    if is_torch_tensor(x) and x.numel():
        import torch

        with torch.no_grad():
            return x.detach().abs().max().float().cpu().numpy()[()]
    return np.max(np.abs(np.asarray(x, np.float32)), initial=_F32(0))


def _quantize_torchao(
    x32: np.ndarray, mag: np.ndarray, amax: np.float32, block: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    pts = amax / _GLOBAL_NUM
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        block_scale = _block_amax(mag, False, skip_nan=False) / _FP4_MAX
        scales = encode(np.clip(block_scale / pts, _E4M3_TINY, _E4M3_MAX), E4M3, saturate=True)
        recip = (_ONE / pts) / _torch_e4m3_values(scales)
        # recip first: where both are NaN, x86 keeps the first operand's payload, as torch's CPU kernel does
        v = np.clip(expand_blocks(recip, block) * x32, -_FP4_MAX, _FP4_MAX)
    nan = np.isnan(v)
    codes = encode(np.where(nan, _F32(0), v), E2M1)
    codes[nan] = _torchao_nan_codes(v[nan])
    return codes, scales, np.float32(pts)


def _quantize_torchao_single(x32: np.ndarray, mag: np.ndarray, block: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """torchao ``nvfp4_quantize`` with ``per_tensor_scale=None`` (``nvfp4_tensor.py``, single level scaling)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        block_scale = _block_amax(mag, False, skip_nan=False) / _FP4_MAX
        scales = encode(np.clip(block_scale, _E4M3_TINY, _E4M3_MAX), E4M3, saturate=True)
        recip = _ONE / _torch_e4m3_values(scales)  # torchao: 1.0 / fp8_scale, then multiply
        # recip first: where both are NaN, x86 keeps the first operand's payload, as torch's CPU kernel does
        v = np.clip(expand_blocks(recip, block) * x32, -_FP4_MAX, _FP4_MAX)
    nan = np.isnan(v)
    codes = encode(np.where(nan, _F32(0), v), E2M1)
    codes[nan] = _torchao_nan_codes(v[nan])
    return codes, scales
