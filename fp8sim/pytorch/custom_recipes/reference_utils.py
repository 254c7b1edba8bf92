"""Helpers shared by TE's pure-PyTorch reference quantizers (TE 2.20.0.dev0
``pytorch/custom_recipes/reference_utils.py``): the high-precision input dtypes, the FP4 format enum and
ceiling division."""

from __future__ import annotations

import enum

import torch

__all__ = ["HIGH_PRECISION_FLOAT_DTYPES", "Fp4Formats", "roundup_div"]

# TE lists torch.float and torch.float32 both (the same dtype); kept so its messages print the same tuple
HIGH_PRECISION_FLOAT_DTYPES = (torch.float, torch.float16, torch.bfloat16, torch.float32)


class Fp4Formats(enum.Enum):
    """FP4 element formats of the reference quantizers."""

    E2M1 = "e2m1"


def roundup_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for ``x >= 0``, ``y > 0`` (TE asserts both)."""
    assert x >= 0
    assert y > 0
    return -(-x // y)
