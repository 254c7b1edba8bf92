"""Quantize one GEMM operand per recipe (torch tensors in, dequantized float32 tensors out).

Per-tensor recipes (delayed, current) keep the decoded element values and the float32
``scale_inv`` apart, so the GEMM can apply ``scale_inv_a * scale_inv_b`` in its epilogue as cuBLAS
does; block recipes (MXFP8, 1x128/128x128, NVFP4) dequantize per block.  ``k_axis`` names the
operand's reduction axis in its GEMM: block scales run along it, and TE computes a separate
columnwise copy from the high-precision tensor where the GEMM needs the other axis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..._util.tensors import numpy_view
from ...cast import decode
from ...formats import FloatFormat
from ...recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
    tensor_format,
)
from ...scaling.amax import amax_nan_skipping_tensor
from ...scaling.current import compute_scale_from_amax, quantize_current_scaling, quantize_with_scale
from ...scaling.quantized import QuantizedData
from ._quantizers import _4over6_scope

__all__ = ["Operand", "quantize_operand", "cast_per_tensor", "operand_of_tensor", "PER_TENSOR"]

PER_TENSOR = (DelayedScaling, Float8CurrentScaling)


@dataclass
class Operand:
    """A quantized GEMM operand, a torch view of a :class:`~fp8sim.scaling.QuantizedData` record ``qt``
    (the modules' GEMMs and the attention core): ``dq`` (float32 dequantized values, the operand's
    shape; None for per-tensor recipes until :meth:`dequant` asks) and, for per-tensor recipes,
    ``vals`` (decoded codes), ``codes`` (uint8), ``scale_inv`` (float32) and ``fmt``.  ``fmt`` None:
    a high-precision operand (``dq`` as it is; the attention core's unquantized GEMMs)."""

    dq: torch.Tensor | None
    fmt: FloatFormat | None
    vals: torch.Tensor | None = None
    codes: torch.Tensor | None = None
    scale_inv: float | None = None
    qt: Any = None  # block recipes: the QuantizedData record (codes and block scales)
    transposed: bool = False  # ``qt`` holds the transpose of this operand
    high_precision: bool = False  # a CustomRecipe's IdentityQuantizer slot: ``dq`` holds the values as they are
    custom: Any = None  # a CustomRecipe slot's custom tensor (``.custom`` True): the GEMM is its quantizer's qgemm

    @classmethod
    def of_per_tensor(cls, q: QuantizedData, device: Any = None) -> Operand:
        """The GEMM operand of a per-tensor record: its codes and their decoded values as tensors (on
        ``device``), ``scale_inv`` the record's one scale."""
        codes = torch.from_numpy(q.codes)
        codes = codes if device is None else codes.to(device)
        return cls(None, q.fmt, decode(codes, q.fmt), codes, float(q.scales.reshape(-1)[0]), qt=q)

    def dequant(self) -> torch.Tensor:
        """float32 dequantized values: ``fl32(vals * scale_inv)`` for per-tensor recipes."""
        if self.dq is None:
            return self.vals * torch.tensor(self.scale_inv, dtype=torch.float32)
        return self.dq

    def t(self) -> Operand:
        """The operand transposed in its last two dims (a batch of matrices stays a batch)."""
        tr = lambda x: None if x is None else x.transpose(-1, -2)  # noqa: E731
        return Operand(
            tr(self.dq),
            self.fmt,
            tr(self.vals),
            tr(self.codes),
            self.scale_inv,
            self.qt,
            not self.transposed,
            self.high_precision,
            self.custom,
        )


def operand_of_tensor(t: Any, columnwise: bool) -> Operand:
    """The 2-D GEMM operand of TE tensor ``t`` (``(prod(shape[:-1]), shape[-1])``): blocked along its
    last axis (rowwise) or its first (columnwise), as :func:`quantize_operand` lays them out."""
    from ..tensor import Float8TensorStorage, NVFP4TensorStorage

    m, k = math.prod(t.shape[:-1]), t.shape[-1]
    if isinstance(t, Float8TensorStorage):  # one scale: either copy holds the same codes
        op = Operand.of_per_tensor(t.quantized_data(), t.device)
        return Operand(None, op.fmt, op.vals.reshape(m, k), op.codes.reshape(m, k), op.scale_inv, op.qt)
    qd = t.quantized_data(columnwise=columnwise)
    dq = torch.from_numpy(np.asarray(qd.dequantize(), np.float32))
    if isinstance(t, NVFP4TensorStorage) and columnwise:  # stored (k, m): the operand is its transpose
        return Operand(dq.t(), qd.fmt, qt=qd, transposed=True)
    return Operand(dq, qd.fmt, qt=qd)


def _per_tensor(x: torch.Tensor, q: QuantizedData, scale: Any, stats: dict | None) -> Operand:
    """The GEMM operand of ``q``, the per-tensor record of ``x`` that the scaling layer cast with ``scale``:
    the codes and their decoded values as tensors on ``x``'s device, ``scale_inv`` the record's scale."""
    op = Operand.of_per_tensor(q, x.device)
    if stats is not None:
        _count(stats, x, x.detach().float() * torch.tensor(float(scale), dtype=torch.float32), op.vals, q.fmt)
    return op


def cast_per_tensor(x: torch.Tensor, fmt: FloatFormat, scale: Any, stats: dict | None = None) -> Operand:
    """``x`` cast with a given per-tensor ``scale`` (:func:`fp8sim.scaling.current.quantize_with_scale`)."""
    return _per_tensor(x, quantize_with_scale(x.detach(), scale, fmt), scale, stats)


def _count(stats: dict, x: torch.Tensor, scaled: torch.Tensor, vals: torch.Tensor, fmt: FloatFormat) -> None:
    with torch.no_grad():
        stats["elements"] = stats.get("elements", 0) + x.numel()
        stats["overflow"] = stats.get("overflow", 0) + int((scaled.abs() > fmt.max).sum())
        stats["underflow"] = stats.get("underflow", 0) + int(((x != 0) & (vals == 0)).sum())


def _role_qparams(recipe: Recipe, kind: str) -> Any:
    return {
        "input": recipe.fp8_quant_fwd_inp,
        "weight": recipe.fp8_quant_fwd_weight,
        "grad": recipe.fp8_quant_bwd_grad,
    }[kind]


def quantize_operand(
    x: torch.Tensor,
    recipe: Recipe,
    kind: str,
    k_axis: int,
    *,
    scaler: Any = None,
    index: int = 0,
    seed: int = 0,
    stats: dict | None = None,
) -> Operand:
    """Quantize a 2-D operand (``kind``: "input", "weight" or "grad") for a GEMM reducing over ``k_axis``
    with the recipe's quantizer from :mod:`fp8sim.scaling` (delayed scaling: ``scaler.quantize(index, x)``,
    which casts with the slot's scale and folds the amax into its staging row)."""
    forward = kind != "grad"
    if isinstance(recipe, NVFP4BlockScaling):
        return _nvfp4(x, recipe, kind, k_axis, seed)
    fmt = tensor_format(recipe.fp8_format, forward)
    if isinstance(recipe, DelayedScaling):  # the slot's scale; the amax joins its staging row
        scale = scaler.scale[index]
        return _per_tensor(x, scaler.quantize(index, x.detach()), scale, stats)
    if isinstance(recipe, Float8CurrentScaling):
        qp = _role_qparams(recipe, kind)
        q = quantize_current_scaling(x.detach(), fmt, pow2=qp.power_2_scale, eps=qp.amax_epsilon)
        scale = None
        if stats is not None:  # the statistics count overflows of fl32(x * scale): the scale the cast used
            amax = np.float32(amax_nan_skipping_tensor(x))
            scale = compute_scale_from_amax(amax, fmt.max, pow2=qp.power_2_scale, eps=qp.amax_epsilon)
        return _per_tensor(x, q, scale, stats)
    xn = numpy_view(x.float())  # not .numpy(): that pins a parameter's storage (FSDP2 frees it)
    if isinstance(recipe, MXFP8BlockScaling):
        from ...scaling.mx import quantize_mx, quantize_mx_2d_te

        if kind == "weight" and getattr(recipe, "enable_2d_quantization", False):
            q = quantize_mx_2d_te(xn, fmt, k_axis)
            return Operand(torch.from_numpy(q.dequantize()), fmt, qt=q)
        q = quantize_mx(xn, fmt, axis=k_axis, scale_rule="rceil", flavor="te")
        return Operand(torch.from_numpy(q.dequantize()), fmt, qt=q)
    if isinstance(recipe, Float8BlockScaling):
        from ...scaling.block import quantize_block_scaling

        dim = {"input": recipe.x_block_scaling_dim, "weight": recipe.w_block_scaling_dim}.get(
            kind, recipe.grad_block_scaling_dim
        )
        qp = _role_qparams(recipe, kind)
        q = quantize_block_scaling(xn, fmt, block_dim=dim, columnwise=(dim == 1 and k_axis == 0), pow2=qp.power_2_scale)
        return Operand(torch.from_numpy(q.dequantize()), fmt, qt=q)
    raise NotImplementedError(f"fp8sim does not emulate the recipe {type(recipe).__name__}")


def _nvfp4(x: torch.Tensor, recipe: NVFP4BlockScaling, kind: str, k_axis: int, seed: int) -> Operand:
    from ...formats import E2M1
    from ...scaling.nvfp4 import quantize_nvfp4

    qp = {"input": recipe.fp4_quant_fwd_inp, "weight": recipe.fp4_quant_fwd_weight}.get(kind, recipe.fp4_quant_bwd_grad)
    columnwise = k_axis == 0
    if kind != "grad" and _4over6_scope(recipe.nvfp4_4over6, kind):
        return _nvfp4_4over6(x, recipe, kind, qp, columnwise)
    rht = qp.random_hadamard_transform and columnwise  # RHT: wgrad (columnwise) operands only
    xt = x.detach()
    if rht and xt.dtype != torch.bfloat16:
        # TE's RHT kernel takes bf16 only (csrc/quantizer.cpp: "RHT is only supported for bfloat16
        # input"); fp8sim rounds other dtypes to bf16 instead of refusing
        xt = xt.to(torch.bfloat16)
    elif not rht:
        xt = xt.float()
    xt = xt.t().contiguous() if columnwise else xt.contiguous()
    variant = getattr(recipe, "fp8sim_nvfp4_variant", "e4m3x16")
    if variant != "e4m3x16":  # the fp8sim extension: UE5M3 per 16 or E4M3 per 32 (scaling.nvfp4_variants)
        from ...scaling.nvfp4_variants import quantize_nvfp4_variant

        sr = qp.stochastic_rounding
        q = quantize_nvfp4_variant(
            xt, variant, rht=rht, stochastic=sr, seed=seed if sr else None, block_2d=qp.fp4_2d_quantization
        )
        dq = torch.from_numpy(q.dequantize())
        return Operand(dq.t() if columnwise else dq, E2M1, qt=q, transposed=columnwise)
    q = quantize_nvfp4(
        xt,
        rht=rht,  # the Hadamard transform in bf16, as TE computes it
        stochastic=qp.stochastic_rounding,
        seed=seed if qp.stochastic_rounding else None,
        block_2d=qp.fp4_2d_quantization,
    )
    dq = torch.from_numpy(q.dequantize())
    return Operand(dq.t() if columnwise else dq, E2M1, qt=q, transposed=columnwise)


def _nvfp4_4over6(x: torch.Tensor, recipe: NVFP4BlockScaling, kind: str, qp: Any, columnwise: bool) -> Operand:
    """A forward operand in the ``nvfp4_4over6`` scope, as TE's quantizer for it (``_quantizers._nvfp4``:
    E4M3 max 256 in the ``nvfp4_4over6_e4m3_use_256`` scope, the recipe's error mode, 2D tiles from the
    role's QParams; RHT and stochastic rounding refused as TE refuses them); the columnwise copy is the
    kernel on the transposed operand with the same global amax."""
    from ...formats import E2M1
    from ...scaling.nvfp4_4over6 import quantize_nvfp4_4over6, quantize_nvfp4_4over6_columnwise, te_err_use_fast_math

    if qp.random_hadamard_transform:
        raise ValueError("NVFP4 4over6 quantization does not support RHT.")
    if qp.stochastic_rounding:
        raise ValueError("NVFP4 4over6 quantization does not support stochastic rounding.")
    kw = dict(
        err_mode=recipe.nvfp4_4over6_err_mode,
        e4m3_max=256 if _4over6_scope(recipe.nvfp4_4over6_e4m3_use_256, kind) else 448,
        block_2d=qp.fp4_2d_quantization,
        err_fast_math=te_err_use_fast_math(),  # NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH, read per cast as TE does
    )
    xf = x.detach().float()
    q = quantize_nvfp4_4over6_columnwise(xf, **kw) if columnwise else quantize_nvfp4_4over6(xf.contiguous(), **kw)
    dq = torch.from_numpy(q.dequantize())
    return Operand(dq.t() if columnwise else dq, E2M1, qt=q, transposed=columnwise)
