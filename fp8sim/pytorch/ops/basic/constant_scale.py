"""``ConstantScale``: multiply by a constant (TE 2.20.0.dev0 ``ops/basic/constant_scale.py``)."""

from __future__ import annotations

from typing import Any

import torch

from ..op import BasicOperation, OperationContext

__all__ = ["ConstantScale"]


class ConstantScale(BasicOperation):
    """``y = scale * x``; the backward multiplies by the same constant."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        return input_ * self.scale

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        return grad_output * self.scale, ()
