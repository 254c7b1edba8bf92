"""TE's ``QuantizedTensorStorage`` (TE: ``pytorch/quantized_tensor.py``): the base of every storage class.

In TE each quantized tensor type ``X`` is ``XTensor(XTensorStorage, QuantizedTensor)``: the storage holds
the data, the tensor adds ``torch.Tensor`` behaviour.  fp8sim keeps the data on the tensor classes
themselves; the storage classes carry TE's quantizer accessors, so ``isinstance`` checks and
``_get_quantizer`` / ``update_quantizer`` behave as in TE.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["QuantizedTensorStorage", "as_storage"]


class QuantizedTensorStorage:
    """Base of TE's ``*TensorStorage`` classes."""

    _quantizer: Any

    def _get_quantizer(self) -> Any:
        """The tensor's quantizer (the one in-place quantization uses), else the class's default."""
        if self._quantizer is not None:
            return self._quantizer
        return self._build_default_quantizer()

    def _build_default_quantizer(self) -> Any:
        raise ValueError(
            f"{self.__class__.__name__} has no quantizer and no default quantizer is available defined in the subclass."
        )

    def update_quantizer(self, quantizer: Any) -> None:
        """Replace the tensor's quantizer (TE warns: later in-place quantization uses the new one)."""
        if self._quantizer is None:
            raise RuntimeError("To be updated, quantizer must be set")
        if self._quantizer is not quantizer:
            warnings.warn("Quantizer is being updated, this may affect model behavior", stacklevel=2)
            self._quantizer = quantizer


class _StorageView:
    """A storage over the buffers of one fp8sim quantized tensor: its fields read and write the tensor's
    (so ``_rowwise_data`` is the very buffer, and ``prepare_for_saving`` empties it), ``dequantize`` runs
    without autograd, and it is no ``torch.Tensor`` (TE's ``*TensorStorage`` instances are not)."""

    def __getattr__(self, name: str) -> Any:
        if name == "_tensor":
            raise AttributeError(name)
        return getattr(self._tensor, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tensor, name, value)

    def dequantize(self, *, dtype: Any = None) -> Any:
        """The values in ``dtype`` (default: the nominal dtype), as TE's storage ``dequantize``."""
        import torch

        with torch.no_grad():
            return self._tensor.dequantize(dtype=dtype)

    def size(self, dim: int | None = None) -> Any:
        return self._tensor.size() if dim is None else self._tensor.size(dim)

    def prepare_for_saving(self) -> tuple[list, Any]:
        """TE's: the buffers for ``save_for_backward`` (the fields become None), this storage to restore into."""
        tensors, _ = self._tensor.prepare_for_saving()
        return tensors, self

    def restore_from_saved(self, tensors: list) -> list:
        return self._tensor.restore_from_saved(tensors)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self._tensor.shape)}, usages={self._tensor.get_usages()})"


_VIEW_CLASSES: dict[type, type] = {}


def as_storage(tensor: Any) -> QuantizedTensorStorage:
    """``tensor`` (an fp8sim quantized tensor) as what TE's ``internal=True`` quantizers return: an
    instance of its ``*TensorStorage`` class that is not a ``torch.Tensor``, over the same buffers."""
    import torch

    if isinstance(tensor, _StorageView):
        return tensor
    base = next(
        c for c in type(tensor).__mro__ if issubclass(c, QuantizedTensorStorage) and not issubclass(c, torch.Tensor)
    )
    cls = _VIEW_CLASSES.get(base)
    if cls is None:
        names = {"__module__": base.__module__, "__qualname__": base.__qualname__}
        cls = _VIEW_CLASSES[base] = type(base.__name__, (_StorageView, base), names)
    view = object.__new__(cls)
    object.__setattr__(view, "_tensor", tensor)
    return view
