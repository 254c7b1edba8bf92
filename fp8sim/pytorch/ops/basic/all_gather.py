"""``AllGather``: concatenate the ranks' tensors along dim 0 (TE 2.20.0.dev0 ``ops/basic/all_gather.py``);
the backward reduce-scatters the gradient (SUM)."""

from __future__ import annotations

from typing import Any

import torch

from ..._comm import gather_along_first_dim, reduce_scatter_along_first_dim
from .._common import maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["AllGather"]


class AllGather(BasicOperation):
    """All-gather along the outer dimension over ``process_group``."""

    def __init__(self, process_group: Any = None) -> None:
        super().__init__()
        self.process_group = process_group
        self.process_group_size = torch.distributed.get_world_size(process_group)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> Any:
        if self.process_group_size == 1:
            return input_.detach()
        return gather_along_first_dim(input_, self.process_group)[0]

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        if self.process_group_size == 1:
            return grad_output, ()
        dims = grad_output.size()
        if not dims or dims[0] % self.process_group_size != 0:
            raise RuntimeError(
                f"Attempted to reduce-scatter a tensor with shape={list(dims)} over {self.process_group_size} processes"
            )
        dy = maybe_dequantize(grad_output.contiguous())
        return reduce_scatter_along_first_dim(dy, self.process_group)[0], ()
