"""``Bias``: ``y = x + b`` (TE 2.20.0.dev0 ``ops/basic/bias.py``).  In the backward the bias gradient is
the float32 sum of ``dy``'s rows in ``dy``'s dtype; with a grad-input quantizer from the previous op
(not under ``backward_override``) ``dy`` leaves quantized (TE ``tex.bgrad_quantize``)."""

from __future__ import annotations

from typing import Any

import torch

from ...quantization import FP8GlobalStateManager
from .._common import canonicalize_device, canonicalize_dtype
from .._kernels import bgrad_quantize
from ..op import BasicOperation, OperationContext

__all__ = ["Bias"]


class Bias(BasicOperation):
    """Additive bias over the last dimension (``tensor_parallel``: split over the group's ranks)."""

    def __init__(
        self,
        size: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel: bool = False,
        tensor_parallel_group: Any = None,
    ) -> None:
        super().__init__()
        self._size = size
        device = canonicalize_device(device)
        defer = device.type == "meta"
        self.device = canonicalize_device(None) if defer else device
        tp_size, local = 1, size
        if tensor_parallel:
            tp_size = torch.distributed.get_world_size(tensor_parallel_group)
            tensor_parallel = tp_size > 1
            if size % tp_size != 0:
                raise ValueError(
                    f"Invalid configuration for tensor parallelism ({size=}, tensor_parallel_size={tp_size})"
                )
            local //= tp_size
        else:
            tensor_parallel_group = None
        self.tensor_parallel, self.tensor_parallel_group = tensor_parallel, tensor_parallel_group
        self.tensor_parallel_size, self.local_size = tp_size, local
        bias = torch.empty(local, device="meta", dtype=canonicalize_dtype(dtype))
        self.register_parameter("bias", torch.nn.Parameter(bias))
        if not defer:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zeros on the op's device."""
        bias = torch.empty_like(self.bias, device=self.device)  # a new tensor, as TE off CUDA
        with torch.no_grad():
            bias.zero_()
        self.bias = torch.nn.Parameter(bias)

    def pre_first_fuser_forward(self) -> None:
        super().pre_first_fuser_forward()
        if self.bias.device.type == "meta":
            self.reset_parameters()

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        b = self.bias.view([1] * (input_.dim() - 1) + [self.local_size])
        if ctx.requires_grad:
            ctx.grad_input_quantizer = prev_op_grad_output_quantizer
            if FP8GlobalStateManager.is_fp8_enabled() and FP8GlobalStateManager.get_fp8_recipe().backward_override:
                ctx.grad_input_quantizer = None
        return input_ + b

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[Any, tuple]:
        dy = grad_output
        if dy.dim() <= 1:
            return dy, (dy,)
        if ctx.grad_input_quantizer is None:
            db = dy.sum(tuple(range(dy.dim() - 1)))
        else:
            db, dy = bgrad_quantize(dy, ctx.grad_input_quantizer)
        return dy, (db,)
