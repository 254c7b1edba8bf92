"""NVFP4 variants: E2M1 elements with UE5M3 scales per 16 or E4M3 scales per 32, beside TE's E4M3 per 16.

Variants (``NVFP4_VARIANTS``: scale format, block size):

- ``"e4m3x16"``: TE's NVFP4 (:func:`fp8sim.scaling.nvfp4.quantize_nvfp4`), here for comparison.
- ``"ue5m3x16"``: TransformerEngine PR#3325 "Prototype NVFP4 with FP8 UE5M3 block scales" (open; read at
  its head ``b47e1f88b71134da6853d42c57ad5810f9802e68``, 2026-08-21).  ``common/cast/nvfp4/core_nvfp4.cuh``
  lines 54-94 template TE's two functions on the scale type: the global encode scale uses the scale
  type's max (``TypeExtrema<fp8ue5m3>::max = 114688``, ``common/common.h``), so ``S_enc = 6 * 114688 /
  amax = 688128 / amax``, and the block scale is ``static_cast<__nv_fp8_ue5m3>`` of the same float32
  product.  ``NVFP4Quantizer(disable_second_level_scale=True)`` (``pytorch/tensor/nvfp4_tensor.py``) drops
  the amax: the kernels then take ``S_enc = 1`` (``quantize_transpose_nvfp4.cuh``, ``amax_rowwise_ptr ==
  nullptr``), which UE5M3's range (2^-17 .. 114688) makes usable.
- ``"e4m3x32"``: E4M3 scales per 32 elements, the operand Triton PR#10941 feeds Rubin's block-scaled MMA
  ("NVFP4 with VEC_SIZE = 32 e4m3 scale").  Triton defines the GEMM, not a quantizer: fp8sim quantizes it
  with TE's E4M3 rule over 32-element blocks (an fp8sim derivation, not an upstream kernel).

Every variant runs TE's rule with ``M`` the scale format's max and ``B`` the block size, each step one
float32 rounding::

    S_enc = fmin(fl32(6M / global_amax), FLT_MAX)       # 1 when global_amax == 0 or S_enc == 0, or no 2nd level
    s_blk = scale_satfinite(fmin(fl32(vec_max * fl32(S_enc * fl32(1/6))), FLT_MAX))   # vec_max over B elements
    enc   = fmin(fl32(1 / fl32(s_blk * fl32(1 / S_enc))), FLT_MAX)
    code  = E2M1_RN(clamp(fl32(x * enc), -6, 6))          # scaled ±0 and NaN give code 0x0, as TE's reference

Amaxes skip NaN (CUDA ``fmaxf``).  The UE5M3 cast saturates to 114688 (assumed as for TE's E4M3 cast:
CUDA 13.4's ``__nv_fp8_ue5m3`` constructor was not read; the value reaches it only when a given
``global_amax`` is below the tensor's).  :func:`dequantize_nvfp4_variant` is the PR's
``dequantize_fp4_kernel``: ``final = fl32(fl32(s_blk * amax) * fl32(1 / 6M))`` with ``amax = 6M`` when
the tensor has none, ``out = fl32(code * final)``.

Swizzled scales: the UE5M3 scales use the same 128x4 layout as E4M3 (the PR swaps the scale type only);
the 32-element variant's layout (Triton's "4xNVFP4 with BLOCK_M = 256", CUDA 13.4 PTX) was not read and is
refused.  Packing is :func:`fp8sim.scaling.packing.pack_fp4` of ``codes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cast import decode, encode
from ..formats import E2M1, E4M3, UE5M3, FloatFormat
from .nvfp4 import _check_bool, _check_input, _e2m1, _to_float32, apply_rht
from .quantized import QuantizedData, expand_blocks

__all__ = ["NVFP4_VARIANTS", "quantize_nvfp4_variant", "dequantize_nvfp4_variant", "nvfp4_variant_of"]

NVFP4_VARIANTS: dict[str, tuple[FloatFormat, int]] = {
    "e4m3x16": (E4M3, 16),
    "ue5m3x16": (UE5M3, 16),
    "e4m3x32": (E4M3, 32),
}

_F32 = np.float32
_FLT_MAX = _F32(np.finfo(np.float32).max)
_ONE = _F32(1.0)
_FP4_MAX = _F32(6.0)
_INV6 = _ONE / _FP4_MAX  # the kernel's constexpr 1.0f / 6.0f
_OUT_DTYPES = ("float32", "bfloat16", "float16")


def _variant(variant: Any) -> tuple[FloatFormat, int]:
    if not isinstance(variant, str) or variant not in NVFP4_VARIANTS:
        raise ValueError(f"unknown NVFP4 variant {variant!r}; known: {', '.join(NVFP4_VARIANTS)}")
    return NVFP4_VARIANTS[variant]


def nvfp4_variant_of(qt: QuantizedData) -> str:
    """The variant name of an NVFP4 record (E2M1 codes, E4M3/UE5M3 scales per 16 or 32 along the last dim)."""
    bs = qt.block[-1] if qt.block else 0
    for name, (sf, b) in NVFP4_VARIANTS.items():
        if qt.fmt == E2M1 and qt.scale_format == sf and bs == b:
            return name
    raise TypeError(f"not an NVFP4 variant record: {qt!r}")


def _block_max(mag: np.ndarray, bs: int, block_2d: bool) -> np.ndarray:
    *lead, k = mag.shape
    if block_2d:
        t = mag.reshape(*lead[:-1], lead[-1] // bs, bs, k // bs, bs).swapaxes(-3, -2)
        t = t.reshape(*t.shape[:-2], bs * bs)
    else:
        t = mag.reshape(*lead, k // bs, bs)
    return np.fmax.reduce(t, axis=-1, initial=_F32(0))


def quantize_nvfp4_variant(
    x: Any,
    variant: str = "ue5m3x16",
    *,
    global_amax: Any = None,
    second_level_scale: bool = True,
    block_2d: bool = False,
    rht: bool = False,
    stochastic: bool = False,
    seed: int | None = None,
    swizzle: bool = False,
) -> QuantizedData:
    """Quantize ``x`` (float32/bfloat16/float16, numpy or torch) along its last dim to an NVFP4 variant.

    ``variant``: ``"ue5m3x16"``, ``"e4m3x32"`` or ``"e4m3x16"`` (module docstring).  The last dim must be a
    multiple of the block size.  ``global_amax``: the amax to use instead of ``max|x|`` (NaN skipped).
    ``second_level_scale=False``: TE PR#3325's ``disable_second_level_scale`` (``S_enc = 1``; the result has
    ``global_amax`` None).  ``block_2d``: 16x16 tiles (16-element variants; dim -2 a multiple of 16).
    ``rht``: :func:`fp8sim.scaling.nvfp4.apply_rht` first (the amax taken after it).  ``stochastic`` /
    ``seed``: the E2M1 cast with fp8sim's seeded stochastic rounding.  ``swizzle``: also the 128x4 blocked
    scales (2-D ``x``, 16-element variants).

    Returns a :class:`QuantizedData`: E2M1 codes, uint8 scale codes (``scale_format`` E4M3 or UE5M3),
    ``block`` ``(..., 1, B)`` (or ``(..., 16, 16)``), ``global_scale`` ``fl32(1/S_enc)``, ``global_amax``.
    """
    sfmt, bs = _variant(variant)
    _check_bool(
        second_level_scale=second_level_scale, block_2d=block_2d, rht=rht, stochastic=stochastic, swizzle=swizzle
    )
    if seed is not None and not stochastic:
        raise ValueError("seed is used only with stochastic=True")
    if not second_level_scale and global_amax is not None:
        raise ValueError("global_amax is unused with second_level_scale=False (TE: disable_second_level_scale)")
    if bs != 16 and (block_2d or swizzle):
        what = "block_2d (16x16 tiles)" if block_2d else "swizzle (its 4xNVFP4 scale layout is not emulated)"
        raise ValueError(f"variant {variant!r} (E4M3 per 32) supports no {what}; use a 16-element variant")
    dtype = _check_input(x, ("float32", "bfloat16", "float16"), "TE's high-precision dtypes")
    shape = tuple(int(n) for n in x.shape)
    if not shape or shape[-1] % bs:
        raise ValueError(
            f"x: last dim {shape[-1] if shape else None} must be divisible by the {variant} block size {bs} "
            f"(shape {shape})"
        )
    if block_2d and (len(shape) < 2 or shape[-2] % 16):
        raise ValueError(f"x: dim -2 ({shape[-2] if len(shape) > 1 else None}) must be divisible by 16 for 16x16 tiles")
    if rht:
        x = apply_rht(x)
    x32 = _to_float32(x)
    mag = np.abs(x32)
    amax: float | None = None
    if second_level_scale:
        if global_amax is None:
            amax = np.fmax.reduce(mag.reshape(-1), initial=_F32(0))
        else:
            a = np.asarray(global_amax, np.float64)
            if a.size != 1 or not (a.reshape(()) >= 0):
                raise ValueError(f"global_amax must be one value >= 0 (Inf allowed, NaN not); got {global_amax!r}")
            amax = a.astype(np.float32).reshape(())
        with np.errstate(divide="ignore", over="ignore"):
            s_enc = np.fmin(_F32(6.0 * sfmt.max) / amax, _FLT_MAX)
        s_enc = _ONE if (amax == 0 or s_enc == 0) else _F32(s_enc)
    else:
        s_enc = _ONE
    vec_max = _block_max(mag, bs, block_2d)
    with np.errstate(over="ignore"):
        s_dec_b = np.fmin(vec_max * (s_enc * _INV6), _FLT_MAX)
    scales = encode(s_dec_b, sfmt, saturate=True)
    s_dec = _ONE / s_enc
    block = (1,) * (len(shape) - 2 + (not block_2d)) + ((16, 16) if block_2d else (bs,))
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.fmin(_ONE / (decode(scales, sfmt) * s_dec), _FLT_MAX)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.clip(x32 * expand_blocks(enc, block), -_FP4_MAX, _FP4_MAX)
    codes = _e2m1(v, stochastic, seed)
    codes[(v == 0) | np.isnan(v)] = 0  # TE's reference cast_to_fp4x2: ±0 and NaN -> +0
    qt = QuantizedData(
        codes,
        scales,
        E2M1,
        block,
        shape,
        dtype,
        scale_format=sfmt,
        global_scale=float(s_dec),
        global_amax=None if amax is None else float(amax),
    )
    if swizzle:
        from .swizzle import with_blocked_scales

        qt = with_blocked_scales(qt)
    return qt


def dequantize_nvfp4_variant(qt: QuantizedData, *, out_dtype: str = "float32") -> np.ndarray:
    """TE PR#3325's ``dequantize_fp4_kernel`` for any variant: per block ``final = fl32(fl32(s_blk * amax) *
    fl32(1 / 6M))`` (``amax = 6M`` when the record has none), ``out = cast(fl32(code * final))``;
    ``out_dtype`` ``"float32"``, ``"bfloat16"`` or ``"float16"`` (one RN cast from float32)."""
    if not isinstance(qt, QuantizedData):
        raise TypeError(f"qt must be a QuantizedData, got {type(qt).__name__}")
    sfmt, _ = NVFP4_VARIANTS[nvfp4_variant_of(qt)]
    if not isinstance(out_dtype, str) or out_dtype not in _OUT_DTYPES:
        raise ValueError(f"unknown out_dtype {out_dtype!r}; known: {', '.join(_OUT_DTYPES)}")
    unit = _F32(6.0 * sfmt.max)  # fp4_max * scale max: exact in float32
    amax = unit if qt.global_amax is None else _F32(qt.global_amax)
    factor_inv = _ONE / unit
    with np.errstate(over="ignore", invalid="ignore"):
        final = (decode(qt.scales, sfmt) * amax) * factor_inv
        out = decode(qt.codes, E2M1) * expand_blocks(final, qt.block)
    if out_dtype == "bfloat16":
        import ml_dtypes

        out = out.astype(ml_dtypes.bfloat16)
    elif out_dtype == "float16":
        with np.errstate(over="ignore"):
            out = out.astype(np.float16)
    return out[tuple(slice(0, n) for n in qt.shape)]
