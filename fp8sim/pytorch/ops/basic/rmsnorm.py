"""``RMSNorm`` (TE 2.20.0.dev0 ``ops/basic/rmsnorm.py``): ``x * rsqrt(mean(x^2) + eps) * gamma`` over the
inner dimensions, computed in float32, written for the next op's input quantizer as TE's fused kernel
writes it (:mod:`fp8sim.pytorch.ops._kernels`)."""

from __future__ import annotations

from ._norm_op import _NormOp

__all__ = ["RMSNorm"]


class RMSNorm(_NormOp):
    """Root-mean-square normalization with ``weight`` (gamma) over ``normalized_shape``."""

    _kind = "RMSNorm"
