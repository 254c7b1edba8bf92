"""What TE's two reference tensors (``CurrentScalingTensorRef``, ``NVFP4TensorRef``) share: plain
containers of ``data`` / ``scale`` (rowwise) and ``data_t`` / ``scale_t`` (the transposed copy), marked
``custom`` so that ``general_gemm`` hands them to their quantizer's ``qgemm``."""

from __future__ import annotations

from typing import Any

from ..tensor.storage import QuantizedTensorStorage

__all__ = ["ReferenceStorage"]


class ReferenceStorage(QuantizedTensorStorage):
    """Save/restore, usage updates and TE's ``_data`` / ``_scale_inv`` aliases; ``_kind`` names the
    element family in messages ("FP8", "FP4")."""

    _kind = "FP8"
    data: Any
    scale: Any
    data_t: Any
    scale_t: Any

    @property
    def custom(self) -> bool:
        """Always True: a custom quantized tensor."""
        return True

    def prepare_for_saving(self) -> tuple[list[Any], ReferenceStorage]:
        """Hand out ``[data, data_t, scale, scale_t]`` for autograd to save, keeping none of them."""
        tensors = [self.data, self.data_t, self.scale, self.scale_t]
        self.data = self.data_t = self.scale = self.scale_t = None
        return tensors, self

    def restore_from_saved(self, tensors: list[Any]) -> list[Any]:
        """Take back the four tensors of :meth:`prepare_for_saving`; returns the rest of ``tensors``."""
        self.data, self.data_t, self.scale, self.scale_t = tensors[:4]
        return tensors[4:]

    @property
    def _data(self) -> Any:
        return self.data

    @_data.setter
    def _data(self, value: Any) -> None:
        self.data = value

    @property
    def _scale_inv(self) -> Any:
        return self.scale

    @_scale_inv.setter
    def _scale_inv(self, value: Any) -> None:
        self.scale = value

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dtype={self.dtype}, device={self.device}, "  # type: ignore[attr-defined]
            f"quant_dtype={self.quant_dtype}, original_shape={self.original_shape})"  # type: ignore[attr-defined]
        )

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drop the copies no longer wanted; build the transposed copy from the rowwise one when asked
        (the rowwise copy cannot be rebuilt from the transposed one)."""
        has, has_t = self.data is not None, self.data_t is not None
        need = has if rowwise_usage is None else rowwise_usage
        need_t = has_t if columnwise_usage is None else columnwise_usage
        if need and not has:
            raise RuntimeError(f"Cannot generate {self._kind} data, even from {self._kind} data transpose")
        if need_t and not has_t:
            if not has:
                raise RuntimeError(f"{self._kind} data is required to generate {self._kind} data transpose")
            self._create_transpose()
        if not need:
            self.data = None
        if not need_t:
            self.data_t = None

    def _create_transpose(self) -> None:
        """The transposed copy as TE makes it: the stored data transposed, the same scale object."""
        self.data = self.data.contiguous()
        self.data_t = self.data.t().contiguous()
        self.scale_t = self.scale
