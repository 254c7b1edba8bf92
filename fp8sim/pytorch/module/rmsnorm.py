"""TE ``RMSNorm`` (``transformer_engine/pytorch/module/rmsnorm.py``): high precision, float32 statistics."""

from __future__ import annotations

from ._norm_module import NormBase

__all__ = ["RMSNorm"]


class RMSNorm(NormBase):
    """TE ``RMSNorm(normalized_shape, eps=1e-5, sequence_parallel=None, params_dtype=None,
    zero_centered_gamma=False, hidden_size=None, *, device, dtype)``:
    ``x * rsqrt(mean(x^2) + eps) * gamma`` computed in float32 (no bias)."""

    _normalization = "RMSNorm"
