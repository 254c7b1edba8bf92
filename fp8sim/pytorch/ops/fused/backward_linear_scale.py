"""``BackwardLinearScale`` (TE 2.20.0.dev0 ``ops/fused/backward_linear_scale.py``): the backward of
``BasicLinear`` + ``ConstantScale`` as dgrad and wgrad GEMMs with ``alpha = scale`` (applied to the float32
results), where the unfused ops scale ``dy`` in its dtype first."""

from __future__ import annotations

from typing import Any

import torch

from ..basic import BasicLinear, ConstantScale
from ..op import FusedOperation, OperationContext
from ._scan import scan

__all__ = ["BackwardLinearScale"]


class BackwardLinearScale(FusedOperation):
    """Fused backward dgrad/wgrad GEMMs + scale (no column tensor parallelism)."""

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale) -> None:
        super().__init__((linear, scale))

    def fuser_backward(
        self, basic_op_ctxs: list[OperationContext], grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[Any, list, list]:
        linear, scale = self.basic_ops
        alpha = scale.scale
        dx, dw = linear._linear_backward(basic_op_ctxs[0], grad_output, grad_input_alpha=alpha, grad_weight_alpha=alpha)
        return dx, [(dw,), ()], [(), ()]

    @staticmethod
    def fuse_backward_ops(ops: list, **unused: Any) -> list:
        """Fuse ``BasicLinear`` + ``ConstantScale``."""

        def make(window: list) -> Any:
            linear, scale = window
            if not (isinstance(linear, BasicLinear) and isinstance(scale, ConstantScale)):
                return None
            if linear.tensor_parallel_mode == "column":
                return None
            return BackwardLinearScale(linear=linear, scale=scale)

        return scan(ops, 2, make)
