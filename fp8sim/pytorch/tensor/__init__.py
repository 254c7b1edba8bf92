"""TE's quantizer and quantized-tensor classes (``transformer_engine.pytorch.tensor``)."""

from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor, delayed_scaling_quantizers
from .quantized_tensor import QuantizedTensor, Quantizer

__all__ = [
    "Quantizer",
    "QuantizedTensor",
    "Float8Quantizer",
    "Float8CurrentScalingQuantizer",
    "Float8Tensor",
    "delayed_scaling_quantizers",
]
