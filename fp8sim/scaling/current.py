"""Per-tensor current scaling (TE ``Float8CurrentScaling``) and torchao's float8 scale math.

TE (spec 5.1, ``compute_scale_from_amax``), all in float32::

    amax = max(amax, eps)                       # NaN stays NaN
    scale = 1 if amax is 0, Inf or NaN          # not the previous scale
    scale = fdiv_rn(fp8_max, amax); Inf -> value_for_inf (FLT_MAX)
    pow2: keep sign and exponent bits (exact round down to 2^k)

torchao (spec 6.2): ``scale = fl32(max / max(fp64(amax), 1e-12))`` in float64; pow2 rounding is
``exp2(floor(log2(scale)))`` in float32; amax 0 -> max * 1e12, Inf -> 0, NaN -> NaN.  Casts are
``satfinite(RN(fl32(x) * scale))`` for both; torchao dequantizes by dividing by its scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util.args import as_array, as_bool, as_int, as_real, is_real_float_dtype
from .._util.tensors import is_torch_tensor
from ..cast import encode
from ..cast.numpy_backend import encode_scaled_with_amax
from ..formats import FloatFormat, get_format
from .amax import amax_nan_propagating, amax_nan_skipping, as_float32, dtype_name
from .quantized import QuantizedData

__all__ = [
    "compute_scale_from_amax",
    "quantize_current_scaling",
    "quantize_with_scale",
    "torchao_amax_to_scale",
    "quantize_torchao",
    "TORCHAO_EPS",
]

FLT_MAX = np.float32(np.finfo(np.float32).max)
TORCHAO_EPS = 1e-12


def compute_scale_from_amax(
    amax: Any,
    fp8_max: float,
    *,
    pow2: bool = False,
    eps: float = 0.0,
    value_for_inf: float = float(FLT_MAX),
) -> np.ndarray:
    """TE's ``compute_scale_from_amax`` (``common/recipe/recipe_common.cuh``), elementwise, float32."""
    fp8_max = as_real(fp8_max, "fp8_max", finite=True, lo=0.0)
    pow2 = as_bool(pow2, "pow2")
    eps = as_real(eps, "eps", finite=True, lo=0.0)
    value_for_inf = as_real(value_for_inf, "value_for_inf", finite=True, lo=0.0)
    a = _real(amax, "amax", np.float32)
    a = np.where(a < np.float32(eps), np.float32(eps), a)
    special = ~np.isfinite(a) | (a == 0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        scale = np.float32(fp8_max) / np.where(special, np.float32(1), a)
    scale = np.where(np.isinf(scale), np.float32(value_for_inf), scale).astype(np.float32)
    if pow2:
        scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return np.where(special, np.float32(1), scale).astype(np.float32)


def _pertensor(
    codes: np.ndarray, scale_value: np.float32, fmt: FloatFormat, shape: tuple, dtype: str, **kw: Any
) -> QuantizedData:
    # an empty tensor still has its one scale (amax 0): a zero-length dim holds one empty block
    block = tuple(max(d, 1) for d in shape)
    return QuantizedData(codes, np.full((1,) * len(shape), scale_value, np.float32), fmt, block, shape, dtype, **kw)


def _amax_torchao(x: Any, x32: np.ndarray, axis: int | None) -> np.ndarray:
    """torchao's ``torch.max(torch.abs(x))`` / ``torch.amax(..., keepdim=True)``.  Any NaN gives a NaN amax;
    for a torch input its bits are those torch's reduction gives on this machine (the vectorized float32
    max returns 0xFFFFFFFF, spec 0 "6.2"), so a NaN result is recomputed by torch itself."""
    amax = amax_nan_propagating(x32) if axis is None else amax_nan_propagating(x32, axis=axis, keepdims=True)
    if is_torch_tensor(x) and np.isnan(amax).any():
        import torch

        with torch.no_grad():
            t = torch.abs(x.detach())
            a = torch.max(t) if axis is None else torch.amax(t, dim=axis, keepdim=True)
        amax = a.to(torch.float32).cpu().numpy()
    return amax


def _scaled(x: Any, x32: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """torchao's ``x.to(torch.float32) * scale``.  Where the product holds a NaN and ``x`` is a torch tensor
    it is recomputed by torch, whose kernels pick the NaN operand differently from numpy's (a NaN times a
    broadcast NaN scale keeps the scale's payload)."""
    with np.errstate(invalid="ignore", over="ignore"):  # Inf * 0 -> NaN, as upstream
        out = x32 * scale
    if is_torch_tensor(x) and np.isnan(out).any():
        import torch

        with torch.no_grad():
            t = x.detach().to(torch.float32) * torch.from_numpy(np.ascontiguousarray(scale)).to(x.device)
        out = t.cpu().numpy()
    return out


def _torch_nan_codes(codes: np.ndarray, scaled: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """torch's float8 cast of a NaN: ``0x7F | sign`` for E4M3FN and E5M2 alike (ml_dtypes writes E5M2 NaN
    as 0x7E); the fnuz formats have the one NaN 0x80 either way."""
    nan = np.isnan(scaled)
    if fmt.name not in ("e4m3", "e5m2") or not nan.any():
        return codes
    sign = (scaled.view(np.uint32) >> 31).astype(np.uint8) << 7
    return np.where(nan, np.uint8(0x7F) | sign, codes).astype(np.uint8)


def quantize_with_scale(x: Any, scale: Any, fmt: str | FloatFormat = "e4m3") -> QuantizedData:
    """``satfinite(RN(fl32(x) * scale))`` with a given float32 per-tensor quantization ``scale`` (a delayed
    scale, an amax reduced across ranks); the record's scale is ``scale_inv = 1/scale`` rounded once."""
    f = get_format(fmt)
    x32 = as_float32(x)
    s = np.float32(scale)
    codes, _ = encode_scaled_with_amax(x32, s, f, saturate=True)
    with np.errstate(divide="ignore"):
        return _pertensor(codes, np.float32(1) / s, f, x32.shape, dtype_name(x))


def _real(x: Any, arg: str, dtype: Any) -> np.ndarray:
    """``x`` (numbers, arrays, CPU tensors) as a real ``dtype`` array; complex, text or objects refused."""
    if is_torch_tensor(x):
        if x.is_complex() or x.dtype == __import__("torch").bool:
            raise TypeError(f"{arg} must be real numbers (a float, an array or a tensor), got {x.dtype}")
        x = x.detach().cpu().double()
    arr = as_array(x, arg)
    if arr.dtype.kind not in "iuf" and not is_real_float_dtype(arr.dtype):
        raise TypeError(f"{arg} must be real numbers (a float, an array or a tensor), got {arr.dtype}")
    with np.errstate(invalid="ignore"):  # a signalling NaN widens quietly, as torch's .to(float64) does
        return arr.astype(dtype)


def quantize_current_scaling(
    x: Any, fmt: str | FloatFormat = "e4m3", *, pow2: bool = False, eps: float = 0.0
) -> QuantizedData:
    """TE current scaling of one tensor: amax over the whole tensor (NaN skipped), the scale from
    :func:`compute_scale_from_amax`, ``satfinite(RN(fl32(x) * scale))``, ``scale_inv = 1/scale``
    rounded once (the result's scale)."""
    f = get_format(fmt)
    x32 = as_float32(x)
    scale = compute_scale_from_amax(amax_nan_skipping(x32), f.max, pow2=pow2, eps=eps)
    codes, _ = encode_scaled_with_amax(x32, scale, f, saturate=True)
    return _pertensor(codes, np.float32(1) / scale, f, x32.shape, dtype_name(x))


def torchao_amax_to_scale(amax: Any, fmt: str | FloatFormat, round_scales_to_power_of_2: bool = False) -> np.ndarray:
    """torchao ``amax_to_scale``: float64 ``max / max(amax, EPS)`` rounded to float32; optional
    float32 ``exp2(floor(log2(scale)))``."""
    f = get_format(fmt)
    round_scales_to_power_of_2 = as_bool(round_scales_to_power_of_2, "round_scales_to_power_of_2")
    a = _real(amax, "amax", np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (np.float64(f.max) / np.maximum(a, TORCHAO_EPS)).astype(np.float32)  # NaN propagates
        if round_scales_to_power_of_2:
            scale = np.exp2(np.floor(np.log2(scale))).astype(np.float32)
    return scale


def quantize_torchao(
    x: Any,
    fmt: str | FloatFormat = "e4m3",
    *,
    granularity: str = "tensorwise",
    axiswise_dim: int = -1,
    round_scales_to_power_of_2: bool = False,
) -> QuantizedData:
    """torchao float8 dynamic scaling: ``granularity`` "tensorwise" (one scale) or "axiswise" (one
    scale per slice, reducing over ``axiswise_dim`` with keepdim, as torchao's rowwise recipes do);
    amax in the input dtype, NaN propagating; cast ``clamp(fl32(x) * scale, +-max)`` then RN.
    The result stores torchao's scale with ``scale_is_divisor=True`` (dequantize is ``data / scale``)."""
    f = get_format(fmt)
    if not isinstance(granularity, str) or granularity not in ("tensorwise", "axiswise"):
        raise ValueError(f"granularity must be 'tensorwise' or 'axiswise', got {granularity!r:.60}")
    round_scales_to_power_of_2 = as_bool(round_scales_to_power_of_2, "round_scales_to_power_of_2")
    x32 = as_float32(x)
    if granularity == "tensorwise":
        amax = _amax_torchao(x, x32, None)
        scale = torchao_amax_to_scale(amax, f, round_scales_to_power_of_2)
        scaled = _scaled(x, x32, scale)
        codes = _torch_nan_codes(encode(scaled, f, saturate=True), scaled, f)
        return _pertensor(codes, scale, f, x32.shape, dtype_name(x), scale_is_divisor=True)
    axiswise_dim = as_int(axiswise_dim, "axiswise_dim")
    if x32.ndim == 0 or not -x32.ndim <= axiswise_dim < x32.ndim:
        raise ValueError(f"axiswise_dim {axiswise_dim} out of range for a tensor of shape {x32.shape}")
    dim = axiswise_dim % x32.ndim
    amax = _amax_torchao(x, x32, dim)
    scale = torchao_amax_to_scale(amax, f, round_scales_to_power_of_2)
    scaled = _scaled(x, x32, scale)
    codes = _torch_nan_codes(encode(scaled, f, saturate=True), scaled, f)
    # an empty reduced dim is one empty block (its amax is 0), not a block of length 0
    block = tuple(max(n, 1) if i == dim else 1 for i, n in enumerate(x32.shape))
    return QuantizedData(codes, scale, f, block, x32.shape, dtype_name(x), scale_is_divisor=True)
