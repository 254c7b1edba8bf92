"""TE's storage classes for quantized tensors (``transformer_engine.pytorch.tensor.storage``)."""

from .float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage
from .float8_tensor_storage import Float8TensorStorage
from .mxfp8_tensor_storage import MXFP8TensorStorage
from .nvfp4_tensor_storage import NVFP4TensorStorage
from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = [
    "QuantizedTensorStorage",
    "Float8TensorStorage",
    "MXFP8TensorStorage",
    "Float8BlockwiseQTensorStorage",
    "NVFP4TensorStorage",
]
