"""``BackwardAddRMSNorm`` (TE 2.20.0.dev0 ``ops/fused/backward_add_rmsnorm.py``): the backward of
``MakeExtraOutput`` (not in place) + ``RMSNorm`` as TE's ``rmsnorm_bwd_add``: the extra output's gradient
added to the float32 dx before its one rounding (the unfused ops add it to the rounded dx)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._common import maybe_dequantize
from ..basic import MakeExtraOutput, RMSNorm
from ..op import FusedOperation, OperationContext
from ._scan import scan

__all__ = ["BackwardAddRMSNorm"]


class BackwardAddRMSNorm(FusedOperation):
    """Fused backward RMSNorm + add."""

    def __init__(self, *, add: MakeExtraOutput, rmsnorm: RMSNorm) -> None:
        super().__init__((add, rmsnorm))

    def fuser_backward(
        self, basic_op_ctxs: list[OperationContext], grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[Any, list, list]:
        norm, ctx = self.basic_ops[1], basic_op_ctxs[1]
        x = ctx.saved_tensors[0]
        wdims = norm.weight.size()
        inner = math.prod(wdims)
        dy = maybe_dequantize(grad_output.contiguous(), ctx.dtype).view(x.size())
        w = maybe_dequantize(norm.weight, ctx.dtype).view((inner,))
        extra = basic_op_grad_extra_outputs[0][0]
        add = torch.zeros_like(dy) if extra is None else maybe_dequantize(extra.contiguous(), ctx.dtype).view(x.size())
        with torch.enable_grad():
            from ...module._normalization import normalize

            x32 = x.detach().float().requires_grad_(True)
            w32 = w.detach().float().requires_grad_(True)
            y32 = normalize(x32, w32, None, norm.eps, "RMSNorm", norm.zero_centered_gamma)
            dx32, dw32 = torch.autograd.grad(y32, (x32, w32), dy.float())
        dx = (dx32 + add.float()).to(x.dtype)
        return dx.view(grad_output.size()), [(), (dw32.to(w.dtype).view(wdims),)], [(), ()]

    @staticmethod
    def fuse_backward_ops(ops: list, **unused: Any) -> list:
        """Fuse ``MakeExtraOutput(in_place=False)`` + ``RMSNorm``."""

        def make(window: list) -> Any:
            add, norm = window
            if isinstance(add, MakeExtraOutput) and isinstance(norm, RMSNorm) and not add._in_place:
                return BackwardAddRMSNorm(add=add, rmsnorm=norm)
            return None

        return scan(ops, 2, make)
