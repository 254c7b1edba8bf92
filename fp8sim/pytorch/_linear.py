"""Moved to :mod:`fp8sim.pytorch.module._linear_function` and ``module._gemm`` (old imports keep working)."""

from .module._gemm import gemm  # noqa: F401
from .module._linear_function import fp8_linear  # noqa: F401

__all__ = ["gemm", "fp8_linear"]
