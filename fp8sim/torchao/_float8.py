"""What torchao's ``Float8TrainingTensor`` holds (``torchao/float8/float8_training_tensor.py``): the
codes, the scale and the format of an operand cast to float8; and torchao's float8 dtypes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import FloatFormat

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
    operand's shape, the float32 quantization scale (0-dim, or keepdim for axiswise), the format."""

    codes: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat
    axiswise: bool
