"""TE's ``data`` property of the quantized tensor classes (``tensor/<class>.py`` ``_get_data`` /
``_set_data``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["data_property"]


def data_property(mode: str) -> property:
    """TE's ``data = property(_get_data, _set_data)`` of the quantized tensor classes: reading gives the
    tensor itself; assigning a tensor of the same class takes its buffers (TE re-wraps the tensor when
    size, stride, dtype or device differ), anything else is quantized with this tensor's quantizer:
    ``mode`` "requantize" (``Float8Tensor``, ``MXFP8Tensor``: ``self.data = quantizer.quantize(t)``),
    "update" (``NVFP4Tensor``: ``quantizer.update_quantized(t, self)``) or "strict"
    (``Float8BlockwiseQTensor``: size, stride and layout must match, else TE's ``ValueError``)."""

    def _get_data(self: Any) -> Any:
        return self

    @torch.no_grad()
    def _set_data(self: Any, tensor: torch.Tensor) -> None:
        cls = type(self)
        same = self.size() == tensor.size() and self.stride() == tensor.stride() and self.layout == tensor.layout
        if mode == "strict" and not same:
            raise ValueError(f"Invalid tensor for updating {cls.__name__} data")
        if isinstance(tensor, cls):
            if not same or self.dtype != tensor.dtype or self.device != tensor.device:
                dummy = torch.Tensor._make_wrapper_subclass(
                    cls,
                    tensor.size(),
                    strides=tensor.stride(),
                    storage_offset=tensor.storage_offset(),
                    dtype=tensor.dtype,
                    layout=tensor.layout,
                    requires_grad=tensor.requires_grad,
                    device=tensor.device,
                )
                torch.Tensor.data.__set__(self, dummy)
            self._init(**tensor.get_metadata())  # the buffers themselves, as TE assigns them
            return
        quantizer = tensor._quantizer if hasattr(tensor, "_quantizer") and mode == "strict" else self._quantizer
        assert quantizer is not None, "Can't quantize without a quantizer"  # noqa: S101 - TE's assert
        if mode == "requantize":
            quantizer.internal = False
            self.data = quantizer.quantize(tensor)
        else:
            quantizer.update_quantized(tensor, self)
        if mode != "strict" and self.requires_grad != tensor.requires_grad:
            self.requires_grad_(requires_grad=tensor.requires_grad)

    return property(_get_data, _set_data)
