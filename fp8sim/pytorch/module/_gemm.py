"""TE's ``general_gemm``, emulated: one FP8 GEMM on two quantized operands (float32 result)."""

from __future__ import annotations

import numpy as np
import torch

from ...recipe import Float8BlockScaling, Recipe
from ._operands import Operand

__all__ = ["gemm"]

# TE module constants for recipes without fp8_gemm_* fields (spec 4.7): fprop fast, dgrad/wgrad split
_SPLIT = {"fprop": False, "dgrad": True, "wgrad": True}


def _split_for(recipe: Recipe, which: str) -> bool:
    params = getattr(recipe, f"fp8_gemm_{which}", None)
    if params is not None:
        return bool(params.use_split_accumulator)
    if isinstance(recipe, Float8BlockScaling):
        return True
    return _SPLIT[which]


def _preset(accumulator: str, recipe: Recipe, which: str) -> str:
    if accumulator in ("hopper", "ada", "blackwell"):
        split = _split_for(recipe, which)
        if accumulator == "blackwell":
            return "blackwell_split" if split else "blackwell"
        return f"{accumulator}_{'split' if split else 'fast'}"
    return accumulator


def gemm(a: Operand, b: Operand, recipe: Recipe, which: str, accumulator: str | None) -> torch.Tensor:
    """``a @ b`` (float32 result).  ``accumulator=None``: exact FP8 products summed in float32
    (per-tensor scales applied after, as cuBLAS's epilogue; block scales folded into the operands);
    otherwise an fp8sim accumulator (a device name picks fast/split per GEMM as the recipe says)."""
    per_tensor = a.vals is not None and b.vals is not None
    if accumulator is None:
        if per_tensor:
            alpha = torch.tensor(np.float32(a.scale_inv) * np.float32(b.scale_inv), dtype=torch.float32)
            return torch.matmul(a.vals, b.vals) * alpha
        return torch.matmul(a.dq, b.dq)
    from ...gemm import scaled_mm

    if not per_tensor:
        return _block_gemm(a, b, recipe, _preset(accumulator, recipe, which))

    out = scaled_mm(
        a.codes.contiguous().numpy(),
        b.codes.contiguous().numpy(),
        np.float32(a.scale_inv),
        np.float32(b.scale_inv),
        out_dtype="float32",
        accumulator=_preset(accumulator, recipe, which),
        a_format=a.fmt,
        b_format=b.fmt,
        strict=False,
    )
    return torch.from_numpy(out)


def _codes_and_scales(op: Operand) -> tuple[np.ndarray, np.ndarray]:
    """Element codes and block scales of an operand as ``scaled_mm`` wants them: ``a`` (M, K) with
    scales (M, K/block) or (M/128, K/128); ``b`` (K, N) with scales (K/block, N) or (K/128, N/128)."""
    qt = op.qt
    codes = qt.codes[tuple(slice(0, n) for n in qt.shape)]  # scaled_mm takes partial edge blocks itself
    scales = qt.scales
    if qt.fmt.name == "e2m1" and qt.block[-2:] == (16, 16):  # NVFP4 16x16 weight tiles: one 1x16 scale per row
        scales = np.repeat(scales, 16, axis=-2)
    if op.transposed:
        codes, scales = codes.T, scales.T
    return np.ascontiguousarray(codes), np.ascontiguousarray(scales)


def _block_gemm(a: Operand, b: Operand, recipe: Recipe, preset: str) -> torch.Tensor:
    """Block-scaled GEMM through ``fp8sim.gemm.scaled_mm``: MX (E8M0 per 32), 1x128/128x128 (float32
    scale_inv per block) and NVFP4 (UE4M3 per 16, the global scales applied after the sum)."""
    from ...gemm import scaled_mm

    ac, sa = _codes_and_scales(a)
    bc, sb = _codes_and_scales(b)
    out = scaled_mm(
        ac, bc, sa, sb, out_dtype="float32", accumulator=preset, a_format=a.fmt, b_format=b.fmt, strict=False
    )
    if a.qt.global_scale is not None:  # NVFP4: the per-tensor factors after the sum, as TE's GEMM reference
        alpha = np.float32(np.float32(a.qt.global_scale) * np.float32(b.qt.global_scale))
        out = (out * alpha).astype(np.float32)
    return torch.from_numpy(out)
