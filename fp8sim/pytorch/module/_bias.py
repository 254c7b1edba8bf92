"""An FP32 bias in an FP8 GEMM: cuBLAS takes no FP32 bias there, so TE casts it to BF16 inside its autograd
function (``module/linear.py``: ``bias_dtype = torch.bfloat16`` when the activations are FP32) and returns
the bias gradient in the grad dtype.  Casting outside autograd would round the gradient to BF16 too."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["bias_through_bf16"]


class _BiasCast(torch.autograd.Function):
    """The bias rounded to the GEMM's bias dtype but kept in its own dtype, the gradient passed through
    unrounded: TE casts the bias inside its autograd function (linear.py ``cast_if_needed(bias,
    bias_dtype)``) and returns the bgrad in the grad dtype, so an FP32 bias's gradient is not rounded to BF16."""

    @staticmethod
    def forward(ctx: Any, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # type: ignore[override]
        return b.to(dtype).to(b.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None


def bias_through_bf16(b: torch.Tensor) -> torch.Tensor:
    """An FP32-activation bias through BF16 (values), its gradient in float32 (``_BiasCast``)."""
    if not torch.is_grad_enabled() or not b.requires_grad:
        return b.to(torch.bfloat16).to(b.dtype)
    return _BiasCast.apply(b, torch.bfloat16)
