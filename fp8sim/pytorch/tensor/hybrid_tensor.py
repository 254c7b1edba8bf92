"""TE's ``HybridQuantizer`` (``tensor/hybrid_tensor.py``, ``tensor/storage/hybrid_tensor_storage.py`` at d0067d0):
one quantizer for the rowwise copy of a tensor, another for its columnwise copy.

The rowwise copy is what a GEMM reducing over the tensor's last axis reads (fprop's input and weight, dgrad's
gradient), the columnwise copy what a GEMM reducing over its first axis reads (dgrad's weight, wgrad's input
and gradient): TE's ``general_gemm`` takes the sub-storage of the direction it needs and runs that format's
GEMM.  ``columnwise_source="rowwise_dequantized"`` quantizes the columnwise copy from the rowwise copy's
dequantized value (in the input's dtype) instead of the input.  Each sub-quantizer is pinned to its direction.

fp8sim emulates the quantizer in the GEMM modules under a ``CustomRecipe`` (``module/_custom.py``) and returns
:class:`HybridQuantizedTensorStorage` (TE's ``internal=True`` form) from ``quantize``: TE's
``HybridQuantizedTensor`` (the ``torch.Tensor`` subclass, FSDP2 and ``te.ops`` hooks) is not emulated.
"""

from __future__ import annotations

from typing import Any

import torch

from .quantized_tensor import Quantizer
from .storage.quantized_tensor_storage import QuantizedTensorStorage

__all__ = ["HybridQuantizer", "HybridQuantizedTensorStorage", "gemm_operand"]

_COLUMNWISE_SOURCES = ("original", "rowwise_dequantized")


class HybridQuantizer(Quantizer):
    """``HybridQuantizer(rowwise_quantizer=..., columnwise_quantizer=..., columnwise_source="original")``."""

    def __init__(
        self, *, rowwise_quantizer: Any, columnwise_quantizer: Any, columnwise_source: str = "original"
    ) -> None:
        super().__init__(rowwise=True, columnwise=True)
        from .custom_recipe import QuantizerRequest

        for direction, quantizer in (("rowwise", rowwise_quantizer), ("columnwise", columnwise_quantizer)):
            if isinstance(quantizer, QuantizerRequest):  # TE's message (TE #3158: future work)
                raise TypeError(
                    "HybridQuantizer does not support nested QuantizerRequest objects yet; got "
                    f"{type(quantizer).__name__} for the {direction} direction. Delayed scaling in CustomRecipe is "
                    "currently supported only when the qfactory returns DelayedScalingRequest as a top-level slot. "
                    "Resolving delayed-scaling requests inside HybridQuantizer is future work; pass a concrete "
                    "Quantizer instance instead."
                )
            if not isinstance(quantizer, Quantizer):
                raise TypeError(
                    "HybridQuantizer requires concrete Quantizer instances for both directions, but the "
                    f"{direction} argument is {type(quantizer).__name__}."
                )
        if rowwise_quantizer is columnwise_quantizer:
            raise ValueError(
                "HybridQuantizer requires distinct rowwise and columnwise quantizer instances. If both directions "
                "need shared state, construct two quantizer objects that reference the same shared state."
            )
        if columnwise_source not in _COLUMNWISE_SOURCES:
            raise ValueError(
                f"HybridQuantizer columnwise_source must be one of {_COLUMNWISE_SOURCES}, got {columnwise_source!r}."
            )
        self.rowwise_quantizer, self.columnwise_quantizer = rowwise_quantizer, columnwise_quantizer
        self.columnwise_source = columnwise_source
        rowwise_quantizer.set_usage(rowwise=True, columnwise=False)
        columnwise_quantizer.set_usage(rowwise=False, columnwise=True)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rowwise_usage={self.rowwise_usage}, columnwise_usage={self.columnwise_usage}, "
            f"columnwise_source={self.columnwise_source!r}, internal={self.internal}, )"
        )

    def copy(self) -> HybridQuantizer:
        out = HybridQuantizer(
            rowwise_quantizer=self.rowwise_quantizer.copy(),
            columnwise_quantizer=self.columnwise_quantizer.copy(),
            columnwise_source=self.columnwise_source,
        )
        out.set_usage(rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        out.internal, out.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return out

    @property
    def with_amax_reduction(self) -> bool:
        """Whether either sub-quantizer reduces its amax across ranks (set on both)."""
        return any(
            getattr(q, "with_amax_reduction", False) for q in (self.rowwise_quantizer, self.columnwise_quantizer)
        )

    @with_amax_reduction.setter
    def with_amax_reduction(self, value: bool) -> None:
        for q in (self.rowwise_quantizer, self.columnwise_quantizer):
            if hasattr(q, "with_amax_reduction"):
                q.with_amax_reduction = value

    def columnwise_source_tensor(self, tensor: torch.Tensor, rowwise: Any = None) -> torch.Tensor:
        """What the columnwise quantizer quantizes: ``tensor``, or its rowwise copy (``rowwise``, else made
        now) dequantized to ``tensor``'s dtype."""
        if self.columnwise_source == "original":
            return tensor
        if rowwise is None:
            rowwise = self.rowwise_quantizer.quantize(tensor.detach())
        return rowwise.dequantize(dtype=tensor.dtype)

    def quantize_impl(self, tensor: torch.Tensor) -> HybridQuantizedTensorStorage:
        row = self.rowwise_quantizer.quantize(tensor) if self.rowwise_usage else None
        col = None
        if self.columnwise_usage:
            col = self.columnwise_quantizer.quantize(self.columnwise_source_tensor(tensor, row))
        return HybridQuantizedTensorStorage(
            rowwise_storage=row, columnwise_storage=col, quantizer=self, fake_dtype=tensor.dtype
        )

    def quantize(self, tensor: torch.Tensor, *, out: Any = None, dtype: torch.dtype | None = None) -> Any:
        """The storage of both copies (no autograd: TE's ``internal=True`` form)."""
        del dtype
        if out is not None:
            raise NotImplementedError("HybridQuantizer.quantize(out=...) is not emulated by fp8sim")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"HybridQuantizer quantizes a torch.Tensor, got {type(tensor).__name__}")
        return self.quantize_impl(tensor.detach())


class HybridQuantizedTensorStorage(QuantizedTensorStorage):
    """The rowwise and columnwise sub-storages of one tensor (either may be None)."""

    def __init__(
        self, *, rowwise_storage: Any, columnwise_storage: Any, quantizer: Any, fake_dtype: Any = None
    ) -> None:
        if not isinstance(quantizer, HybridQuantizer):
            raise TypeError(
                f"HybridQuantizedTensorStorage requires a parent HybridQuantizer; got {type(quantizer).__name__}."
            )
        self._rowwise_storage, self._columnwise_storage = rowwise_storage, columnwise_storage
        self._quantizer = quantizer.copy()
        self._dtype = fake_dtype if fake_dtype is not None else torch.float32

    @property
    def rowwise_sub_storage(self) -> Any:
        return self._rowwise_storage

    @property
    def columnwise_sub_storage(self) -> Any:
        return self._columnwise_storage

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self._rowwise_storage is not None, "columnwise": self._columnwise_storage is not None}

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """Drop a copy; asking for one that is gone is TE's error (a storage cannot rebuild it)."""
        for want, have, name in (
            (rowwise_usage, self._rowwise_storage, "rowwise"),
            (columnwise_usage, self._columnwise_storage, "columnwise"),
        ):
            if want and have is None:
                raise RuntimeError(
                    f"Requested {name} usage, but HybridQuantizedTensorStorage has no {name} sub-storage"
                )
        if rowwise_usage is False:
            self._rowwise_storage = None
        if columnwise_usage is False:
            self._columnwise_storage = None

    def prepare_for_saving(self) -> tuple[list, HybridQuantizedTensorStorage]:
        """The sub-storages' tensors for ``save_for_backward`` (rowwise first), and this storage."""
        tensors: list = []
        for sub in (self._rowwise_storage, self._columnwise_storage):
            if isinstance(sub, torch.Tensor):
                tensors.append(sub)
            elif sub is not None:
                tensors.extend(sub.prepare_for_saving()[0])
        return tensors, self

    def restore_from_saved(self, tensors: list) -> list:
        """Take back what :meth:`prepare_for_saving` gave; returns the tensors left over."""
        for attr in ("_rowwise_storage", "_columnwise_storage"):
            sub = getattr(self, attr)
            if isinstance(sub, torch.Tensor):
                setattr(self, attr, tensors[0])
                tensors = tensors[1:]
            elif sub is not None:
                tensors = sub.restore_from_saved(tensors)
        return tensors

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The rowwise copy's value, else the columnwise copy's (TE's order)."""
        dtype = self._dtype if dtype is None else dtype
        for sub in (self._rowwise_storage, self._columnwise_storage):
            if sub is not None:
                return sub.dequantize(dtype=dtype)
        raise RuntimeError("HybridQuantizedTensorStorage has no data to dequantize")


def gemm_operand(tensor: Any, usage: str) -> Any:
    """TE ``general_gemm``'s ``_unwrap_tensor`` for a hybrid tensor: the sub-storage of ``usage`` ("rowwise" or
    "columnwise"); any other tensor as it is."""
    if not isinstance(tensor, HybridQuantizedTensorStorage):
        return tensor
    sub = tensor.rowwise_sub_storage if usage == "rowwise" else tensor.columnwise_sub_storage
    if sub is None:  # TE's message
        raise RuntimeError(
            f"GEMM requested the {usage} representation, but it is unavailable. Ensure {usage}_usage is enabled "
            "and the representation has not been dropped by update_usage()."
        )
    return sub
