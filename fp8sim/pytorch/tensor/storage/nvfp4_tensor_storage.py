"""TE's ``NVFP4TensorStorage`` (TE: ``pytorch/tensor/storage/nvfp4_tensor_storage.py``):
the base class of ``NVFP4Tensor`` (NVFP4 data)."""

from __future__ import annotations

from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["NVFP4TensorStorage"]


class NVFP4TensorStorage(QuantizedTensorStorage):
    """Base of ``NVFP4Tensor``, which holds the data in fp8sim (see ``quantized_tensor_storage``)."""
