"""``AllReduce``: SUM over the process group (TE 2.20.0.dev0 ``ops/basic/all_reduce.py``).  The output is
assumed to feed computations repeated on every rank, so the gradient passes through unreduced
(TE stores ``reduce_in_backward`` and does not read it; so does fp8sim)."""

from __future__ import annotations

from typing import Any

import torch

from ..._comm import allreduce
from .._common import maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["AllReduce"]


class AllReduce(BasicOperation):
    """All-reduce (SUM) over ``process_group``; a quantized input is dequantized first."""

    def __init__(self, process_group: Any = None, reduce_in_backward: bool = True) -> None:
        super().__init__()
        self.process_group = process_group
        self._reduce_in_backward = reduce_in_backward

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        if torch.distributed.get_world_size(self.process_group) == 1:
            return input_
        x = maybe_dequantize(input_.contiguous())
        return allreduce(x, self.process_group)[0]

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        return grad_output, ()
