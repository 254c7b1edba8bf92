"""``ForwardLinearScaleAdd`` (TE 2.20.0.dev0 ``ops/fused/forward_linear_scale_add.py``): ``BasicLinear`` +
``ConstantScale`` + in-place ``AddExtraInput`` as one GEMM ``extra += scale * (x W^T)`` (``alpha = scale``,
``beta = 1``, one rounding)."""

from __future__ import annotations

from typing import Any

import torch

from ..basic import AddExtraInput, BasicLinear, ConstantScale
from ..op import FusedOperation, OperationContext
from ._scan import scan
from .forward_linear_bias_activation import linear_bias_forward

__all__ = ["ForwardLinearScaleAdd"]


class ForwardLinearScaleAdd(FusedOperation):
    """Fused forward GEMM + scale + add."""

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale, add: AddExtraInput) -> None:
        super().__init__((linear, scale, add))

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[Any, list]:
        linear, scale = self.basic_ops[0], self.basic_ops[1]
        out = linear_bias_forward(
            linear,
            basic_op_ctxs[0],
            input_,
            None,
            prev_op_grad_output_quantizer,
            None,
            alpha=scale.scale,
            out=basic_op_extra_inputs[2][0],
            accumulate_into_out=True,
        )
        return out, [() for _ in self.basic_ops]

    @staticmethod
    def fuse_forward_ops(ops: list, **unused: Any) -> list:
        """Fuse ``BasicLinear`` + ``ConstantScale`` + ``AddExtraInput(in_place=True)`` (no row tensor parallelism)."""

        def make(window: list) -> Any:
            linear, scale, add = window
            if not (isinstance(linear, BasicLinear) and isinstance(scale, ConstantScale)):
                return None
            if not isinstance(add, AddExtraInput) or not add._in_place or linear.tensor_parallel_mode == "row":
                return None
            return ForwardLinearScaleAdd(linear=linear, scale=scale, add=add)

        return scan(ops, 3, make)
