"""Activation ops (TE 2.20.0.dev0 ``ops/basic/activation.py``): GELU (tanh form), GEGLU, GLU, QGELU,
QGEGLU, ReLU, ReGLU, SReLU, SReGLU, SiLU, and ``ScaledSReLU`` (per-row post-scale, an extra input).

Gated units split the last dimension in two halves and gate the first (the opposite of
``torch.nn.functional.glu``).  The kernels compute in float32 and write their output for the next op's
input quantizer (and the gradient for the previous op's grad-output quantizer) as TE's extensions do
(:mod:`fp8sim.pytorch.ops._kernels`).  ``cache_quantized_input``: the input kept for the backward is
an E4M3 current-scaling cast of it (rowwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...constants import DType
from ...tensor import Float8CurrentScalingQuantizer
from .._common import SUPPORTED_DTYPES, compute_dtype, maybe_dequantize
from .._kernels import act_backward, act_forward, activation_fn
from ..op import BasicOperation, OperationContext
from .add_extra_input import _overrides

__all__ = ["GELU", "GEGLU", "GLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "ScaledSReLU", "SReGLU", "SiLU"]


def _cache_quantized(x: torch.Tensor) -> Any:
    """TE: the saved input as an E4M3 current-scaling tensor (rowwise only)."""
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, x.device)
    q.set_usage(rowwise=True, columnwise=False)
    return q(x)


class _ActivationOperation(BasicOperation):
    """An elementwise or gated activation computed by TE's kernels."""

    _name = ""

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__()
        self.cache_quantized_input = cache_quantized_input

    def _fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return activation_fn(self._name)

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> Any:
        dtype = compute_dtype(input_, input_.dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise RuntimeError(f"Unsupported dtype ({dtype})")
        x = maybe_dequantize(input_.contiguous(), dtype)
        y = act_forward(self._fn(), x, next_op_input_quantizer)
        if self.cache_quantized_input:
            x = _cache_quantized(x)
        if ctx.requires_grad:
            ctx.save_for_backward(x)
            ctx.dtype, ctx.prev_op_grad_output_quantizer = dtype, prev_op_grad_output_quantizer
        return y

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[Any, tuple]:
        (x,) = ctx.saved_tensors
        x = maybe_dequantize(x.contiguous(), ctx.dtype)
        dy = maybe_dequantize(grad_output.contiguous(), x.dtype)
        return act_backward(self._fn(), dy, x, ctx.prev_op_grad_output_quantizer), ()


class GELU(_ActivationOperation):
    r"""GELU, tanh approximation: :math:`\frac{x}{2}(1 + \tanh(0.797x + 0.036x^3))`."""

    _name = "gelu"


class GLU(_ActivationOperation):
    r"""GLU: :math:`\sigma(a) b` (first half gated)."""

    _name = "glu"


class GEGLU(_ActivationOperation):
    r"""GEGLU: :math:`\mathrm{GELU}(a) b`."""

    _name = "geglu"


class QGELU(_ActivationOperation):
    r"""Quick GELU: :math:`x \sigma(1.702 x)`."""

    _name = "qgelu"


class QGEGLU(_ActivationOperation):
    r"""Quick GEGLU: :math:`\mathrm{QGELU}(a) b`."""

    _name = "qgeglu"


class ReLU(_ActivationOperation):
    r"""ReLU: :math:`\max(x, 0)`."""

    _name = "relu"


class ReGLU(_ActivationOperation):
    r"""ReGLU: :math:`\max(a, 0) b`."""

    _name = "reglu"


class SReLU(_ActivationOperation):
    r"""Squared ReLU: :math:`\max(x, 0)^2`."""

    _name = "srelu"


class SReGLU(_ActivationOperation):
    r"""Squared ReGLU: :math:`\max(a, 0)^2 b`."""

    _name = "sreglu"


class SiLU(_ActivationOperation):
    r"""SiLU: :math:`x \sigma(x)`."""

    _name = "silu"


class _ScaledUnary(BasicOperation):
    """A unary activation times a per-row scale (the extra input, shape ``x.shape[:-1]``), in float32."""

    num_extra_inputs = 1
    _name = ""

    def __init__(self, *, activation_recompute_in_mlp: bool = False) -> None:
        super().__init__()
        self.activation_recompute_in_mlp = activation_recompute_in_mlp

    def op_forward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "forward"))

    def op_backward(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_overrides(self, "backward"))

    def _check_recompute(self) -> None:
        if self.activation_recompute_in_mlp:
            raise RuntimeError(
                f"{self.__class__.__name__}(activation_recompute_in_mlp=True) requires the fused grouped MLP path."
            )

    def _scaled(self, x32: torch.Tensor, s32: torch.Tensor) -> torch.Tensor:
        return activation_fn(self._name)(x32) * s32.unsqueeze(-1)

    def fuser_forward(
        self, basic_op_ctxs: list, input_: torch.Tensor, *, basic_op_extra_inputs: list, **unused: Any
    ) -> tuple[torch.Tensor, list]:
        self._check_recompute()
        scales_in = basic_op_extra_inputs[0][0]
        ref = input_ if isinstance(input_, torch.Tensor) else scales_in
        dtype = compute_dtype(ref, ref.dtype)
        x = maybe_dequantize(input_.contiguous(), dtype)
        scales = maybe_dequantize(scales_in, dtype)
        with torch.no_grad():
            y = self._scaled(x.float(), scales.float()).to(dtype)
        ctx = basic_op_ctxs[0]
        if ctx.requires_grad:
            ctx.input_requires_grad, ctx.extra_input_requires_grad = True, scales_in.requires_grad
            ctx.dtype = dtype
            ctx.save_for_backward(x, scales)
        return y, [()]

    def fuser_backward(
        self, basic_op_ctxs: list, grad_output: torch.Tensor, *, basic_op_grad_extra_outputs: list
    ) -> tuple[Any, list, list]:
        self._check_recompute()
        ctx = basic_op_ctxs[0]
        x, scales = ctx.saved_tensors
        x = maybe_dequantize(x.contiguous(), ctx.dtype)
        scales = maybe_dequantize(scales, ctx.dtype)
        dy = maybe_dequantize(grad_output.contiguous(), ctx.dtype)
        with torch.enable_grad():
            x32 = x.float().requires_grad_(True)
            s32 = scales.float().requires_grad_(ctx.extra_input_requires_grad)
            inputs = (x32, s32) if ctx.extra_input_requires_grad else (x32,)
            grads = torch.autograd.grad(self._scaled(x32, s32), inputs, dy.float())
        dx = grads[0].to(ctx.dtype) if ctx.input_requires_grad else None
        ds = grads[1].to(ctx.dtype) if ctx.extra_input_requires_grad else None
        return dx, [()], [(ds,)]


class ScaledSReLU(_ScaledUnary):
    """Squared ReLU times a per-row scale (``activation_recompute_in_mlp`` is for TE's fused grouped MLP)."""

    _name = "srelu"
