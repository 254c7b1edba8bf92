"""TE's ``Float8BlockwiseQTensorStorage`` (TE: ``pytorch/tensor/storage/float8_blockwise_tensor_storage.py``):
the base class of ``Float8BlockwiseQTensor`` (FP8 block-scaled data)."""

from __future__ import annotations

from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["Float8BlockwiseQTensorStorage"]


class Float8BlockwiseQTensorStorage(QuantizedTensorStorage):
    """Base of ``Float8BlockwiseQTensor``, which holds the data in fp8sim (see ``quantized_tensor_storage``)."""
