"""TE's ``Float8TensorStorage`` (TE: ``pytorch/tensor/storage/float8_tensor_storage.py``):
the base class of ``Float8Tensor`` (per-tensor FP8 data)."""

from __future__ import annotations

from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["Float8TensorStorage"]


class Float8TensorStorage(QuantizedTensorStorage):
    """Base of ``Float8Tensor``, which holds the data in fp8sim (see ``quantized_tensor_storage``)."""
