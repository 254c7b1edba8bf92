"""LayerNorm and RMSNorm as TE's normalization kernels compute them: in float32.

TE's kernels compute the statistics, the output and dgamma/dbeta in float32 whatever the
parameter dtype; ``zero_centered_gamma`` applies ``gamma + 1`` with the 1 added in float32.  The
result is float32; callers round it to the activation dtype, or, under delayed scaling, quantize
it straight to FP8 (the fused LayerNorm+cast kernel never rounds to bf16/fp16 first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["NORMALIZATIONS", "normalize", "check_normalization"]

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(normalization: str) -> None:
    """TE's refusal of an unknown ``normalization`` (``layernorm_linear.py``), naming the choices."""
    if normalization not in NORMALIZATIONS:
        raise AssertionError(
            f"Unsupported normalization type! normalization={normalization!r}; known: LayerNorm, RMSNorm"
        )


def normalize(
    inp: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    normalization: str,
    zero_centered_gamma: bool,
) -> torch.Tensor:
    """float32 ``LayerNorm(inp) * gamma + beta`` or ``inp * rsqrt(mean(inp^2) + eps) * gamma``
    over the last ``weight.ndim`` dimensions (``gamma = weight + 1`` in float32 when zero-centred)."""
    # TE's kernels read a contiguous row-major input: a strided view must reduce in the same order
    x = inp.float().contiguous()
    g = weight.float()
    if zero_centered_gamma:
        g = g + 1
    shape = tuple(weight.shape)
    if normalization == "LayerNorm":
        return F.layer_norm(x, shape, g, None if bias is None else bias.float(), eps)
    dims = tuple(range(-len(shape), 0))
    return x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps) * g
