"""Scaling: recipes' state machines and block layouts over the cast core."""

from .quantized import QuantizedTensor, expand_blocks

__all__ = ["QuantizedTensor", "expand_blocks"]
