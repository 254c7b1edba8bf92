"""TransformerEngine's PyTorch API, emulated: ``autocast`` and FP8 modules that train on a CPU."""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("fp8sim.pytorch needs torch: pip install 'fp8sim[torch]'") from exc

from .module import LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm, TransformerEngineBaseModule
from .quantization import autocast, fp8_autocast, get_recipe, is_calibrating, is_fp8_enabled

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
    "RMSNorm",
    "TransformerEngineBaseModule",
]
