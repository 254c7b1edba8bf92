"""``BasicLinear._functional_forward`` / ``_functional_backward`` (TE 2.20.0.dev0 ``ops/basic/basic_linear.py``):
the fprop, dgrad and wgrad GEMMs with TE's operand preparation, tensor-parallel collectives and checks.

With quantized compute the input and weight are quantized by their quantizers unless they arrive
quantized, the GEMM output is FP8 only through a delayed-scaling ``Float8Quantizer`` (TE's "unsupported
quantizer" error otherwise), and the forward keeps the columnwise copies the backward GEMMs read
(``backward_override`` keeps none).  Without quantized compute quantized operands are dequantized.
"""

from __future__ import annotations

from typing import Any

import torch

from ..._comm import gather_along_first_dim, reduce_scatter_along_first_dim
from ...tensor import Float8Quantizer, Float8TensorStorage
from .._common import SUPPORTED_DTYPES, canonicalize_dtype, is_quantized_tensor, maybe_dequantize
from .._gemm import GemmMode, ops_gemm

__all__ = ["linear_forward", "linear_backward", "set_quantizer_amax_reduction_group"]


def set_quantizer_amax_reduction_group(quantizer: Any, group: Any) -> None:
    """TE ``module/_common.py``: the quantizer all-reduces its amax over ``group`` (None: no reduction)."""
    target = getattr(quantizer, "parent_quantizer", quantizer)
    if target is not None and hasattr(target, "with_amax_reduction"):
        target.with_amax_reduction = group is not None
        target.amax_reduction_group = group


def _wait(handle: Any) -> None:
    if handle is not None:
        handle.wait()


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"Supported dtypes are float32, float16, bfloat16 (got {dtype})")


def _all_reduce(t: torch.Tensor, group: Any, async_op: bool = False) -> Any:
    from ..._comm import allreduce

    return allreduce(t, group, async_op=async_op)[1]


def linear_forward(
    input: torch.Tensor,  # noqa: A002 - TE's name
    weight: torch.Tensor,
    *,
    alpha: float = 1.0,
    bias: torch.Tensor | None = None,
    device: Any = None,  # noqa: ARG001 - TE's signature
    dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    beta: float | None = None,
    accumulate_into_out: bool = False,
    tensor_parallel_mode: str | None = None,
    tensor_parallel_group: Any = None,
    sequence_parallel: bool = False,
    with_quantized_compute: bool = False,
    backward_override: str | None = None,
    input_quantizer: Any = None,
    weight_quantizer: Any = None,
    output_quantizer: Any = None,
    input_requires_grad: bool = True,
    weight_requires_grad: bool = True,
    gemm_mode: GemmMode | None = None,
) -> tuple[Any, Any, Any]:
    """``(y, x_local for wgrad or None, w for dgrad or None)``; ``gemm_mode``: fp8sim's accumulator choice."""
    if dtype is None:
        if isinstance(out, torch.Tensor):
            dtype = out.dtype
        elif isinstance(weight, torch.Tensor):
            dtype = weight.dtype
        else:
            raise ValueError("Could not infer dtype from weight nor out and dtype was not provided")
    _check_dtype(dtype)
    if out is not None and out.dtype != dtype:
        raise ValueError(f"Output tensor has invalid dtype (expected {dtype}, got {out.dtype})")
    gather_x = tensor_parallel_mode == "column" and sequence_parallel
    x_local, x_wait = input, None
    if with_quantized_compute:
        if input_quantizer is None:
            raise ValueError("Missing quantizer for input tensor")
        input_quantizer.set_usage(rowwise=True, columnwise=weight_requires_grad and backward_override is None)
        set_quantizer_amax_reduction_group(input_quantizer, tensor_parallel_group if gather_x else None)
        if gather_x:
            input_quantizer.set_usage(columnwise=False)
            x, x_wait = gather_along_first_dim(x_local, tensor_parallel_group, async_op=True, quantizer=input_quantizer)
        else:
            if not is_quantized_tensor(x_local):
                x_local = input_quantizer(x_local)
            x = x_local
    else:
        x_local = maybe_dequantize(x_local, dtype)
        x = gather_along_first_dim(x_local, tensor_parallel_group)[0] if gather_x else x_local
    w = weight
    if not with_quantized_compute:
        w = maybe_dequantize(w, dtype)
    elif not is_quantized_tensor(w):
        if weight_quantizer is None:
            raise ValueError("Missing quantizer for weight tensor")
        weight_quantizer.set_usage(rowwise=True, columnwise=input_requires_grad and backward_override is None)
        w = weight_quantizer(w)
    y = out
    if y is None:
        if not with_quantized_compute or tensor_parallel_mode == "row":
            output_quantizer = None
    elif is_quantized_tensor(y):
        if not with_quantized_compute:
            raise ValueError("Output tensor is quantized, but quantized compute is not enabled")
        if tensor_parallel_mode == "row":
            raise ValueError("Output tensor is quantized, but row tensor parallelism does not support quantized output")
        output_quantizer = output_quantizer or getattr(y, "_quantizer", None)
        if output_quantizer is None:
            raise ValueError("Output tensor is quantized, but quantizer was not provided")
    else:
        output_quantizer = None
    if output_quantizer is not None:
        if not isinstance(output_quantizer, Float8Quantizer):
            raise RuntimeError("Attempting to generate quantized output tensor with unsupported quantizer")
        output_quantizer.set_usage(rowwise=True, columnwise=False)
    if accumulate_into_out:
        if y is None:
            raise ValueError("Attempted to accumulate into output tensor without providing output tensor")
        if tensor_parallel_mode == "row":
            raise ValueError("Accumulating into output tensor is not supported with row tensor parallelism")
    _wait(x_wait)
    y = ops_gemm(
        w,
        x,
        out_dtype=dtype,
        quantization_params=output_quantizer,
        alpha=alpha,
        beta=beta,
        accumulate=accumulate_into_out,
        out=y,
        bias=bias,
        mode=gemm_mode,
    )
    if tensor_parallel_mode == "row":
        if sequence_parallel:
            y, _ = reduce_scatter_along_first_dim(y, tensor_parallel_group)
        else:
            _all_reduce(y, tensor_parallel_group)
    if not input_requires_grad:
        w = None
    elif w is not weight and with_quantized_compute and is_quantized_tensor(w) and backward_override is None:
        w.update_usage(rowwise_usage=False, columnwise_usage=True)
    if not weight_requires_grad:
        x_local = None
    elif with_quantized_compute and is_quantized_tensor(x_local) and backward_override is None:
        if not (isinstance(x_local, Float8TensorStorage) and gather_x):  # FP8 does not gather its transpose
            x_local.update_usage(rowwise_usage=False, columnwise_usage=True)
    return y, x_local, w


def linear_backward(
    grad_output: torch.Tensor,
    input: Any,  # noqa: A002 - TE's name
    weight: Any,
    *,
    grad_input_alpha: float | None = None,
    input_requires_grad: bool = True,
    grad_weight_alpha: float | None = None,
    weight_requires_grad: bool = True,
    device: Any = None,  # noqa: ARG001 - TE's signature
    dtype: torch.dtype | None = None,
    grad_weight: torch.Tensor | None = None,
    grad_weight_beta: float | None = None,
    accumulate_into_grad_weight: bool = False,
    grad_input: torch.Tensor | None = None,
    grad_input_beta: float | None = None,
    accumulate_into_grad_input: bool = False,
    tensor_parallel_mode: str | None = None,
    tensor_parallel_group: Any = None,
    sequence_parallel: bool = False,
    with_quantized_compute: bool = False,
    input_quantizer: Any = None,
    weight_quantizer: Any = None,
    grad_output_quantizer: Any = None,
    grad_input_quantizer: Any = None,
    gemm_mode: GemmMode | None = None,
) -> tuple[Any, Any]:
    """``(dx, dw)``: the dgrad ("NN") and wgrad ("NT") GEMMs, as TE prepares their operands."""
    if dtype is None:
        dtype = weight.dtype if isinstance(weight, torch.Tensor) else grad_output.dtype
    dtype = canonicalize_dtype(dtype)
    _check_dtype(dtype)
    gather_dy = tensor_parallel_mode == "row" and sequence_parallel
    dy_local, dy_wait = grad_output, None
    if with_quantized_compute:
        if grad_output_quantizer is None:
            raise ValueError("Missing quantizer for grad output tensor")
        grad_output_quantizer.set_usage(rowwise=input_requires_grad, columnwise=weight_requires_grad)
        set_quantizer_amax_reduction_group(grad_output_quantizer, tensor_parallel_group if gather_dy else None)
        if gather_dy:
            dy, dy_wait = gather_along_first_dim(
                dy_local, tensor_parallel_group, async_op=True, quantizer=grad_output_quantizer
            )
        else:
            if not is_quantized_tensor(dy_local):
                dy_local = grad_output_quantizer(dy_local)
            else:
                dy_local.update_usage(rowwise_usage=input_requires_grad, columnwise_usage=weight_requires_grad)
            dy = dy_local
    else:
        dy_local = maybe_dequantize(dy_local, dtype)
        dy = gather_along_first_dim(dy_local, tensor_parallel_group)[0] if gather_dy else dy_local
    x = None
    if weight_requires_grad:
        if input is None:
            raise ValueError("Input tensor is required to compute weight grad")
        gather_x = tensor_parallel_mode == "column" and sequence_parallel
        if with_quantized_compute:
            if input_quantizer is None:
                raise ValueError("Missing quantizer for input tensor")
            input_quantizer.set_usage(rowwise=False, columnwise=True)
            set_quantizer_amax_reduction_group(input_quantizer, tensor_parallel_group if gather_x else None)
            if gather_x:
                x = gather_along_first_dim(input, tensor_parallel_group, quantizer=input_quantizer)[0]
            elif is_quantized_tensor(input):
                input.update_usage(columnwise_usage=True)
                x = input
            else:
                x = input_quantizer(input)
        else:
            x_local = maybe_dequantize(input, dtype)
            x = gather_along_first_dim(x_local, tensor_parallel_group)[0] if gather_x else x_local
    dx = None
    if input_requires_grad:
        if weight is None:
            raise ValueError("Weight tensor is required to compute input grad")
        w = weight
        if with_quantized_compute:
            if is_quantized_tensor(w):
                w.update_usage(columnwise_usage=True)
            else:
                if weight_quantizer is None:
                    raise ValueError("Missing quantizer for weight tensor")
                weight_quantizer.set_usage(columnwise=True)
                w = weight_quantizer(w)
        else:
            w = maybe_dequantize(w, dtype)
        _wait(dy_wait)
        dy_wait = None
        dx = grad_input
        if dx is None:
            if not with_quantized_compute or tensor_parallel_mode == "column":
                grad_input_quantizer = None
        elif is_quantized_tensor(dx):
            if not with_quantized_compute:
                raise ValueError("Grad input tensor is quantized, but quantized compute is not enabled")
            if tensor_parallel_mode == "column":
                raise ValueError(
                    "Grad input tensor is quantized, "
                    "but column tensor parallelism does not support quantized grad input"
                )
            grad_input_quantizer = grad_input_quantizer or getattr(dx, "_quantizer", None)
            if grad_input_quantizer is None:
                raise ValueError("Grad input tensor is quantized, but quantizer was not provided")
        else:
            grad_input_quantizer = None
        if grad_input_quantizer is not None and not isinstance(grad_input_quantizer, Float8Quantizer):
            raise RuntimeError("Attempting to generate quantized grad input tensor with unsupported quantizer")
        if accumulate_into_grad_input:
            if dx is None:
                raise ValueError("Attempted to accumulate into grad input tensor without providing grad input tensor")
            if tensor_parallel_mode == "column":
                raise ValueError("Accumulating into grad input tensor is not supported with column tensor parallelism")
        dx = ops_gemm(
            w,
            dy,
            layout="NN",
            out_dtype=dtype,
            quantization_params=grad_input_quantizer,
            alpha=grad_input_alpha,
            beta=grad_input_beta,
            accumulate=accumulate_into_grad_input,
            out=dx,
            mode=gemm_mode,
        )
        if tensor_parallel_mode == "column":
            if sequence_parallel:
                dx, _ = reduce_scatter_along_first_dim(dx, tensor_parallel_group)
            else:
                _all_reduce(dx, tensor_parallel_group)
    dw = None
    if weight_requires_grad:
        _wait(dy_wait)
        if grad_weight is None and accumulate_into_grad_weight:
            raise ValueError("Attempted to accumulate into grad weight tensor without providing grad weight tensor")
        dw = ops_gemm(
            x,
            dy,
            layout="NT",
            out_dtype=dtype if grad_weight is None else grad_weight.dtype,
            alpha=grad_weight_alpha,
            beta=grad_weight_beta,
            accumulate=accumulate_into_grad_weight,
            out=grad_weight,
            mode=gemm_mode,
        )
    return dx, dw
