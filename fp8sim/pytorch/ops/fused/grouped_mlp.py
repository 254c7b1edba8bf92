"""TE 2.20.0.dev0's experimental grouped-MLP fusions (``ops/fused/grouped_mlp.py``): cuDNN/CuTe grouped GEMM
kernels for ``GroupedLinear`` + activation + ``GroupedLinear`` on Blackwell.  Not emulated: the fusible
``GroupedLinear`` op they need is refused, so they never apply; constructing them is refused."""

from __future__ import annotations

from typing import Any

from ..op import FusedOperation

__all__ = ["GroupedMLP_CuTeGEMMGLU", "GroupedMLP_CuTeGEMMUnary"]


class _GroupedMLP(FusedOperation):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"transformer_engine.pytorch.ops.fused.{type(self).__name__} (cuDNN/CuTe grouped GEMM kernels for "
            "Blackwell GPUs) is not emulated by fp8sim"
        )


class GroupedMLP_CuTeGEMMGLU(_GroupedMLP):  # noqa: N801 - TE's name
    """Refused (CUDA grouped GEMM kernels)."""


class GroupedMLP_CuTeGEMMUnary(_GroupedMLP):  # noqa: N801 - TE's name
    """Refused (CUDA grouped GEMM kernels)."""
