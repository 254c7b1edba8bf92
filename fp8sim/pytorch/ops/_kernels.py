"""The TE kernels the fusible ops launch (``transformer_engine_torch``: ``gelu``/``dgelu`` ...,
``dbias_dgelu``, ``bgrad_quantize``, ``layernorm_fwd``, ``rmsnorm_fwd``), as TE 2.20.0.dev0's extensions
choose their implementation per output quantizer (``csrc/extensions/activation.cpp``, ``bias.cpp``,
``normalization.cpp``):

- activations and their gradients compute in float32 whatever the input dtype (formulas: TE's test
  references, ``module/_activations.py``; gradients: autograd of those float32 formulas).  Without a
  quantizer the result is rounded once to the input dtype.  A delayed-scaling ``Float8Quantizer`` gets the
  float32 result cast straight to FP8 (amax on the float32 values; the fully fused kernel).  ``MXFP8``
  casts the values rounded to the input dtype (its kernels truncate to it).  Current scaling and NVFP4 cast
  the rounded values with the amax of the float32 ones (``FUSED_ACTIVATION_AMAX``: the activation kernel
  takes the amax before its output cast); NVFP4 with RHT or row scaling, FP8 block scaling and any other
  quantizer quantize the rounded values themselves (``UNFUSED``).
- dbias + dact (``BackwardActivationBias``): the bias gradient is the float32 sum of the float32 dact values
  for FP8 / MXFP8 (one fused kernel), of the rounded ones otherwise (``at::sum_out`` on the temporary).
- LayerNorm / RMSNorm forward computes in float32; delayed scaling casts the float32 output straight to
  FP8, every other quantizer casts it rounded to the output dtype (the kernels' amax is taken on the
  converted values there, so that equals a separate cast).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...scaling.amax import amax_nan_skipping_tensor
from ..module._activations import ACTIVATIONS, _clamped_swiglu
from ..module._normalization import normalize
from ..tensor import Float8CurrentScalingQuantizer, Float8Quantizer, MXFP8Quantizer, NVFP4Quantizer

__all__ = [
    "activation_fn",
    "act_forward",
    "act_backward",
    "dbias_dact",
    "bgrad_quantize",
    "cast_output",
    "norm_forward",
    "norm_backward",
]


def _situglu(x: torch.Tensor, beta1: float, beta2: float) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return beta1 * torch.tanh(gate / beta1) * torch.sigmoid(gate) * beta2 * torch.tanh(up / beta2)


def activation_fn(name: str, **params: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The float32 activation ``name`` (TE's kernels' formula; ``params`` for clamped SwiGLU and SiTU-GLU)."""
    if name == "clamped_swiglu":
        return lambda x: _clamped_swiglu(x, **params)
    if name == "situglu":
        return lambda x: _situglu(x, params["beta1"], params["beta2"])
    return ACTIVATIONS[name]


def _impl(quantizer: Any) -> str:
    """TE's implementation of a producer kernel writing ``quantizer``'s output."""
    if quantizer is None or isinstance(quantizer, Float8Quantizer):
        return "fused"
    if isinstance(quantizer, MXFP8Quantizer):
        return "truncated"  # fully fused, but the kernel rounds to the input dtype first
    if isinstance(quantizer, Float8CurrentScalingQuantizer):
        return "amax"
    if isinstance(quantizer, NVFP4Quantizer):
        rht = quantizer.with_rht and quantizer.with_post_rht_amax
        return "unfused" if quantizer.row_scaled_nvfp4 or rht else "amax"
    return "unfused"


def _amax32(y32: torch.Tensor) -> np.float32:
    """The kernels' ``fmaxf(|y|)`` over float32 values (NaN skipped)."""
    return np.float32(amax_nan_skipping_tensor(y32)) if y32.numel() else np.float32(0)


def cast_output(y32: torch.Tensor, dtype: torch.dtype, quantizer: Any, impl: str | None = None) -> Any:
    """A float32 kernel result written as the kernel writes it for ``quantizer`` (see the module docstring)."""
    impl = impl or _impl(quantizer)
    if quantizer is None:
        return y32.to(dtype)
    if impl == "fused":  # fp32 -> FP8 in the kernel: the tensor's nominal dtype is still ``dtype``
        return quantizer(y32.float()).to_dtype(dtype)
    y = y32.to(dtype)
    if impl == "amax":
        return quantizer.quantize_with_amax(y, _amax32(y32))
    return quantizer(y)


def _grad32(fn: Callable, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        x32 = x.detach().float().requires_grad_(True)
        (dx,) = torch.autograd.grad(fn(x32), x32, dy.float())
    return dx


def act_forward(fn: Callable, x: torch.Tensor, quantizer: Any) -> Any:
    """``tex.<act>(x, quantizer)``: ``fn`` in float32, written for ``quantizer`` in ``x``'s dtype."""
    with torch.no_grad():
        return cast_output(fn(x.float()), x.dtype, quantizer)


def act_backward(fn: Callable, dy: torch.Tensor, x: torch.Tensor, quantizer: Any) -> Any:
    """``tex.d<act>(dy, x, quantizer)``: ``dy * fn'(x)`` in float32, written for ``quantizer`` in ``x``'s dtype."""
    return cast_output(_grad32(fn, x, dy), x.dtype, quantizer)


def dbias_dact(fn: Callable, dy: torch.Tensor, x: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, Any]:
    """``tex.dbias_d<act>(dy, x, quantizer)``: ``(dbias, dx)`` (see the module docstring)."""
    d32 = _grad32(fn, x, dy)
    impl = _impl(quantizer)
    n = d32.shape[-1]
    if impl in ("fused", "truncated") and quantizer is not None:
        db = d32.reshape(-1, n).sum(0).to(dy.dtype)
    else:
        db = d32.to(dy.dtype).reshape(-1, n).float().sum(0).to(dy.dtype)
    return db, cast_output(d32, x.dtype, quantizer, impl)


def bgrad_quantize(dy: torch.Tensor, quantizer: Any) -> tuple[torch.Tensor, Any]:
    """``tex.bgrad_quantize``: the bias gradient (float32 sum of ``dy``'s rows, in ``dy``'s dtype) and ``dy``
    quantized (fused or not, the same numbers: ``dy`` already has its dtype)."""
    n = dy.shape[-1]
    db = dy.reshape(-1, n).float().sum(0).to(dy.dtype)
    return db, (dy if quantizer is None else quantizer(dy.contiguous()))


def _check_cudnn_norm(quantizer: Any) -> None:
    if os.getenv("NVTE_NORM_FWD_USE_CUDNN", "0") == "1" and quantizer is not None:
        raise NotImplementedError(
            "NVTE_NORM_FWD_USE_CUDNN=1: cuDNN's normalization kernels (which TE then uses for quantized "
            "outputs) are not emulated by fp8sim; unset it to run TE's own kernels"
        )


def norm_forward(
    kind: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    quantizer: Any,
    zero_centered_gamma: bool,
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """``tex.layernorm_fwd`` / ``tex.rmsnorm_fwd`` on a 2-D ``x``: ``(y, mu, rsigma)`` (float32 statistics;
    ``mu`` is empty for RMSNorm).  ``y`` is in ``x``'s dtype, or quantized (see the module docstring)."""
    _check_cudnn_norm(quantizer)
    with torch.no_grad():
        x32 = x.float()
        if kind == "LayerNorm":
            mu = x32.mean(-1)
            rsigma = torch.rsqrt((x32 - mu[:, None]).pow(2).mean(-1) + eps)
        else:
            mu = torch.empty(0)
            rsigma = torch.rsqrt(x32.pow(2).mean(-1) + eps)
        y32 = normalize(x, weight, bias, eps, kind, zero_centered_gamma)
        impl = "fused" if quantizer is None or isinstance(quantizer, Float8Quantizer) else "unfused"
        return cast_output(y32, x.dtype, quantizer, impl), mu, rsigma


def norm_backward(
    kind: str,
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    zero_centered_gamma: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``tex.layernorm_bwd`` / ``rmsnorm_bwd``: ``(dx, dgamma, dbeta)`` computed in float32 (autograd of the
    float32 forward), each rounded once to its tensor's dtype."""
    with torch.enable_grad():
        x32 = x.detach().float().requires_grad_(True)
        w32 = weight.detach().float().requires_grad_(True)
        b32 = None if bias is None else bias.detach().float().requires_grad_(True)
        y32 = normalize(x32, w32, b32, eps, kind, zero_centered_gamma)
        inputs = (x32, w32) if b32 is None else (x32, w32, b32)
        grads = torch.autograd.grad(y32, inputs, dy.float())
    dx, dw = grads[0].to(x.dtype), grads[1].to(weight.dtype)
    db = None if bias is None else grads[2].to(bias.dtype)
    return dx, dw, db
