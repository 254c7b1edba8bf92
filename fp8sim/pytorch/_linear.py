"""The FP8 linear autograd function: fprop, dgrad and wgrad GEMMs on quantized operands."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..recipe import Float8BlockScaling, Recipe
from ._operands import Operand
from .quantization import current_state

__all__ = ["gemm", "fp8_linear"]

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
    from ..gemm import scaled_mm

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
    from ..gemm import scaled_mm

    ac, sa = _codes_and_scales(a)
    bc, sb = _codes_and_scales(b)
    out = scaled_mm(
        ac, bc, sa, sb, out_dtype="float32", accumulator=preset, a_format=a.fmt, b_format=b.fmt, strict=False
    )
    if a.qt.global_scale is not None:  # NVFP4: the per-tensor factors after the sum, as TE's GEMM reference
        alpha = np.float32(np.float32(a.qt.global_scale) * np.float32(b.qt.global_scale))
        out = (out * alpha).astype(np.float32)
    return torch.from_numpy(out)


class _FP8Linear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        inp: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        module: Any,
        recipe: Recipe,
        accumulator: str | None,
        is_first_microbatch: bool | None,
        first: bool,
    ) -> torch.Tensor:
        x = inp.reshape(-1, inp.shape[-1])
        per_tensor = module._per_tensor(recipe)
        x_row = module._quantize(x, recipe, "input", 1)
        w_row, w_col = module._weight_operands(weight, recipe, is_first_microbatch)
        out = gemm(x_row, w_row.t(), recipe, "fprop", accumulator)
        if bias is not None:
            out = out + bias.float()
        x_col = x_row if per_tensor else module._quantize(x, recipe, "input", 0)
        ctx.module, ctx.recipe, ctx.accumulator, ctx.first = module, recipe, accumulator, first
        ctx.x_col, ctx.w_col = x_col, w_col
        ctx.has_bias, ctx.inp_shape, ctx.dtypes = bias is not None, inp.shape, (inp.dtype, weight.dtype)
        ctx.region = _region_modules() if first else []  # the live list: later modules join it
        return out.to(inp.dtype).reshape(*inp.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        with torch.autocast(grad_out.device.type, enabled=False):
            return _FP8Linear._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        module, recipe, acc = ctx.module, ctx.recipe, ctx.accumulator
        dy = grad_out.reshape(-1, grad_out.shape[-1])
        dy_row = module._quantize(dy, recipe, "grad", 1)
        dgrad = gemm(dy_row, ctx.w_col, recipe, "dgrad", acc)
        dy_col = dy_row if module._per_tensor(recipe) else module._quantize(dy, recipe, "grad", 0)
        if module._wgrad_high_precision(recipe):
            wgrad = torch.matmul(dy.float().t(), ctx.x_col.dequant())
        else:
            wgrad = gemm(dy_col.t(), ctx.x_col, recipe, "wgrad", acc)
        dbias = dy.float().sum(0).to(ctx.dtypes[1]) if ctx.has_bias else None
        if ctx.first:  # the first FP8 module's backward runs last: update every backward scale (spec 4.4)
            for m in ctx.region:
                m._update_backward_scales()
        return (
            dgrad.to(ctx.dtypes[0]).reshape(ctx.inp_shape),
            wgrad.to(ctx.dtypes[1]),
            dbias,
            None,
            None,
            None,
            None,
            None,
        )


def _region_modules() -> list:
    return current_state().modules


# fp8_linear(inp, weight, bias, gemm_state, recipe, accumulator, is_first_microbatch, first) -> output
fp8_linear = _FP8Linear.apply
