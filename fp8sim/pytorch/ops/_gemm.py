"""The GEMM the fusible ops call: TE's ``general_gemm(A, B, layout=...)`` contract (``cpp_extensions/gemm.py``)
computed as fp8sim's modules compute their GEMMs, so that ``te.ops.Linear`` and ``te.Linear`` give the same
bits, as they do on a GPU where both call the same cuBLAS GEMM.

``layout`` is cuBLAS's: the result is ``op_B(B) @ op_A(A)`` ("TN": ``x @ W.T``, "NN": ``dy @ W``, "NT":
``dy.T @ x``).  Quantized operands are TE tensors (``Float8Tensor``, ``MXFP8Tensor``,
``Float8BlockwiseQTensor``, ``NVFP4Tensor``) read in the representation cuBLAS reads (``A`` rowwise for
"T?", columnwise for "N?"; ``B`` rowwise for "?N", columnwise for "?T") and multiplied by
:func:`fp8sim.pytorch.module._gemm.gemm` with the autocast region's ``accumulator`` (None: exact products
summed in float32, the modules' default).  The epilogue is cuBLAS's in float32: ``alpha * acc``, ``+ bias``,
``+ beta * out``, then one rounding to the output dtype, or an FP8 output quantized from the float32 values.
High-precision operands, row-scaled NVFP4 operands and custom tensors (a ``CustomRecipe``'s reference
quantizers: their ``qgemm``) go through ``general_gemm`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...recipe import Recipe
from ..cpp_extensions.gemm import general_gemm, validate_gemm_scale
from ..module._gemm import gemm as _module_gemm
from ..module._operands import operand_of_tensor as _operand
from ..tensor import NVFP4TensorStorage
from ..tensor.utils import is_custom
from ._common import is_quantized_tensor

__all__ = ["GemmMode", "ops_gemm"]

_WHICH = {"TN": "fprop", "NN": "dgrad", "NT": "wgrad"}


@dataclass(frozen=True)
class GemmMode:
    """What picks the accumulator of a quantized GEMM: the recipe (fast or split per GEMM) and the
    autocast region's ``accumulator`` (captured in the forward for the backward GEMMs)."""

    recipe: Recipe | None = None
    accumulator: str | None = None

    @classmethod
    def current(cls) -> GemmMode:
        from ..quantization import FP8GlobalStateManager, current_state

        st = current_state()
        recipe = FP8GlobalStateManager.get_fp8_recipe() if st.enabled else None
        return cls(recipe, st.accumulator)


def _written_dtype(quantizer: Any, dtype: torch.dtype) -> Any:
    """What cuBLAS writes (a profile's split decision depends on it): FP8 under delayed scaling, whose
    quantizer's scale goes into the GEMM; other quantizers cast the ``dtype`` result afterwards."""
    from ..tensor.float8_tensor import _FORMATS, Float8Quantizer

    if isinstance(quantizer, Float8Quantizer):
        return _FORMATS[quantizer.dtype].name
    return dtype


def _unwrap(t: Any, usage: str) -> Any:
    """TE ``cpp_extensions/gemm.py`` ``_unwrap_tensor``: a hybrid tensor gives the copy of ``usage``; a quantized
    tensor cuBLAS cannot read (an ``IdentityTensor``, a ``CustomRecipe``'s high-precision slot) enters the GEMM
    dequantized."""
    from ..tensor import IdentityTensor
    from ..tensor.hybrid_tensor import gemm_operand

    t = gemm_operand(t, usage)
    return t.dequantize() if isinstance(t, IdentityTensor) else t


def _row_scaled(t: Any) -> bool:
    amaxes = (getattr(t, "_amax_rowwise", None), getattr(t, "_amax_columnwise", None))
    return isinstance(t, NVFP4TensorStorage) and any(a is not None and a.numel() > 1 for a in amaxes)


def ops_gemm(
    A: Any,
    B: Any,
    *,
    layout: str = "TN",
    out_dtype: torch.dtype | None = None,
    quantization_params: Any = None,
    alpha: float | None = 1.0,
    beta: float | None = None,
    accumulate: bool = False,
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    mode: GemmMode | None = None,
) -> torch.Tensor:
    """``general_gemm(A, B, ...)[0]`` for the ops (see the module docstring); ``mode``: the accumulator."""
    if layout not in _WHICH:
        raise AssertionError(f"GEMM layout {layout} not supported.")
    A = _unwrap(A, "rowwise" if layout[0] == "T" else "columnwise")
    B = _unwrap(B, "columnwise" if layout[1] == "T" else "rowwise")
    if is_custom(A) or is_custom(B):
        # TE general_gemm (cpp_extensions/gemm.py 245-260) hands custom tensors to custom_gemm before any other
        # check; BasicLinear passes grad=True to its dgrad ("NN") and wgrad ("NT") GEMMs (basic_linear.py 922-984)
        kwargs = dict(layout=layout, out=out, bias=bias, accumulate=accumulate, alpha=alpha, beta=beta)
        return general_gemm(
            A, B, out_dtype=out_dtype, quantization_params=quantization_params, grad=layout != "TN", **kwargs
        )[0]
    quantized = (is_quantized_tensor(A), is_quantized_tensor(B))
    if quantized[0] != quantized[1]:
        raise TypeError(
            f"GEMM operands must both be quantized or both high precision (cuBLAS takes no mix); got "
            f"{type(A).__name__} and {type(B).__name__}"
        )
    kwargs = dict(layout=layout, out=out, bias=bias, accumulate=accumulate, alpha=alpha, beta=beta)
    if not quantized[0] or _row_scaled(A) or _row_scaled(B):
        return general_gemm(A, B, out_dtype=out_dtype, quantization_params=quantization_params, **kwargs)[0]
    alpha = validate_gemm_scale(alpha, True)
    beta = validate_gemm_scale(beta, accumulate)
    if accumulate and out is None:
        raise ValueError("general_gemm: accumulate=True needs the `out` tensor to accumulate into")
    if out is not None and not out.is_contiguous():
        raise ValueError("Output tensor is not contiguous.")
    mode = mode or GemmMode.current()
    left = _operand(B, columnwise=layout[1] == "T")
    left = left.t() if layout[1] == "T" else left
    right = _operand(A, columnwise=layout[0] == "N")
    right = right.t() if layout[0] == "T" else right
    dtype = out_dtype or (out.dtype if out is not None else A.dtype)
    written = _written_dtype(quantization_params, dtype)
    # wgrad into main_grad (alpha = beta = 1, no bias): C joins cuBLASLt's epilogue FMA, as in the modules
    fused = accumulate and alpha == 1.0 and beta == 1.0 and bias is None
    addend = out.reshape(-1, out.shape[-1]).float() if fused else None  # the (M, N) result's layout
    acc = _module_gemm(left, right, mode.recipe, _WHICH[layout], mode.accumulator, out_dtype=written, addend=addend)
    if alpha != 1.0:
        acc = acc * np.float32(alpha)
    if bias is not None:
        acc = acc + bias.float()
    if accumulate and not fused:
        acc = acc + np.float32(beta) * out.reshape(acc.shape).float()
    lead = tuple(B.shape[:-1]) if layout[1] == "N" else (B.shape[-1],)
    acc = acc.reshape(*lead, acc.shape[-1])
    if quantization_params is not None:  # cuBLAS's FP8 output: the float32 result cast with its scale
        return quantization_params(acc).to_dtype(dtype)
    result = acc.to(dtype)
    if out is not None:
        out.copy_(result)
        return out
    return result
