"""TransformerEngine's PyTorch API, emulated: ``autocast`` and FP8 modules that train on a CPU."""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("fp8sim.pytorch needs torch: pip install 'fp8sim[torch]'") from exc

from . import constants, utils
from ._explain import explain, record_gemm_plans
from .attention import DotProductAttention, MultiheadAttention, RotaryPositionEmbedding, apply_rotary_pos_emb
from .constants import DType
from .distributed import checkpoint
from .module import (
    Fp8Padding,
    Fp8Unpadding,
    GroupedLinear,  # noqa: E402 - issue 17
    LayerNorm,
    LayerNormLinear,
    LayerNormMLP,
    Linear,
    RMSNorm,
    TransformerEngineBaseModule,
)
from .quantization import (
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_recipe,
    get_recipe,
    is_calibrating,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_fp8_enabled,
    is_mxfp8_available,
    is_nvfp4_available,
    quantized_model_init,
)
from .tensor import (
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    Float8BlockwiseQTensorStorage,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    Float8TensorStorage,
    HybridQuantizedTensorStorage,
    HybridQuantizer,
    IdentityQuantizer,
    IdentityTensorStorage,
    MXFP8Quantizer,
    MXFP8Tensor,
    MXFP8TensorStorage,
    NVFP4Quantizer,
    NVFP4Tensor,
    NVFP4TensorStorage,
    QuantizedTensor,
    QuantizedTensorStorage,
    Quantizer,
    QuantizerRole,
)
from .transformer import TransformerLayer
from .utils import get_device_compute_capability, is_bf16_available

__all__ = [
    "explain",
    "record_gemm_plans",
    "autocast",
    "fp8_autocast",
    "is_fp8_enabled",
    "is_calibrating",
    "get_recipe",
    "Linear",
    "GroupedLinear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "RMSNorm",
    "TransformerEngineBaseModule",
    "FP8GlobalStateManager",
    "quantized_model_init",
    "fp8_model_init",
    "get_default_recipe",
    "is_fp8_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "is_fp8_block_scaling_available",
    "is_bf16_available",
    "get_device_compute_capability",
    "utils",
    "constants",
    "DType",
    "Quantizer",
    "QuantizedTensor",
    "Float8Quantizer",
    "Float8CurrentScalingQuantizer",
    "Float8Tensor",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "IdentityQuantizer",
    "HybridQuantizer",
    "HybridQuantizedTensorStorage",
    "QuantizerRole",
    "checkpoint",
    "DotProductAttention",
    "MultiheadAttention",
    "TransformerLayer",
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
    "QuantizedTensorStorage",
    "Float8TensorStorage",
    "MXFP8TensorStorage",
    "Float8BlockwiseQTensorStorage",
    "NVFP4TensorStorage",
    "IdentityTensorStorage",
    "Fp8Padding",
    "Fp8Unpadding",
]
