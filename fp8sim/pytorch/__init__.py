"""TransformerEngine's PyTorch API, emulated: ``autocast`` and FP8 modules that train on a CPU."""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("fp8sim.pytorch needs torch: pip install 'fp8sim[torch]'") from exc

from .attention import DotProductAttention, MultiheadAttention, RotaryPositionEmbedding, apply_rotary_pos_emb
from .module import LayerNorm, LayerNormLinear, LayerNormMLP, Linear
from .quantization import autocast, fp8_autocast, get_recipe, is_calibrating, is_fp8_enabled
from .transformer import TransformerLayer

__all__ = [
    "autocast",
    "fp8_autocast",
    "is_fp8_enabled",
    "is_calibrating",
    "get_recipe",
    "Linear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "DotProductAttention",
    "MultiheadAttention",
    "TransformerLayer",
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
]
