"""Double backward (``create_graph=True``) through torchao's low-precision GEMMs, as torchao 0.18 does it.

fp8sim computes a backward GEMM outside autograd, so on its own every gradient it returns would be a
constant.  torchao differs per path (measured with torchao 0.18 on a CPU):

- ``torchao.float8`` (``Float8Linear``): its backward runs ``torch.mm`` on ``Float8TrainingTensor``
  operands, which autograd records: the gradient has a graph (``requires_grad=True``), and the second
  backward reaches that ``mm``'s backward, where ``float8_ops.float8_mm`` asserts that both operands
  are ``Float8TrainingTensor`` (AssertionError).  A high-precision GEMM (``ScalingType.DISABLED``,
  e.g. ``rowwise_with_gw_hp``'s grad_weight) is a plain ``torch.mm`` and differentiates twice.
  :func:`float8_grad` reproduces both: a graph node over the GEMM's operands that raises torchao's
  error when the second backward reaches it.
- MXFP8 (``mx_mm``, measured) and NVFP4 (``nvfp4_mm_triton``, from its source: Triton casts, then
  ``F.scaled_mm`` on FP4 codes): autograd records nothing through the low-precision GEMMs, so those
  gradients are silently constants.  fp8sim reproduces that and warns (:func:`warn_graphless`, quirk
  ``'torchao-double-backward-graphless'``); their high-precision parts (``wgrad_with_hp``, the bias
  gradient) differentiate twice, as in torchao.
- The MoE grouped GEMMs: torchao's emulated MXFP8 grouped GEMM is made of torch ops and differentiates
  twice (measured); fp8sim's are not, so it refuses ``create_graph=True`` there at the first backward
  (:func:`refuse_double_backward`) rather than return a constant.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .._util.upstream_quirk import UpstreamQuirkWarning

__all__ = ["TORCHAO_FLOAT8_MM_ERROR", "GRAPHLESS_QUIRK", "float8_grad", "warn_graphless", "refuse_double_backward"]

TORCHAO_FLOAT8_MM_ERROR = (
    "Expecting  both Float8TrainingTensor for mm inputs but found "
    "<class 'torchao.float8.float8_training_tensor.Float8TrainingTensor'> and <class 'torch.Tensor'>"
)
GRAPHLESS_QUIRK = (
    "create_graph=True through torchao's {what}: torchao 0.18 builds no graph through these GEMMs (its casts "
    "and GEMMs are kernels autograd does not record), so the gradient is a constant (requires_grad=False) "
    "and a gradient penalty through this layer is silently dropped; fp8sim reproduces that "
    "(quirk 'torchao-double-backward-graphless')"
)


class _Float8MMNode(torch.autograd.Function):
    """Identity on a backward GEMM's result, linked to the GEMM's high-precision operands; its own
    backward is torchao's ``float8_mm`` assertion."""

    @staticmethod
    def forward(ctx: Any, result: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return result.clone()

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise AssertionError(TORCHAO_FLOAT8_MM_ERROR)


def float8_grad(result: torch.Tensor | None, *operands: torch.Tensor) -> torch.Tensor | None:
    """``result`` of a float8 backward GEMM of ``operands``; under ``create_graph=True`` (grad mode on in
    the backward) it carries torchao's graph node, so it requires grad when an operand does."""
    if result is None or not torch.is_grad_enabled() or not any(o.requires_grad for o in operands):
        return result
    return _Float8MMNode.apply(result, *operands)


def warn_graphless(what: str) -> None:
    """Warn, under ``create_graph=True``, that torchao's ``what`` gradient is a constant."""
    if torch.is_grad_enabled():
        warnings.warn(GRAPHLESS_QUIRK.format(what=what), UpstreamQuirkWarning, stacklevel=3)


def refuse_double_backward(what: str) -> None:
    """Under ``create_graph=True``, a clear error where fp8sim cannot build the graph torchao builds."""
    if torch.is_grad_enabled():
        raise NotImplementedError(
            f"fp8sim.torchao: create_graph=True (double backward) through {what} is not emulated: torchao 0.18 "
            "builds a graph through them and fp8sim's emulated GEMMs cannot, so it refuses rather than return a "
            "gradient without one"
        )
