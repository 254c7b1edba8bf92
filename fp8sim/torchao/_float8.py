"""What torchao's ``Float8TrainingTensor`` holds (``torchao/float8/float8_training_tensor.py``): the
codes, the scale and the format of an operand cast to float8; and torchao's float8 dtypes."""

from __future__ import annotations

from dataclasses import dataclass

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
    """An operand cast to float8 (what torchao's Float8TrainingTensor holds): uint8 codes in the
    operand's shape, the float32 quantization scale (0-dim, or keepdim for axiswise), the format.

    Not the scaling layer's :class:`~fp8sim.scaling.QuantizedData`: these are torch tensors on the
    operand's device (torchao's cast runs as torch ops there, and FSDP2 gathers the codes in place), the
    record holds numpy arrays.  :meth:`quantized_data` gives the record (CPU copies)."""

    codes: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat
    axiswise: bool

    def quantized_data(self) -> QuantizedData:
        """The record: the codes, the scales as divisors (torchao dequantizes ``codes / scale``)."""
        codes = self.codes.detach().cpu().contiguous().numpy()
        scale = self.scale.detach().cpu().to(torch.float32).numpy()
        if self.axiswise:
            block = tuple(c // s for c, s in zip(codes.shape, scale.shape, strict=True))
        else:
            scale, block = scale.reshape((1,) * codes.ndim), tuple(max(d, 1) for d in codes.shape)
        return QuantizedData(codes, scale, self.fmt, block, codes.shape, "float32", scale_is_divisor=True)
