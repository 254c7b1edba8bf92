"""TE's custom-GEMM dispatch (TE 2.20.0.dev0 ``pytorch/custom_recipes/gemm.py``): ``general_gemm`` hands two
custom quantized tensors (``.custom`` True, e.g. the reference quantizers' results) to their quantizer's
``qgemm``.

TE calls ``general_gemm(A, B)`` with cuBLAS's operand order (``A`` the weight-like operand); ``custom_gemm``
swaps them, so ``qgemm`` receives the activation-like operand first.  The layout picks the GEMM:
``grad=False`` FPROP (``A.data``, ``B.data``), ``grad=True`` with ``"NN"`` DGRAD (``A.data``,
``B.data_t``), with ``"NT"`` WGRAD (``A.data_t``, ``B.data_t``), any other layout FPROP.  ``qgemm`` is taken
from the swapped first operand's quantizer, else the second's.  Only ``bias`` reaches FPROP; ``out``,
``accumulate``, ``gelu`` and the output quantizer are not forwarded (as in TE).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torch

from ..tensor.utils import is_custom

__all__ = ["GEMMType", "MMParams", "custom_gemm"]


@enum.unique
class GEMMType(enum.Enum):
    """Which of a linear layer's three GEMMs runs."""

    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


@dataclasses.dataclass(frozen=True)
class MMParams:
    """GEMM options passed to ``qgemm``: the output dtype (None: the activation's) and whether FP8
    accumulation is split (promoted to float32 periodically)."""

    out_dtype: torch.dtype | None = None
    use_split_accumulator: bool = True


def _need(value: Any, what: str) -> Any:
    if value is None:
        raise ValueError(what)
    return value


def custom_gemm(
    A: Any,  # noqa: N803 - TE's names
    B: Any,  # noqa: N803
    workspace: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    quantization_params: Any = None,
    gelu: bool = False,
    gelu_in: torch.Tensor | None = None,
    accumulate: bool = False,
    layout: str = "TN",
    out: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    use_split_accumulator: bool = False,
    grad: bool = False,
) -> tuple[torch.Tensor, None, None, None]:
    """Run ``A``/``B``'s quantizer's ``qgemm`` for the GEMM ``layout`` and ``grad`` select; returns
    ``(out, None, None, None)`` like ``general_gemm``."""
    del workspace, quantization_params, gelu, gelu_in, accumulate, out  # TE drops them too
    if not (is_custom(A) and is_custom(B)):
        raise TypeError("A and B must be custom tensors")
    x, w = B, A
    if not grad or layout not in ("NN", "NT"):
        gemm_type = GEMMType.FPROP
    else:
        gemm_type = GEMMType.DGRAD if layout == "NN" else GEMMType.WGRAD
    quantizer = getattr(x, "_quantizer", None) or getattr(w, "_quantizer", None)
    if quantizer is None:
        raise ValueError("No quantizer found in QuantizedTensor objects")
    params = MMParams(out_dtype=out_dtype, use_split_accumulator=use_split_accumulator)
    dtype = x.dtype if params.out_dtype is None else params.out_dtype
    kw = dict(gemm_type=gemm_type, qresult_x=x, qresult_w=w)
    if gemm_type == GEMMType.FPROP:
        qx = _need(x.data, "FPROP GEMM: quantized activation data (A.data) is None")
        sx = _need(x.scale, "FPROP GEMM: activation scale (A.scale) is None")
        qw = _need(w.data, "FPROP GEMM: quantized weight data (B.data) is None")
        sw = _need(w.scale, "FPROP GEMM: weight scale (B.scale) is None")
        shape = _need(x.original_shape, "FPROP GEMM: A.original_shape is None, cannot determine output shape")
        result = quantizer.qgemm(qx, qw, params, dtype, sx, sw, bias, **kw)
        if len(shape) > 2:  # TE restores the first two dims only
            result = result.view(shape[0], shape[1], result.shape[-1])
    elif gemm_type == GEMMType.DGRAD:
        qdy = _need(x.data, "DGRAD GEMM: quantized gradient data (A.data) is None")
        sdy = _need(x.scale, "DGRAD GEMM: gradient scale (A.scale) is None")
        qw_t = _need(w.data_t, "DGRAD GEMM: transposed quantized weight data (B.data_t) is None")
        sw_t = _need(w.scale_t, "DGRAD GEMM: transposed weight scale (B.scale_t) is None")
        result = quantizer.qgemm(qdy, qw_t, params, dtype, sdy, sw_t, None, **kw)
    else:
        qdy_t = _need(x.data_t, "WGRAD GEMM: transposed quantized gradient data (A.data_t) is None")
        sdy_t = _need(x.scale_t, "WGRAD GEMM: transposed gradient scale (A.scale_t) is None")
        qx_t = _need(w.data_t, "WGRAD GEMM: transposed quantized activation data (B.data_t) is None")
        sx_t = _need(w.scale_t, "WGRAD GEMM: transposed activation scale (B.scale_t) is None")
        result = quantizer.qgemm(qdy_t, qx_t, params, dtype, sdy_t, sx_t, None, **kw)
    return result, None, None, None
