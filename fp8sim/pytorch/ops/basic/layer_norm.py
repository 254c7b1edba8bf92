"""``LayerNorm`` (TE 2.20.0.dev0 ``ops/basic/layer_norm.py``):
``(x - mean) / sqrt(var + eps) * gamma + beta`` over the inner dimensions, computed in float32 (``gamma + 1``
with ``zero_centered_gamma``, the 1 added in float32).  The output is written for the next op's input
quantizer as TE's fused kernel writes it: straight from float32 to FP8 for delayed scaling, from the
rounded values otherwise (:mod:`fp8sim.pytorch.ops._kernels`); dgamma / dbeta / dx in float32."""

from __future__ import annotations

from ._norm_op import _NormOp

__all__ = ["LayerNorm"]


class LayerNorm(_NormOp):
    """Layer normalization with ``weight`` (gamma) and ``bias`` (beta) over ``normalized_shape``."""

    _kind = "LayerNorm"
