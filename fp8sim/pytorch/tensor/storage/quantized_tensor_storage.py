"""TE's ``QuantizedTensorStorage`` (TE: ``pytorch/quantized_tensor.py``): the base of every storage class.

In TE each quantized tensor type ``X`` is ``XTensor(XTensorStorage, QuantizedTensor)``: the storage holds
the data, the tensor adds ``torch.Tensor`` behaviour.  fp8sim keeps the data on the tensor classes
themselves; the storage classes carry TE's quantizer accessors, so ``isinstance`` checks and
``_get_quantizer`` / ``update_quantizer`` behave as in TE.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["QuantizedTensorStorage"]


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
