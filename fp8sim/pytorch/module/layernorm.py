"""TE ``LayerNorm`` (``transformer_engine/pytorch/module/layernorm.py``): high precision, float32 statistics."""

from __future__ import annotations

from ._norm_module import NormBase

__all__ = ["LayerNorm"]


class LayerNorm(NormBase):
    """TE ``LayerNorm(normalized_shape, eps=1e-5, sequence_parallel=None, params_dtype=None,
    zero_centered_gamma=False, hidden_size=None, *, device, dtype)``:
    ``(x - mean) / sqrt(var + eps) * gamma + beta`` computed in float32."""

    _normalization = "LayerNorm"
