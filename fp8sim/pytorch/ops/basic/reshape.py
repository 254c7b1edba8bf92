"""``Reshape`` (TE 2.20.0.dev0 ``ops/basic/reshape.py``): ``torch.reshape`` forward, back to the input's
shape in the backward."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..op import BasicOperation, OperationContext

__all__ = ["Reshape"]


class Reshape(BasicOperation):
    """Reshape to ``shape`` (one dimension may be -1)."""

    def __init__(self, shape: Iterable[int]) -> None:
        super().__init__()
        self._shape = tuple(shape)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        if ctx.requires_grad:
            ctx.input_shape = input_.size()
        return input_.reshape(*self._shape)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        return grad_output.reshape(*ctx.input_shape), ()
