"""TE's ``IdentityTensorStorage`` (TE: ``pytorch/tensor/storage/identity_tensor_storage.py``):
the base class of ``IdentityTensor`` (high-precision passthrough data)."""

from __future__ import annotations

from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["IdentityTensorStorage"]


class IdentityTensorStorage(QuantizedTensorStorage):
    """Base of ``IdentityTensor``, which holds the data in fp8sim (see ``quantized_tensor_storage``)."""
