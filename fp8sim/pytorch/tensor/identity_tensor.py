"""TE's high-precision passthrough: ``IdentityQuantizer`` and ``IdentityTensor`` (TE:
``pytorch/tensor/identity_tensor.py``, ``storage/identity_tensor_storage.py``).

A ``CustomRecipe`` factory returns an ``IdentityQuantizer`` for a slot that stays in high precision.
The tensor holds the input itself (detached, cast to the quantizer's ``dtype`` when one is set) in
``_hp_data``; one buffer serves both usages; ``dequantize()`` returns that buffer (no copy unless
another dtype is asked for), and view ops (view, slice, split, as_strided) alias it, as in TE.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .quantized_tensor import QuantizedTensor, Quantizer
from .storage.identity_tensor_storage import IdentityTensorStorage

__all__ = ["IdentityQuantizer", "IdentityTensor"]

_VIEW_OPS = ("view.default", "split.Tensor", "as_strided.default", "slice.Tensor")


class IdentityQuantizer(Quantizer):
    """Keeps the tensor as it is (``dtype``: cast to it on quantize; None keeps the input's)."""

    def __init__(self, *, dtype: torch.dtype | None = None, rowwise: bool = True, columnwise: bool = True) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = dtype

    def copy(self) -> IdentityQuantizer:
        q = IdentityQuantizer(dtype=self.dtype, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage)
        q.internal, q.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return q

    def _maybe_cast(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.detach()
        return out.to(self.dtype) if self.dtype is not None and out.dtype != self.dtype else out

    def quantize_impl(self, tensor: torch.Tensor) -> IdentityTensor:
        data = self._maybe_cast(tensor)
        return IdentityTensor(data.shape, data.dtype, hp_data=data, quantizer=self, device=data.device)

    def make_empty(
        self,
        shape: Iterable[int],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        requires_grad: bool = False,
        pin_memory: bool = False,
    ) -> IdentityTensor:
        """An uninitialised buffer of ``shape`` (the quantizer's dtype if set, else ``dtype``)."""
        del pin_memory
        data_dtype = self.dtype if self.dtype is not None else dtype
        data = torch.empty(tuple(shape), dtype=data_dtype, device=device or "cpu")
        return IdentityTensor(
            data.shape, data_dtype, hp_data=data, quantizer=self, requires_grad=requires_grad, device=data.device
        )

    def update_quantized(
        self, src: torch.Tensor, dst: QuantizedTensor, *, noop_flag: torch.Tensor | None = None
    ) -> QuantizedTensor:
        """Copy ``src`` into ``dst``'s buffer when shape/dtype/device match (keeping the old values
        where ``noop_flag`` is nonzero), else hold ``src`` itself unless ``noop_flag`` is nonzero."""
        if not isinstance(dst, IdentityTensor):
            raise ValueError(f"IdentityQuantizer can only update IdentityTensorStorage, got {type(dst).__name__}")
        data = self._maybe_cast(src)
        buf = dst._hp_data
        if buf is not None and buf.shape == data.shape and buf.dtype == data.dtype and buf.device == data.device:
            with torch.no_grad():
                if noop_flag is None:
                    buf.copy_(data)
                else:
                    torch.where(noop_flag == 0, data, buf, out=buf)
        else:
            if noop_flag is not None and noop_flag.item() != 0:
                return dst
            dst._hp_data = data.detach()
        return dst

    def calibrate(self, tensor: torch.Tensor) -> None:
        del tensor


class IdentityTensor(IdentityTensorStorage, QuantizedTensor):
    """A high-precision tensor in quantized-tensor clothing: ``_hp_data`` and ``_quantizer``."""

    _saved_fields = ("_hp_data",)

    def _init(self, *, hp_data: torch.Tensor | None, quantizer: Quantizer | None = None) -> None:
        self._hp_data = hp_data
        self._quantizer = quantizer.copy() if quantizer is not None else None

    def get_metadata(self) -> dict[str, Any]:
        return {"hp_data": self._hp_data, "quantizer": self._quantizer}

    def get_usages(self) -> dict[str, bool]:
        has = self._hp_data is not None
        return {"rowwise": has, "columnwise": has}

    def update_usage(self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None) -> None:
        """No-op: the one buffer serves both directions."""

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        if self._hp_data is None:
            raise RuntimeError("IdentityTensorStorage has no data to dequantize")
        dtype = self.dtype if dtype is None else dtype
        return self._hp_data.to(dtype) if self._hp_data.dtype != dtype else self._hp_data

    def _wrap(self, data: torch.Tensor, requires_grad: bool | None = None) -> IdentityTensor:
        return IdentityTensor(
            data.shape,
            self.dtype,
            hp_data=data,
            quantizer=self._quantizer,
            requires_grad=self.requires_grad if requires_grad is None else requires_grad,
            device=data.device,
        )

    def view(self, *shape: Any) -> IdentityTensor:  # type: ignore[override]
        flat = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return self._wrap(self._hp_data.view(*flat))

    def detach(self) -> IdentityTensor:
        return self._wrap(self._hp_data.detach(), requires_grad=False)

    def clone(self, *, memory_format: Any = None) -> IdentityTensor:
        del memory_format
        return self._wrap(self._hp_data.detach().clone())

    def contiguous(self, memory_format: torch.memory_format = torch.contiguous_format) -> IdentityTensor:
        if self._hp_data.is_contiguous(memory_format=memory_format):
            return self
        return self._wrap(self._hp_data.contiguous(memory_format=memory_format))

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"IdentityTensor(dtype={self.dtype}, data={self._hp_data})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func == torch.ops.aten.detach.default:
            return args[0].detach()
        if func == torch.ops.aten.clone.default:
            return args[0].clone()
        if str(func).removeprefix("aten.") in _VIEW_OPS:  # alias the held buffer, as TE
            result = func(args[0]._hp_data, *args[1:], **kwargs)
            if isinstance(result, list | tuple):
                return type(result)(args[0]._wrap(r) for r in result)
            return args[0]._wrap(result)
        if func == torch.ops.aten.copy_.default and isinstance(args[0], IdentityTensor):
            dst, src = args[0], args[1]
            with torch.no_grad():
                dst._hp_data.copy_(src._hp_data if isinstance(src, IdentityTensor) else src)
            return dst
        return super().__torch_dispatch__(func, types, args, kwargs)
