"""What torchao's ``Float8TrainingTensor`` holds (``torchao/float8/float8_training_tensor.py``): the
codes, the scale and the format of an operand cast to float8; and torchao's float8 dtypes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..formats import FloatFormat
from ..scaling.quantized import QuantizedData

__all__ = ["_FP8_FORMATS", "_Float8"]

_FP8_FORMATS = {
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.float8_e4m3fnuz: "e4m3fnuz",
    torch.float8_e5m2fnuz: "e5m2fnuz",
}


@dataclass(frozen=True)
class _Float8:
    """An operand cast to float8 (what torchao's Float8TrainingTensor holds), a torch view of a
    :class:`~fp8sim.scaling.QuantizedData` record: uint8 codes in the operand's shape, the float32
    quantization scale (0-dim, or keepdim for axiswise; the record's divisor scales), the format.

    The codes and scale are torch tensors on the operand's device (torchao's cast runs as torch ops there,
    and FSDP2 gathers the codes in place); ``qt`` is the record they were taken from where the scaling
    layer cast the operand (:meth:`of_record`), else None and :meth:`quantized_data` builds it (CPU copies)."""

    codes: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat
    axiswise: bool
    qt: QuantizedData | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of_record(cls, q: QuantizedData, axiswise: bool, device: Any = None) -> _Float8:
        """The operand of a torchao record (:func:`~fp8sim.scaling.current.quantize_torchao`: divisor scales,
        one for the tensor or, ``axiswise``, one per slice kept in its keepdim shape)."""
        if not q.scale_is_divisor:
            raise ValueError("a torchao float8 operand holds divisor scales (quantize_torchao's record)")
        scale = q.scales if axiswise else q.scales.reshape(())
        codes = torch.from_numpy(np.ascontiguousarray(q.codes))
        scale = torch.from_numpy(np.ascontiguousarray(scale))
        if device is not None:
            codes, scale = codes.to(device), scale.to(device)
        return cls(codes, scale, q.fmt, axiswise, q)

    def relaid(self, codes: torch.Tensor, scale: torch.Tensor | None = None) -> _Float8:
        """The same operand in another layout (a transposed view of the codes, and of an axiswise scale):
        the record is rebuilt from the new layout when asked for."""
        return _Float8(codes, self.scale if scale is None else scale, self.fmt, self.axiswise)

    def quantized_data(self) -> QuantizedData:
        """The record: the codes, the scales as divisors (torchao dequantizes ``codes / scale``)."""
        if self.qt is not None:
            return self.qt
        codes = self.codes.detach().cpu().contiguous().numpy()
        scale = self.scale.detach().cpu().to(torch.float32).numpy()
        if self.axiswise:
            block = tuple(c // s for c, s in zip(codes.shape, scale.shape, strict=True))
        else:
            scale, block = scale.reshape((1,) * codes.ndim), tuple(max(d, 1) for d in codes.shape)
        return QuantizedData(codes, scale, self.fmt, block, codes.shape, "float32", scale_is_divisor=True)
