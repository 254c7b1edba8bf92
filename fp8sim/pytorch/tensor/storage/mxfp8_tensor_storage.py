"""TE's ``MXFP8TensorStorage`` (TE: ``pytorch/tensor/storage/mxfp8_tensor_storage.py``):
the base class of ``MXFP8Tensor`` (MXFP8 data)."""

from __future__ import annotations

from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["MXFP8TensorStorage"]


class MXFP8TensorStorage(QuantizedTensorStorage):
    """Base of ``MXFP8Tensor``, which holds the data in fp8sim (see ``quantized_tensor_storage``)."""
