"""What ``LayerNorm`` and ``RMSNorm`` share (TE 2.20.0.dev0 ``ops/basic/layer_norm.py``, ``rmsnorm.py``):
parameters, TE's SM-margin settings (accepted; there are no SMs to leave free on a CPU), and the
forward / backward through :func:`fp8sim.pytorch.ops._kernels.norm_forward` / ``norm_backward``."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import torch

from .._common import (
    canonicalize_device,
    canonicalize_dtype,
    devices_match,
    get_fused_normalization_quantizer,
    maybe_autocast_dtype,
    maybe_dequantize,
)
from .._kernels import norm_backward, norm_forward
from ..op import BasicOperation, OperationContext

__all__ = ["_NormOp"]


def _sm_margins(sm_margin: int | dict[str, int]) -> dict[str, int]:
    names = {"forward": "NVTE_FWD_LAYERNORM_SM_MARGIN", "backward": "NVTE_BWD_LAYERNORM_SM_MARGIN"}
    names["inference"] = "NVTE_INF_LAYERNORM_SM_MARGIN"
    if isinstance(sm_margin, dict):
        return {k: sm_margin.get(k, int(os.getenv(env, "0"))) for k, env in names.items()}
    return {k: int(os.getenv(env, str(sm_margin))) for k, env in names.items()}


class _NormOp(BasicOperation):
    """A normalization over the inner dimensions ``normalized_shape`` with a ``weight`` (and a ``bias``)."""

    _kind = "LayerNorm"

    def __init__(
        self,
        normalized_shape: Iterable[int] | int,
        *,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        sm_margin: int | dict[str, int] = 0,
    ) -> None:
        super().__init__()
        self.eps, self.zero_centered_gamma = eps, zero_centered_gamma
        shape = tuple(normalized_shape) if isinstance(normalized_shape, Iterable) else (normalized_shape,)
        device, dtype = canonicalize_device(device), canonicalize_dtype(dtype)
        self.register_parameter("weight", torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype)))
        if self._kind == "LayerNorm":
            self.register_parameter("bias", torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype)))
        if device.type != "meta":
            self.reset_parameters()
        self._sm_margins = _sm_margins(sm_margin)

    def _params(self) -> list[str]:
        return ["weight", "bias"] if self._kind == "LayerNorm" else ["weight"]

    def reset_parameters(self) -> None:
        """``weight``: ones (zeros with ``zero_centered_gamma``); ``bias``: zeros."""
        for name in self._params():
            p = getattr(self, name)
            device = p.device if p.device.type != "meta" else canonicalize_device(None)
            if not devices_match(p.device, device):
                p = torch.empty_like(p, device=device)
            with torch.no_grad():
                p.fill_(1.0 if name == "weight" and not self.zero_centered_gamma else 0.0)
            setattr(self, name, p if isinstance(p, torch.nn.Parameter) else torch.nn.Parameter(p))

    def pre_first_fuser_forward(self) -> None:
        super().pre_first_fuser_forward()
        if any(getattr(self, n).device.type == "meta" for n in self._params()):
            self.reset_parameters()

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> Any:
        quantizer = get_fused_normalization_quantizer(next_op_input_quantizer)
        wdims, idims = tuple(self.weight.size()), tuple(input_.size())
        if len(idims) < len(wdims) or idims[-len(wdims) :] != wdims:
            raise ValueError(f"Input tensor (shape={idims}) and weight tensor (shape={wdims}) are not compatible")
        inner = math.prod(wdims)
        dtype = maybe_autocast_dtype(device_type=input_.device.type, default_dtype=self.weight.dtype)
        x = maybe_dequantize(input_.contiguous(), dtype).view((-1, inner))
        w = maybe_dequantize(self.weight, dtype).view((inner,))
        b = maybe_dequantize(self.bias, dtype).view((inner,)) if self._kind == "LayerNorm" else None
        y, mu, rsigma = norm_forward(self._kind, x, w, b, self.eps, quantizer, self.zero_centered_gamma)
        if ctx.requires_grad:  # TE's saved tensors: (x, means, rstdevs) / (x, rstdevs)
            ctx.save_for_backward(*((x, mu, rsigma) if self._kind == "LayerNorm" else (x, rsigma)))
            ctx.dtype = dtype
        return y.view(idims)

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        x = ctx.saved_tensors[0]
        wdims = self.weight.size()
        inner = math.prod(wdims)
        dy = maybe_dequantize(grad_output.contiguous(), ctx.dtype).view(x.size())
        w = maybe_dequantize(self.weight, ctx.dtype).view((inner,))
        b = maybe_dequantize(self.bias, ctx.dtype).view((inner,)) if self._kind == "LayerNorm" else None
        dx, dw, db = norm_backward(self._kind, dy, x, w, b, self.eps, self.zero_centered_gamma)
        grads = (dw.view(wdims),) if db is None else (dw.view(wdims), db.view(wdims))
        return dx.view(grad_output.size()), grads
