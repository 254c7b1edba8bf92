"""TE's quantizer and quantized-tensor classes (``transformer_engine.pytorch.tensor``)."""

from .custom_recipe import (
    CustomQuantizers,
    DelayedScalingRequest,
    QuantizerRequest,
    QuantizerRole,
    custom_recipe_quantizers,
)
from .float8_blockwise_tensor import Float8BlockQuantizer, Float8BlockwiseQTensor
from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor, delayed_scaling_quantizers
from .hybrid_tensor import HybridQuantizedTensorStorage, HybridQuantizer
from .identity_tensor import IdentityQuantizer, IdentityTensor
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
from .nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor
from .quantized_tensor import QuantizedTensor, Quantizer, prepare_for_saving, restore_from_saved
from .storage import (
    Float8BlockwiseQTensorStorage,
    Float8TensorStorage,
    MXFP8TensorStorage,
    NVFP4TensorStorage,
    QuantizedTensorStorage,
)
from .storage.identity_tensor_storage import IdentityTensorStorage
from .utils import cast_master_weights_to_fp8, replace_raw_data

__all__ = [
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
    "delayed_scaling_quantizers",
    "QuantizerRole",
    "QuantizerRequest",
    "DelayedScalingRequest",
    "CustomQuantizers",
    "custom_recipe_quantizers",
    "IdentityQuantizer",
    "IdentityTensor",
    "HybridQuantizer",
    "HybridQuantizedTensorStorage",
    "prepare_for_saving",
    "restore_from_saved",
    "QuantizedTensorStorage",
    "Float8TensorStorage",
    "MXFP8TensorStorage",
    "Float8BlockwiseQTensorStorage",
    "NVFP4TensorStorage",
    "IdentityTensorStorage",
    "replace_raw_data",
    "cast_master_weights_to_fp8",
]
