"""``ForwardLinearBiasAdd`` (TE 2.20.0.dev0 ``ops/fused/forward_linear_bias_add.py``): ``BasicLinear``
(+ ``Bias``) + in-place ``AddExtraInput`` as one GEMM accumulating into the extra input
(``beta = 1``): GEMM, bias and the extra input summed in float32, rounded once into the extra input's
dtype and storage (which the unfused ops round after each step)."""

from __future__ import annotations

from typing import Any

import torch

from ..basic import AddExtraInput, BasicLinear, Bias
from ..op import FusedOperation, OperationContext
from .forward_linear_bias_activation import _bias_grad_quantizer, linear_bias_forward

__all__ = ["ForwardLinearBiasAdd"]


class ForwardLinearBiasAdd(FusedOperation):
    """Fused forward GEMM + bias + add."""

    def __init__(self, *, linear: BasicLinear, bias: Bias | None, add: AddExtraInput) -> None:
        ops: list = [linear]
        idxs = {"linear": 0, "bias": None, "add": None}
        if bias is not None:
            idxs["bias"] = len(ops)
            ops.append(bias)
        idxs["add"] = len(ops)
        ops.append(add)
        super().__init__(ops)
        self._op_idxs = idxs

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
        linear, linear_ctx = self.basic_ops[0], basic_op_ctxs[0]
        bias_idx = self._op_idxs["bias"]
        bias = bias_ctx = None
        if bias_idx is not None:
            bias, bias_ctx = self.basic_ops[bias_idx].bias, basic_op_ctxs[bias_idx]
            if basic_op_kwargs[bias_idx]:
                raise ValueError("Bias operation forward does not expect keyword arguments")
        extra = basic_op_extra_inputs[self._op_idxs["add"]][0]
        out = linear_bias_forward(
            linear,
            linear_ctx,
            input_,
            bias,
            prev_op_grad_output_quantizer,
            None,
            dtype=extra.dtype,
            out=extra,
            accumulate_into_out=True,
        )
        _bias_grad_quantizer(bias_ctx, linear)
        return out, [() for _ in self.basic_ops]

    @staticmethod
    def fuse_forward_ops(ops: list, **unused: Any) -> list:
        """Fuse ``BasicLinear`` (+ ``Bias``) + ``AddExtraInput(in_place=True)`` (no row tensor parallelism)."""
        out, i = [], 0
        while i < len(ops):
            op = ops[i]
            if not isinstance(op, BasicLinear) or op.tensor_parallel_mode == "row":
                out.append(op)
                i += 1
                continue
            j = i + 1
            bias = ops[j] if j < len(ops) and isinstance(ops[j], Bias) else None
            j += bias is not None
            if j < len(ops) and isinstance(ops[j], AddExtraInput) and ops[j]._in_place:
                out.append(ForwardLinearBiasAdd(linear=op, bias=bias, add=ops[j]))
                i = j + 1
            else:
                out.extend(ops[i:j])
                i = j
        return out
