"""The normalization in front of ``LayerNormLinear``'s GEMM, inside the linear's autograd function (TE's
``_LayerNormLinear``, ``module/layernorm_linear.py``).

TE runs the norm and the GEMM in one autograd function and saves ``[inputmat, weightmat, weight, bias,
ln_weight, ln_out, mu, rsigma]`` (lines 526-537): ``inputmat`` the input in the activation dtype (2-D),
``ln_weight`` in the activation dtype, ``mu`` / ``rsigma`` the float32 statistics per row (RMSNorm: ``mu``
None).  Its backward hands the norm output's gradient to ``tex.layernorm_bwd`` / ``tex.rmsnorm_bwd``
(lines 1139-1163).  The arithmetic here is fp8sim's norm (:mod:`._normalization`): float32 statistics and
output, ``gamma + 1`` in float32 when zero-centred; the backward is what autograd computed through those
float32 ops, so a folded norm gives the same bits as the separate one did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NormPrologue", "norm_forward", "norm_backward", "layernorm_backward", "rmsnorm_backward", "gamma32"]


@dataclass
class NormPrologue:
    """The norm of a ``LayerNormLinear`` call: its parameters (autograd inputs of the linear function),
    ``eps``, ``normalization``, ``zero_centered_gamma``, and whether its float32 output goes straight
    into the FP8 quantization (``fused``: TE's quantized norm kernel)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float
    normalization: str
    zero_centered_gamma: bool
    fused: bool

    @property
    def params(self) -> tuple:
        return (self.weight, self.bias)


def gamma32(gamma: torch.Tensor, zero_centered_gamma: bool) -> torch.Tensor:
    """``gamma`` in float32, ``+ 1`` when zero-centred (fp8sim's norms apply it in float32)."""
    g32 = gamma.float()
    return g32 + 1 if zero_centered_gamma else g32


def norm_forward(
    norm: NormPrologue, inp: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor | None, act: torch.dtype
) -> tuple[torch.Tensor, tuple]:
    """``(gemm_input, saved)``: the norm output (float32 when ``fused``, else in ``act``; ``inp``'s shape)
    and ``(inputmat, ln_weight, ln_bias, mu, rsigma)`` as TE keeps them (activation dtype, float32 stats)."""
    k = inp.shape[-1]
    x = inp.to(act).reshape(-1, k)
    g, b = ln_weight.to(act), None if ln_bias is None else ln_bias.to(act)
    x32 = x.float().contiguous()  # TE's kernels read a contiguous row-major input
    g32 = gamma32(g, norm.zero_centered_gamma)
    if norm.normalization == "LayerNorm":
        b32 = None if b is None else b.float()
        ln32, mu, rsigma = torch.native_layer_norm(x32, [k], g32, b32, norm.eps)
        mu = mu.reshape(-1)
    else:
        rsigma = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
        ln32, mu = x32 * rsigma * g32, None
    ln32 = ln32.reshape(inp.shape)
    return (ln32 if norm.fused else ln32.to(act)), (x, g, b, mu, rsigma.reshape(-1))


def layernorm_backward(
    dz32: torch.Tensor,
    x32: torch.Tensor,
    mu: torch.Tensor,
    rsigma: torch.Tensor,
    g32: torch.Tensor,
    b32: torch.Tensor | None,
    needs: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[Any, Any, Any]:
    """``(dx, dgamma, dbeta)`` in float32 of LayerNorm over the last dimension of the 2-D float32 ``x`` from its
    float32 statistics (one per row): torch's own LayerNorm backward, as autograd runs it for the forward."""
    return torch.ops.aten.native_layer_norm_backward(
        dz32, x32, [x32.shape[-1]], mu.reshape(-1, 1), rsigma.reshape(-1, 1), g32, b32, list(needs)
    )


def rmsnorm_backward(
    dz32: torch.Tensor, x32: torch.Tensor, rsigma: torch.Tensor, g32: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dgamma)`` in float32 of ``y = x * rsigma * gamma``, ``rsigma = rsqrt(mean(x^2) + eps)`` (2-D
    ``x``, float32), op for op as torch's autograd differentiates that expression (``derivatives.yaml``:
    mul, rsqrt ``-0.5 * grad * result^3``, mean ``grad / n``, pow ``grad * (2 * x)``)."""
    r = rsigma.reshape(-1, 1)
    dg = (dz32 * (x32 * r)).sum(0)
    da = dz32 * g32
    dr = (da * x32).sum(-1, keepdim=True)
    dmean = (-0.5 * dr) * r.pow(3)
    dx = da * r + (dmean.expand_as(x32) / x32.shape[-1]) * (2 * x32)
    return dx, dg


def norm_backward(
    norm: NormPrologue, dz: torch.Tensor, saved: tuple, needs: tuple[bool, bool, bool]
) -> tuple[Any, Any, Any]:
    """``(dinput, dgamma, dbeta)`` from the norm output's gradient ``dz`` (``act`` dtype, rounded as the
    separate norm's output was) and the saved tensors; dgamma / dbeta in the activation dtype."""
    x, g, b, mu, rsigma = saved
    k = x.shape[-1]
    x32, g32 = x.float().contiguous(), gamma32(g, norm.zero_centered_gamma)
    dz32 = dz.float().reshape(-1, k)
    if norm.normalization == "LayerNorm":
        b32 = None if b is None else b.float()
        dx, dg, db = layernorm_backward(dz32, x32, mu, rsigma, g32, b32, (True, needs[1], needs[2]))
    else:
        (dx, dg), db = rmsnorm_backward(dz32, x32, rsigma, g32), None
    act = x.dtype
    return (
        dx.to(act),
        dg.to(act) if needs[1] and dg is not None else None,
        db.to(act) if needs[2] and db is not None else None,
    )
