"""Shared plumbing of TE's block-scaled tensors (MXFP8, FP8 block scaling, NVFP4): a rowwise and a
columnwise copy, each data + scale_inv tensors in TE's layouts, each quantized from the
high-precision input (never one from the other)."""

from __future__ import annotations

import math
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

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self._rowwise_data is not None, "columnwise": self._columnwise_data is not None}

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drop a copy (a missing copy cannot be made from the other: it was quantized separately)."""
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

    def _dequantize_rowwise(self) -> torch.Tensor:
        raise NotImplementedError

    def _dequantize_columnwise(self) -> torch.Tensor:
        raise NotImplementedError


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: QuantizedTensor, values: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        return values.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return grad, None
