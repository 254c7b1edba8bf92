"""``Dropout`` (TE 2.20.0.dev0 ``ops/basic/dropout.py``, kernel ``common/dropout/dropout.cu``).

Training with fp16/bf16 (or a per-tensor FP8 input) and ``numel % 16 == 0`` runs TE's fused kernel: an
element is dropped when its random byte is below ``floor(256 p)`` (the probability TE applies is that
over 256), kept ones are multiplied in float32 by ``fl32(1 / fl32(1 - p))`` (an FP8 input dequantized
first) and rounded once.  Otherwise the unfused path: a Bernoulli mask in the compute dtype scaled by
``1 / (1 - p)``, multiplied in that dtype.  The random bits are torch's CPU generator, not TE's Philox
stream on the GPU: which elements drop differs from a GPU run, the arithmetic on them does not.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ...tensor import Float8TensorStorage
from .._common import compute_dtype, maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["Dropout"]


class Dropout(BasicOperation):
    """Zero entries with probability ``p`` in training, scale the rest by ``1 / (1 - p)``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.dropout_probability = p

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> Any:
        dtype = compute_dtype(input_, input_.dtype)
        p = self.dropout_probability
        mask = None
        if not self.training:
            impl, out = "evaluation", input_
        elif input_.numel() % 16 == 0 and dtype in (torch.float16, torch.bfloat16):
            if not 0 <= p < 1:
                raise RuntimeError(f"Invalid dropout probability ({p}).")
            impl = "fused"
            x = input_.dequantize(dtype=torch.float32) if isinstance(input_, Float8TensorStorage) else None
            x = maybe_dequantize(input_, dtype).float() if x is None else x
            mask = torch.randint(0, 256, x.shape, dtype=torch.int32) >= math.floor(p * 256)
            out = (x * mask * _fused_scale(p)).to(dtype)
        else:
            impl = "unfused"
            x = maybe_dequantize(input_, dtype)
            keep = 1 - p
            mask = torch.empty_like(x).bernoulli_(keep)
            mask *= 1 / keep
            out = x * mask
        if ctx.requires_grad:
            ctx.save_for_backward(mask)
            ctx.impl, ctx.dropout_probability, ctx.dtype = impl, p, dtype
        return out

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        (mask,) = ctx.saved_tensors
        if ctx.impl == "evaluation":
            return grad_output, ()
        dy = maybe_dequantize(grad_output, ctx.dtype)
        if ctx.impl == "fused":
            return (dy.float() * mask * _fused_scale(ctx.dropout_probability)).to(ctx.dtype), ()
        return dy * mask, ()


def _fused_scale(p: float) -> float:
    """TE's ``const float scale = 1 / (1 - dropout_probability)`` with a float ``dropout_probability``."""
    return float(np.float32(1) / np.float32(np.float32(1) - np.float32(p)))
