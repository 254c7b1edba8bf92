"""``L2Normalization`` (TE 2.20.0.dev0 ``ops/basic/l2normalization.py``, formulas ``jit.py``
``l2normalization_fwd_fused_`` / ``l2normalization_backward_fused_``): ``x * rsqrt(sum(x^2) + eps)`` over the
last dimension in float32, rounded once; the backward
``rsqrt_norm * (dy - x * sum(x dy) / (sum(x^2) + eps))`` in float32.  TE runs them through
``torch.compile``; fp8sim evaluates the same expressions eagerly."""

from __future__ import annotations

from typing import Any

import torch

from .._common import maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["L2Normalization"]


class L2Normalization(BasicOperation):
    """Scale each vector (last dimension) to unit L2 norm.  ``seq_length`` / ``micro_batch_size`` are TE's
    JIT warm-up hints (no effect here)."""

    def __init__(
        self, *, eps: float = 1e-6, seq_length: int | None = None, micro_batch_size: int | None = None
    ) -> None:
        super().__init__()
        self.eps = eps

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        x = maybe_dequantize(input_)
        x32 = x.float()
        rsqrt_norm = torch.rsqrt(x32.pow(2).sum(dim=-1, keepdim=True) + self.eps)
        y = (x32 * rsqrt_norm).to(x.dtype)
        if ctx.requires_grad:
            ctx.save_for_backward(x, rsqrt_norm)
        return y

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        x, rsqrt_norm = ctx.saved_tensors
        dy = maybe_dequantize(grad_output)
        x32, dy32 = x.float(), dy.float()
        x_dy = (x32 * dy32).sum(dim=-1, keepdim=True)
        norm_eps = x32.pow(2).sum(dim=-1, keepdim=True) + self.eps
        return (rsqrt_norm * (dy32 - x32 * x_dy / norm_eps)).to(x.dtype), ()
