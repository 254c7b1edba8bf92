"""``BackwardActivationBias`` (TE 2.20.0.dev0 ``ops/fused/backward_activation_bias.py``): the backward of
``Bias`` + ``GELU`` / ``ReLU`` as TE's ``dbias_dgelu`` / ``dbias_drelu`` kernel writing the previous op's
grad-output quantizer (dact in float32; the bias gradient summed from the float32 values for FP8 and
MXFP8 outputs, from the rounded ones otherwise: :func:`fp8sim.pytorch.ops._kernels.dbias_dact`).  TE fuses
only inside FP8 autocast without ``backward_override``, when the op before ``Bias`` has a grad-output
quantizer."""

from __future__ import annotations

from typing import Any

import torch

from .._common import maybe_dequantize
from .._kernels import dbias_dact
from ..basic import GELU, Bias, ReLU
from ..op import FusedOperation, OperationContext

__all__ = ["BackwardActivationBias"]


class BackwardActivationBias(FusedOperation):
    """Fused backward dact + dbias + quantize."""

    def __init__(self, *, bias: Bias, activation: GELU | ReLU) -> None:
        super().__init__((bias, activation))

    def fuser_backward(
        self, basic_op_ctxs: list[OperationContext], grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[Any, list, list]:
        bias_ctx, act_ctx = basic_op_ctxs
        (x,) = act_ctx.saved_tensors
        x = maybe_dequantize(x.contiguous(), act_ctx.dtype)
        dy = maybe_dequantize(grad_output.contiguous(), x.dtype)
        quantizer = bias_ctx.grad_input_quantizer
        if quantizer is None:
            raise RuntimeError(
                "BackwardActivationBias requires previous op's grad output quantizer, but Bias context has no quantizer"
            )
        db, dx = dbias_dact(self.basic_ops[1]._fn(), dy, x, quantizer)
        return dx, [(db,), ()], [(), ()]

    @staticmethod
    def fuse_backward_ops(ops: list, *, recipe: Any = None, **unused: Any) -> list:
        """Fuse ``Bias`` + ``GELU``/``ReLU`` after an op with a grad-output quantizer (FP8, no override)."""
        if recipe is None or recipe.backward_override is not None:
            return ops
        out, i = [], 0
        while i < len(ops):
            window = ops[i : i + 3]
            if (
                len(window) == 3
                and isinstance(window[2], (GELU, ReLU))
                and isinstance(window[1], Bias)
                and window[0].get_grad_output_quantizer() is not None
            ):
                out.append(window[0])
                out.append(BackwardActivationBias(bias=window[1], activation=window[2]))
                i += 3
            else:
                out.append(ops[i])
                i += 1
        return out
