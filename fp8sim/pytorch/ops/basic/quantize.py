"""``Quantize``: quantize the tensor with the autocast recipe (TE 2.20.0.dev0 ``ops/basic/quantize.py``);
an identity outside FP8 autocast.  ``forward`` / ``backward`` pick the passes that quantize; the backward
one follows ``backward_override`` (none then)."""

from __future__ import annotations

from typing import Any

import torch

from ...quantization import FP8GlobalStateManager
from .._common import is_quantized_tensor
from ..op import BasicOperation, OperationContext

__all__ = ["Quantize"]


class Quantize(BasicOperation):
    """Quantize the output (``forward``) and / or the grad input (``backward``)."""

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        self._quantize_forward, self._quantize_backward = forward, backward

    def num_quantizers(self, mode: str) -> int:
        if mode == "forward":
            return int(bool(self._quantize_forward))
        if mode == "backward":
            return int(bool(self._quantize_backward))
        return 0

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> Any:
        fp8 = FP8GlobalStateManager.is_fp8_enabled()
        backward = fp8 and self._quantize_backward
        if fp8:
            backward = backward and FP8GlobalStateManager.get_fp8_recipe().backward_override is None
        out = input_
        if fp8 and self._quantize_forward and not is_quantized_tensor(out):
            out = self.get_quantizer("forward", 0)(out)
        if ctx.requires_grad:
            ctx.quantize_backward = backward
        return out

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[Any, tuple]:
        dx = grad_output
        if ctx.quantize_backward and not is_quantized_tensor(dx):
            dx = self.get_quantizer("backward", 0)(dx)
        return dx, ()
