"""Moved to :mod:`fp8sim.pytorch.module._operands` (this path keeps old imports working)."""

from .module._operands import PER_TENSOR, Operand, nan_skipping_amax, quantize_operand  # noqa: F401

__all__ = ["Operand", "quantize_operand", "PER_TENSOR", "nan_skipping_amax"]
