"""SwiGLU and its variants (TE 2.20.0.dev0 ``ops/basic/swiglu.py``): ``SwiGLU`` (:math:`\\mathrm{SiLU}(a) b`),
``SiTUGLU`` (:math:`\\beta_1 \\tanh(a/\\beta_1)\\sigma(a)\\,\\beta_2 \\tanh(b/\\beta_2)`), ``ClampedSwiGLU``
(GPT-OSS: ``a`` clamped above at ``limit``, ``b`` to ``[-limit, limit]``, :math:`a\\sigma(\\alpha a)(b + o)`),
and the per-row post-scaled ``ScaledSwiGLU``, ``ScaledSiTUGLU``, ``ScaledClampedQGeGLU`` (the scale is an
extra input).

``glu_interleave_size``: the input alternates blocks of gate and linear units of that size instead of
holding two halves; the gradient comes back in the same layout (and, as in TE, unquantized).  Kernels
compute in float32 and write for the neighbouring ops' quantizers (:mod:`fp8sim.pytorch.ops._kernels`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .._common import SUPPORTED_DTYPES, compute_dtype, maybe_dequantize
from .._kernels import act_backward, act_forward, activation_fn
from ..op import BasicOperation, OperationContext
from .activation import _cache_quantized
from .add_extra_input import _overrides

__all__ = ["SwiGLU", "SiTUGLU", "ClampedSwiGLU", "ScaledSwiGLU", "ScaledSiTUGLU", "ScaledClampedQGeGLU"]


def _deinterleave(x: torch.Tensor, size: int | None) -> torch.Tensor:
    """Blocks ``[a_1 .. a_s, b_1 .. b_s, a_{s+1} ...]`` to halves ``[a ..., b ...]``."""
    if size is None:
        return x
    shape = x.shape
    return x.reshape(-1, shape[-1] // (2 * size), 2, size).transpose(1, 2).reshape(shape)


def _interleave(x: torch.Tensor, size: int | None) -> torch.Tensor:
    if size is None:
        return x
    shape = x.shape
    return x.reshape(-1, 2, shape[-1] // (2 * size), size).transpose(1, 2).reshape(shape)


def _check_betas(beta1: float, beta2: float) -> tuple[float, float]:
    beta1, beta2 = float(beta1), float(beta2)
    if not math.isfinite(beta1) or beta1 <= 0.0:
        raise ValueError(f"beta1 must be finite and positive, got {beta1}")
    if not math.isfinite(beta2) or beta2 <= 0.0:
        raise ValueError(f"beta2 must be finite and positive, got {beta2}")
    return beta1, beta2


class _GLUOp(BasicOperation):
    """A gated unit computed by TE's kernels on the (de-interleaved) input."""

    def __init__(self, *, cache_quantized_input: bool = False, glu_interleave_size: int | None = None) -> None:
        super().__init__()
        self.cache_quantized_input = cache_quantized_input
        self.glu_interleave_size = glu_interleave_size

    def _fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return activation_fn("swiglu")

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> Any:
        dtype = compute_dtype(input_, input_.dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise RuntimeError(f"Unsupported dtype ({dtype})")
        x = maybe_dequantize(input_.contiguous(), dtype)
        out = act_forward(self._fn(), _deinterleave(x, self.glu_interleave_size).contiguous(), next_op_input_quantizer)
        if self.cache_quantized_input:
            x = _cache_quantized(x)
        if ctx.requires_grad:
            ctx.save_for_backward(x)
            ctx.dtype, ctx.prev_op_grad_output_quantizer = dtype, prev_op_grad_output_quantizer
        return out

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[Any, tuple]:
        (x,) = ctx.saved_tensors
        x = maybe_dequantize(x.contiguous(), ctx.dtype)
        dy = maybe_dequantize(grad_output.contiguous(), ctx.dtype)
        size = self.glu_interleave_size
        quantizer = None if size is not None else ctx.prev_op_grad_output_quantizer
        dx = act_backward(self._fn(), dy, _deinterleave(x, size).contiguous(), quantizer)
        return _interleave(dx, size), ()


class SwiGLU(_GLUOp):
    """SwiGLU: :math:`\\mathrm{SiLU}(a) b`."""


class SiTUGLU(SwiGLU):
    """SiTU-GLU (Kimi K3): soft-capped gate and up branches, ``beta1``, ``beta2`` finite and positive."""

    def __init__(
        self,
        *,
        beta1: float = 4.0,
        beta2: float = 25.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: int | None = None,
    ) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input, glu_interleave_size=glu_interleave_size)
        self.beta1, self.beta2 = _check_betas(beta1, beta2)

    def _fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return activation_fn("situglu", beta1=self.beta1, beta2=self.beta2)


class ClampedSwiGLU(_GLUOp):
    """GPT-OSS SwiGLU: clamped inputs, ``sigmoid(alpha * a)``, ``glu_linear_offset`` added to ``b``."""

    def __init__(
        self,
        *,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
        cache_quantized_input: bool = False,
        glu_interleave_size: int | None = None,
    ) -> None:
        super().__init__(cache_quantized_input=cache_quantized_input, glu_interleave_size=glu_interleave_size)
        self.limit, self.alpha, self.glu_linear_offset = limit, alpha, glu_linear_offset

    def _fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return activation_fn(
            "clamped_swiglu", limit=self.limit, alpha=self.alpha, glu_linear_offset=self.glu_linear_offset
        )


class _ScaledGLU(BasicOperation):
    """A gated unit times a per-row scale (the extra input), computed in float32 by one kernel."""

    num_extra_inputs = 1

    def __init__(self, glu_interleave_size: int | None = None, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__()
        self.glu_interleave_size = glu_interleave_size
        if activation_recompute_in_mlp:
            raise ValueError(
                f"{self.__class__.__name__} does not support activation recomputation in the fused grouped MLP"
            )
        self.activation_recompute_in_mlp = activation_recompute_in_mlp

    def _glu(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return activation_fn("swiglu")

    def _scaled(self, x32: torch.Tensor, s32: torch.Tensor) -> torch.Tensor:
        return self._glu()(_deinterleave(x32, self.glu_interleave_size)) * s32.unsqueeze(-1)

    def op_forward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "forward"))

    def op_backward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "backward"))

    def fuser_forward(
        self, basic_op_ctxs: list, input_: torch.Tensor, *, basic_op_extra_inputs: list, **unused: Any
    ) -> tuple[torch.Tensor, list]:
        scales_in = basic_op_extra_inputs[0][0]
        ref = input_ if isinstance(input_, torch.Tensor) else scales_in
        dtype = compute_dtype(ref, ref.dtype)
        x = maybe_dequantize(input_, dtype)
        scales = maybe_dequantize(scales_in, dtype)
        with torch.no_grad():
            out = self._scaled(x.float(), scales.float()).to(dtype)
        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            ctx.input_requires_grad, ctx.extra_input_requires_grad = True, scales_in.requires_grad
            ctx.dtype = dtype
            ctx.save_for_backward(x, scales)
        return out, [()]

    def fuser_backward(
        self, basic_op_ctxs: list, grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[Any, list, list]:
        ctx = basic_op_ctxs[0]
        x, scales = ctx.saved_tensors
        x, scales = maybe_dequantize(x, ctx.dtype), maybe_dequantize(scales, ctx.dtype)
        dy = maybe_dequantize(grad_output, ctx.dtype)
        with torch.enable_grad():
            x32 = x.float().requires_grad_(True)
            s32 = scales.float().requires_grad_(ctx.extra_input_requires_grad)
            inputs = (x32, s32) if ctx.extra_input_requires_grad else (x32,)
            grads = torch.autograd.grad(self._scaled(x32, s32), inputs, dy.float())
        dx = grads[0].to(ctx.dtype) if ctx.input_requires_grad else None
        ds = grads[1].to(ctx.dtype) if ctx.extra_input_requires_grad else None
        return dx, [()], [(ds,)]


class ScaledSwiGLU(_ScaledGLU):
    """SwiGLU times a per-row scale (cuDNN grouped GEMM's ``act_func="swiglu"``)."""


class ScaledSiTUGLU(_ScaledGLU):
    """SiTU-GLU times a per-row scale."""

    def __init__(
        self,
        glu_interleave_size: int | None = None,
        *,
        activation_recompute_in_mlp: bool = False,
        beta1: float = 4.0,
        beta2: float = 25.0,
    ) -> None:
        super().__init__(glu_interleave_size, activation_recompute_in_mlp=activation_recompute_in_mlp)
        self.beta1, self.beta2 = _check_betas(beta1, beta2)

    def _glu(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return activation_fn("situglu", beta1=self.beta1, beta2=self.beta2)


class ScaledClampedQGeGLU(_ScaledGLU):
    """Clamped SwiGLU numerics (``limit``, ``alpha``, ``glu_linear_offset``) times a per-row scale
    (cuDNN grouped GEMM's ``act_func="geglu"``)."""

    def __init__(
        self,
        glu_interleave_size: int | None = None,
        *,
        activation_recompute_in_mlp: bool = False,
        limit: float = 7.0,
        alpha: float = 1.702,
        glu_linear_offset: float = 1.0,
    ) -> None:
        super().__init__(glu_interleave_size, activation_recompute_in_mlp=activation_recompute_in_mlp)
        self._clamped = ClampedSwiGLU(limit=limit, alpha=alpha, glu_linear_offset=glu_linear_offset)

    def _glu(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self._clamped._fn()
