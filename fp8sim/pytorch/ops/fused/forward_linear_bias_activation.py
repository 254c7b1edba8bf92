"""``ForwardLinearBiasActivation`` (TE 2.20.0.dev0 ``ops/fused/forward_linear_bias_activation.py``): the
forward GEMM with the bias in cuBLAS's epilogue, added to the float32 result before its one rounding
(or its FP8 cast), where the unfused ops round the GEMM output first and add the bias in the output
dtype.  TE fuses ``BasicLinear`` + ``Bias`` only for fp16/bf16 weights and without row tensor parallelism;
the activation slot exists but TE fuses none (``NotImplementedError``)."""

from __future__ import annotations

from typing import Any

import torch

from ..basic import BasicLinear, Bias
from ..basic._linear_gemms import linear_forward
from ..op import FusedOperation, OperationContext
from ._scan import scan

__all__ = ["ForwardLinearBiasActivation", "linear_bias_forward"]


def linear_bias_forward(
    linear: BasicLinear,
    linear_ctx: OperationContext,
    input_: Any,
    bias: torch.Tensor | None,
    prev_op_grad_output_quantizer: Any,
    output_quantizer: Any,
    **gemm_kwargs: Any,
) -> Any:
    """The fused forward GEMM of ``linear`` (bias, alpha, ``out`` accumulation in ``gemm_kwargs``), saving
    what ``linear``'s unfused backward reads."""
    from .._common import compute_dtype
    from .._gemm import GemmMode

    input_rg = linear_ctx.requires_grad
    weight_rg = linear_ctx.requires_grad and linear.weight.requires_grad
    fp8, override = linear._fp8_args()
    dtype = compute_dtype(input_, linear.weight.dtype)
    mode = GemmMode.current()
    quantizers = dict(
        input_quantizer=linear.get_quantizer("forward", 0),
        weight_quantizer=linear.get_quantizer("forward", 1),
        grad_output_quantizer=linear.get_quantizer("backward", 0),
        grad_input_quantizer=prev_op_grad_output_quantizer,
    )
    gemm_kwargs.setdefault("dtype", dtype)
    out, x_local, w = linear_forward(
        input_,
        linear.weight,
        bias=bias,
        tensor_parallel_mode=linear.tensor_parallel_mode,
        tensor_parallel_group=linear.tensor_parallel_group,
        sequence_parallel=linear.sequence_parallel,
        with_quantized_compute=fp8,
        backward_override=override,
        input_quantizer=quantizers["input_quantizer"],
        weight_quantizer=quantizers["weight_quantizer"],
        output_quantizer=output_quantizer,
        input_requires_grad=input_rg,
        weight_requires_grad=weight_rg,
        gemm_mode=mode,
        **gemm_kwargs,
    )
    if linear_ctx.requires_grad:
        linear._save_linear_ctx(
            linear_ctx, input_, x_local, w, fp8, override, dtype=dtype, gemm_mode=mode,
            input_requires_grad=input_rg, weight_requires_grad=weight_rg, **quantizers,
        )  # fmt: skip
    return out


def _bias_grad_quantizer(bias_ctx: OperationContext | None, linear: BasicLinear) -> None:
    """TE: the bias backward writes the linear's grad-output quantizer (none under ``backward_override``)."""
    if bias_ctx is not None and bias_ctx.requires_grad:
        override = linear._fp8_args()[1]
        bias_ctx.grad_input_quantizer = None if override is not None else linear.get_grad_output_quantizer()


class ForwardLinearBiasActivation(FusedOperation):
    """Fused forward GEMM + bias (+ activation: none fused in TE 2.20)."""

    def __init__(self, *, linear: BasicLinear, bias: Bias | None, activation: None) -> None:
        ops: list = [linear]
        self_idx = {"linear": 0, "bias": None, "activation": None}
        if bias is not None:
            self_idx["bias"] = len(ops)
            ops.append(bias)
        if activation is not None:
            self_idx["activation"] = len(ops)
            ops.append(activation)
        super().__init__(ops)
        self._op_idxs = self_idx

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
        if self._op_idxs["activation"] is not None:
            raise NotImplementedError("Activations are not yet supported")
        out = linear_bias_forward(
            linear, linear_ctx, input_, bias, prev_op_grad_output_quantizer, next_op_input_quantizer
        )
        _bias_grad_quantizer(bias_ctx, linear)
        return out, [() for _ in self.basic_ops]

    @staticmethod
    def fuse_forward_ops(ops: list, **unused: Any) -> list:
        """Fuse ``BasicLinear`` + ``Bias`` where cuBLAS can (fp16/bf16 weights, no row tensor parallelism)."""

        def make(window: list) -> Any:
            linear, bias = window
            if not (isinstance(linear, BasicLinear) and isinstance(bias, Bias)):
                return None
            if linear.tensor_parallel_mode == "row" or linear.weight.dtype not in (torch.float16, torch.bfloat16):
                return None
            return ForwardLinearBiasActivation(linear=linear, bias=bias, activation=None)

        return scan(ops, 2, make)
