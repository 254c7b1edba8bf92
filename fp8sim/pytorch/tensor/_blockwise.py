"""Shared plumbing of TE's block-scaled tensors (MXFP8, FP8 block scaling, NVFP4): a rowwise and a
columnwise copy, each data + scale_inv tensors in TE's layouts, each quantized from the
high-precision input (never one from the other)."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from ..constants import DType
from .quantized_tensor import QuantizedTensor, Quantizer

__all__ = ["BlockScaledTensor", "round_up", "flatten_2d", "padded", "check_usage"]


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def flatten_2d(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """TE's 2-D view of a tensor: ``(prod(shape[:-1]), shape[-1])``."""
    return math.prod(shape[:-1]), (shape[-1] if len(shape) else 1)


def padded(values: np.ndarray, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """``values`` in the top-left corner of a zero tensor of TE's padded scale shape (TE leaves the
    padding unspecified; fp8sim writes zeros)."""
    out = torch.zeros(shape, dtype=dtype)
    v = torch.from_numpy(np.ascontiguousarray(values))
    out[: v.shape[0], : v.shape[1]] = v
    return out


def check_usage(q: Quantizer) -> None:
    if not (q.rowwise_usage or q.columnwise_usage):
        raise ValueError(f"{type(q).__name__} needs rowwise or columnwise usage (set_usage)")


class BlockScaledTensor(QuantizedTensor):
    """``_rowwise_data``, ``_rowwise_scale_inv``, ``_columnwise_data``, ``_columnwise_scale_inv``
    (None where that usage is off), ``_fp8_dtype`` and ``_quantizer``; subclasses add their own
    fields through ``_extra_fields`` and implement ``_dequantize_rowwise`` / ``_dequantize_columnwise``
    (float32 in the logical shape)."""

    _extra_fields: tuple[str, ...] = ()
    _dtype_field = "fp8_dtype"
    _saved_fields = ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv")

    def _init(
        self,
        *,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        quantizer: Quantizer | None = None,
        **kwargs: Any,
    ) -> None:
        self._rowwise_data = rowwise_data
        self._rowwise_scale_inv = rowwise_scale_inv
        self._columnwise_data = columnwise_data
        self._columnwise_scale_inv = columnwise_scale_inv
        self._quantizer = quantizer.copy() if quantizer is not None else None
        dt = kwargs.pop(self._dtype_field, None)
        setattr(self, "_" + self._dtype_field, DType.cast(dt) if dt is not None else None)
        for name in self._extra_fields:
            setattr(self, "_" + name, kwargs.pop(name, None))
        if kwargs:
            raise TypeError(f"{type(self).__name__} got unexpected arguments {', '.join(kwargs)}")

    def get_metadata(self) -> dict[str, Any]:
        meta = {
            "rowwise_data": self._rowwise_data,
            "rowwise_scale_inv": self._rowwise_scale_inv,
            "columnwise_data": self._columnwise_data,
            "columnwise_scale_inv": self._columnwise_scale_inv,
            "quantizer": self._quantizer,
            self._dtype_field: getattr(self, "_" + self._dtype_field),
        }
        meta.update({name: getattr(self, "_" + name) for name in self._extra_fields})
        return meta

    def untyped_storage(self) -> torch.UntypedStorage:
        """TE's (``quantized_tensor.py``): an empty storage; the bytes live in the data buffers.  FSDP2's
        ``reset_sharded_param`` compares storage pointers, which a wrapper subclass's own storage lacks."""
        return torch.UntypedStorage(0, device=self.device)

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self._rowwise_data is not None, "columnwise": self._columnwise_data is not None}

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drop a copy (False) or require it (True; None keeps what there is).  Asking for both copies where
        only the rowwise one exists makes the columnwise one from it where TE can (2D tiles:
        :meth:`_create_columnwise`), else raises TE's error."""
        want_row = self._rowwise_data is not None if rowwise_usage is None else rowwise_usage
        want_col = self._columnwise_data is not None if columnwise_usage is None else columnwise_usage
        if want_row and want_col and self._columnwise_data is None and self._rowwise_data is not None:
            self._create_columnwise()
        for flag, prefix in ((rowwise_usage, "_rowwise"), (columnwise_usage, "_columnwise")):
            if flag and getattr(self, prefix + "_data") is None:
                raise RuntimeError(f"{type(self).__name__} has no {prefix[1:]} data; quantize again with that usage")
            if flag is False:
                setattr(self, prefix + "_data", None)
                setattr(self, prefix + "_scale_inv", None)

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = self.dtype if dtype is None else dtype
        if self._rowwise_data is not None:
            out = self._dequantize_rowwise()
        elif self._columnwise_data is not None:
            out = self._dequantize_columnwise()
        else:
            raise RuntimeError(f"{type(self).__name__} has neither rowwise nor columnwise data")
        out = out.to(dtype)
        if torch.is_grad_enabled() and self.requires_grad:
            return _StraightThrough.apply(self, out)
        return out

    def view(self, *shape: Any) -> torch.Tensor:  # type: ignore[override]
        return _BlockView.apply(self, _shape_arg(shape), True)

    def reshape(self, *shape: Any) -> torch.Tensor:  # type: ignore[override]
        return _BlockView.apply(self, _shape_arg(shape), False)

    def _view_refusal(self, shape: tuple[int, ...], view: bool) -> tuple[type | None, str] | None:
        """None if ``shape`` keeps the data's block layout, else (exception or None to warn, message)."""
        return None if shape == tuple(self.shape) else (None, f"{type(self).__name__} cannot change its shape")

    def _viewed(self, shape: tuple[int, ...], view: bool) -> BlockScaledTensor:
        """A tensor of ``shape`` over views of this one's data, sharing its scales."""
        meta = self.get_metadata()
        for key in ("rowwise_data", "columnwise_data"):
            if meta[key] is not None:
                new = self._data_shape(shape, key == "columnwise_data")
                meta[key] = meta[key].view(*new) if view else meta[key].reshape(*new)
        return type(self)(shape=shape, dtype=self.dtype, device=self.device, **meta)

    def _data_shape(self, shape: tuple[int, ...], columnwise: bool) -> tuple[int, ...]:
        return shape

    def _create_columnwise(self) -> None:
        raise RuntimeError(f"{type(self).__name__} cannot make its columnwise data from the rowwise data")

    def _dequantize_rowwise(self) -> torch.Tensor:
        raise NotImplementedError

    def _dequantize_columnwise(self) -> torch.Tensor:
        raise NotImplementedError


_FSDP_NOTE = (
    "If you are using this for FSDP2 without compiled_autograd_enabled, "
    "then ignore this warning since this view is not going to be used anywhere."
)


class _BlockView(torch.autograd.Function):
    """TE's ``_ViewFunc`` / ``_ReshapeFunc`` of the block-scaled tensors: the data are viewed (the
    scales, laid out by the flattened rows, are shared) when the subclass's ``_view_refusal`` allows
    the new shape; otherwise TE warns (or raises) and returns the dequantized values reshaped."""

    @staticmethod
    def forward(ctx: Any, tensor: BlockScaledTensor, shape: tuple[int, ...], view: bool) -> torch.Tensor:
        ctx.shape = tensor.shape
        shape = tuple(torch.empty(tensor.shape, device="meta").reshape(*shape).shape)
        refusal = tensor._view_refusal(shape, view)
        if refusal is not None:
            exc, message = refusal
            if exc is not None:
                raise exc(message)
            warnings.warn(message, stacklevel=4)
            values = tensor.dequantize()
            return values.view(*shape) if view else values.reshape(*shape)
        return tensor._viewed(shape, view)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad.reshape(ctx.shape), None, None


def _shape_arg(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and not isinstance(shape[0], int):
        return tuple(shape[0])
    return tuple(shape)


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: QuantizedTensor, values: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return values.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None
