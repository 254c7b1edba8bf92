"""TE's ``MXFP8TensorStorage`` (TE: ``pytorch/tensor/storage/mxfp8_tensor_storage.py``): the base class of
``MXFP8Tensor`` (MXFP8 data), and a light holder of the buffers when built directly, as TE's internal code
builds it: ``MXFP8TensorStorage(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv,
fp8_dtype, quantizer, with_gemm_swizzled_scales, fake_dtype=None)`` (TE lines 88-114 at d0067d0)."""

from __future__ import annotations

from typing import Any

from .quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["MXFP8TensorStorage"]


class MXFP8TensorStorage(QuantizedTensorStorage):
    """Base of ``MXFP8Tensor``, which holds the data in fp8sim (see ``quantized_tensor_storage``)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not MXFP8TensorStorage:
            return super().__new__(cls, *args, **kwargs)
        return _direct(*args, **kwargs)

    def size(self, dim: int | None = None) -> Any:
        """The logical shape: that of the FP8 data (either copy holds it)."""
        import torch

        data = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        shape = torch.Size(data.shape)
        return shape if dim is None else shape[dim]

    def fsdp_buffer_fields(self) -> tuple[str, ...]:
        """TE: the data and scale-inv fields of each direction present."""
        from .._fsdp_buffers import mxfp8_fields

        return mxfp8_fields(self)

    def fsdp_extract_buffers(self) -> tuple[tuple, dict[str, Any]]:
        """TE: the buffers to all-gather along dim 0, the scales' alignment padding stripped."""
        from .._fsdp_buffers import mxfp8_extract

        return mxfp8_extract(self)

    def fsdp_assign_gathered(self, gathered: tuple, meta: dict[str, Any]) -> None:
        """TE: write gathered buffers back, the scales padded again (rowwise to 128 rows, columnwise to 4)."""
        from .._fsdp_buffers import mxfp8_assign

        mxfp8_assign(self, gathered, meta)


def _direct(
    rowwise_data: Any,
    rowwise_scale_inv: Any,
    columnwise_data: Any,
    columnwise_scale_inv: Any,
    fp8_dtype: Any,
    quantizer: Any,
    with_gemm_swizzled_scales: bool,
    *,
    fake_dtype: Any = None,
) -> MXFP8TensorStorage:
    import torch

    from ...constants import DType

    inst = object.__new__(MXFP8TensorStorage)
    inst._dtype = fake_dtype if fake_dtype is not None else torch.float32
    inst._rowwise_data, inst._rowwise_scale_inv = rowwise_data, rowwise_scale_inv
    inst._columnwise_data, inst._columnwise_scale_inv = columnwise_data, columnwise_scale_inv
    inst._quantizer = quantizer.copy() if quantizer is not None else None
    inst._fp8_dtype = DType.cast(fp8_dtype)
    inst._with_gemm_swizzled_scales = with_gemm_swizzled_scales
    return inst
