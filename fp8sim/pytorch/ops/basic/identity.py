"""``Identity`` (TE 2.20.0.dev0 ``ops/basic/identity.py``)."""

from __future__ import annotations

from typing import Any

import torch

from ..op import BasicOperation, OperationContext

__all__ = ["Identity"]


class Identity(BasicOperation):
    """Return the input."""

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        return input_

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        return grad_output, ()
