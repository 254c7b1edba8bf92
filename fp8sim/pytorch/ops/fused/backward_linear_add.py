"""``BackwardLinearAdd`` (TE 2.20.0.dev0 ``ops/fused/backward_linear_add.py``): the backward of
in-place ``MakeExtraOutput`` + ``BasicLinear`` as one dgrad GEMM that accumulates into the extra output's
gradient (``beta = 1``, the sum in float32, one rounding, in that gradient's dtype and storage); without an
extra-output gradient it is the plain backward."""

from __future__ import annotations

from typing import Any

import torch

from ..basic import BasicLinear, MakeExtraOutput
from ..op import FusedOperation, OperationContext
from ._scan import scan

__all__ = ["BackwardLinearAdd"]


class BackwardLinearAdd(FusedOperation):
    """Fused backward dgrad GEMM + add (no column tensor parallelism)."""

    def __init__(self, *, backward_add: MakeExtraOutput, linear: BasicLinear) -> None:
        super().__init__((backward_add, linear))

    def fuser_backward(
        self, basic_op_ctxs: list[OperationContext], grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[Any, list, list]:
        linear, ctx = self.basic_ops[1], basic_op_ctxs[1]
        grad_input = basic_op_grad_extra_outputs[0][0]
        kw: dict[str, Any] = {"grad_input": grad_input, "accumulate_into_grad_input": grad_input is not None}
        kw["dtype"] = None if grad_input is None else grad_input.dtype  # TE: None infers it from the weight
        dx, dw = linear._linear_backward(ctx, grad_output, **kw)
        return dx, [(), (dw,)], [(), ()]

    @staticmethod
    def fuse_backward_ops(ops: list, **unused: Any) -> list:
        """Fuse ``MakeExtraOutput(in_place=True)`` + ``BasicLinear``."""

        def make(window: list) -> Any:
            add, linear = window
            if not (isinstance(add, MakeExtraOutput) and isinstance(linear, BasicLinear)) or not add._in_place:
                return None
            if linear.tensor_parallel_mode == "column":
                return None
            return BackwardLinearAdd(backward_add=add, linear=linear)

        return scan(ops, 2, make)
