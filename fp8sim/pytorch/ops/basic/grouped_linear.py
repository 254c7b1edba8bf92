"""``GroupedLinear`` as a fusible op (TE 2.20.0.dev0 ``ops/basic/grouped_linear.py``): not emulated yet.

The module ``fp8sim.pytorch.GroupedLinear`` (``te.GroupedLinear``) is; the fusible op's grouped-tensor
path, split sizes as an extra input and caller-provided buffers (``OUTPUT_BUFFER_KEY`` /
``GRAD_INPUT_BUFFER_KEY`` in ``Sequential(op_kwargs=...)``) are refused with ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Any

from ....recipe import Recipe
from ..op import BasicOperation

__all__ = ["GroupedLinear", "is_op_fuser_grouped_tensor_path_supported", "OUTPUT_BUFFER_KEY", "GRAD_INPUT_BUFFER_KEY"]

OUTPUT_BUFFER_KEY = "output"
GRAD_INPUT_BUFFER_KEY = "grad_input"


def is_op_fuser_grouped_tensor_path_supported(recipe: Recipe | None, dtype: Any) -> bool:  # noqa: ARG001
    """TE: whether the graph-safe grouped-tensor path (CUDA grouped GEMM kernels) serves ``recipe``; never here."""
    return False


class GroupedLinear(BasicOperation):
    """TE's grouped linear fusible op: refused (use ``te.GroupedLinear``, the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "transformer_engine.pytorch.ops.GroupedLinear (the fusible grouped linear op) is not emulated by "
            "fp8sim; the module transformer_engine.pytorch.GroupedLinear is"
        )

    def op_forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never constructed
        raise NotImplementedError

    def op_backward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never constructed
        raise NotImplementedError
