"""TE's ``Float8BlockwiseQTensorStorage`` (TE: ``pytorch/tensor/storage/float8_blockwise_tensor_storage.py``):
the base class of ``Float8BlockwiseQTensor`` (FP8 block-scaled data)."""

from __future__ import annotations

from typing import Any

from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["Float8BlockwiseQTensorStorage"]


class Float8BlockwiseQTensorStorage(QuantizedTensorStorage):
    """Base of ``Float8BlockwiseQTensor``, which holds the data in fp8sim (see ``quantized_tensor_storage``)."""

    def fsdp_buffer_fields(self) -> tuple[str, ...]:
        """TE: the data and scale-inv fields of each direction present (2D block scaling only)."""
        from .._fsdp_buffers import blockwise_fields

        return blockwise_fields(self)

    def fsdp_extract_buffers(self) -> tuple[tuple, dict[str, Any]]:
        """TE: M-major buffers for FSDP2's dim-0 all-gather, the scales' alignment padding stripped."""
        from .._fsdp_buffers import blockwise_extract

        return blockwise_extract(self)

    def fsdp_assign_gathered(self, gathered: tuple, meta: dict[str, Any]) -> None:
        """TE: write gathered buffers back (geometry checked, columnwise transposed back, scales re-padded)."""
        from .._fsdp_buffers import blockwise_assign

        blockwise_assign(self, gathered, meta)
