"""What TE's ``LayerNorm`` and ``RMSNorm`` share: TE's constructor (``normalized_shape``, deprecated
``hidden_size`` / ``params_dtype``), parameters, and the float32 computation."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..._util.args import as_int, as_real
from ._normalization import normalize
from ._params import materialize_meta_parameter

__all__ = ["NormBase"]


def _shape(normalized_shape: Any, arg: str) -> tuple[int, ...]:
    """``normalized_shape`` (an int of any integral type, or a sequence of them) as a tuple of ints >= 1."""
    if isinstance(normalized_shape, (str, bytes)) or not hasattr(normalized_shape, "__iter__"):
        return (as_int(normalized_shape, arg, lo=1),)
    if hasattr(normalized_shape, "ndim") and normalized_shape.ndim == 0:
        return (as_int(normalized_shape, arg, lo=1),)
    shape = tuple(as_int(n, arg, lo=1) for n in normalized_shape)
    if not shape:
        raise ValueError(f"{arg} must have at least one dimension, got ()")
    return shape


class NormBase(nn.Module):
    """A TE normalization module: float32 statistics; the output in the autocast dtype under
    ``torch.autocast``, else in the weight dtype (TE ``ops/basic/layer_norm.py``: ``maybe_autocast_dtype``)."""

    _normalization = "LayerNorm"

    def __init__(
        self,
        normalized_shape: Iterable[int] | int | None = None,
        eps: float = 1e-5,
        sequence_parallel: bool | None = None,
        params_dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        hidden_size: int | None = None,
        *,
        device: Any = "cpu",
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if normalized_shape is None:
            if hidden_size is None:
                raise RuntimeError("Neither `normalized_shape` nor `hidden_size` (deprecated) args are provided")
            warnings.warn(
                "`hidden_size` arg has been renamed to `normalized_shape` for compatibility with `torch.nn.LayerNorm`.",
                DeprecationWarning,
                stacklevel=3,
            )
            normalized_shape = hidden_size
        elif hidden_size is not None:
            raise RuntimeError("Both `normalized_shape` and `hidden_size` (deprecated) args are provided")
        if params_dtype is not None:
            if dtype is not None:
                raise RuntimeError("Both `dtype` and `params_dtype` (deprecated) kwargs are provided")
            dtype = params_dtype
        shape = _shape(normalized_shape, "normalized_shape" if hidden_size is None else "hidden_size")
        eps = as_real(eps, "eps", finite=True, lo=0.0)
        dtype = dtype if dtype is not None else torch.get_default_dtype()
        self.normalized_shape, self.eps, self.zero_centered_gamma = shape, eps, zero_centered_gamma
        self.sequence_parallel = sequence_parallel
        self.weight = nn.Parameter(torch.empty(shape, dtype=dtype, device=device))
        if self._normalization == "LayerNorm":
            self.bias = nn.Parameter(torch.empty(shape, dtype=dtype, device=device))
        else:
            self.bias = None
        if self.weight.device.type != "meta":  # TE: initialisation on meta waits for reset_parameters()
            self.reset_parameters()

    @property
    def hidden_size(self) -> int:
        return self.normalized_shape[-1]

    def reset_parameters(self, defer_init: bool | None = None) -> None:
        """gamma ones (zeros when zero-centred: ``gamma + 1`` is applied), beta zeros."""
        if defer_init:
            return
        for name in ("weight", "bias"):  # TE (ops/basic/layer_norm.py reset_parameters): off meta first
            p = getattr(self, name, None)
            if p is not None and p.device.type == "meta":
                materialize_meta_parameter(self, name, p)
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()
        if self.sequence_parallel is not None:
            self.weight.sequence_parallel = self.sequence_parallel
            if self.bias is not None:
                self.bias.sequence_parallel = self.sequence_parallel

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        dev = inp.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else self.weight.dtype
        with torch.autocast(dev, enabled=False):
            x = inp.to(dtype)
            y = normalize(x, self.weight, self.bias, self.eps, self._normalization, self.zero_centered_gamma)
        return y.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"
