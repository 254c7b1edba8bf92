"""``transformer_engine_torch`` (``tex``), TE's C++ extension, as far as Python code calls it.

TE binds these in ``pytorch/csrc/extensions/pybind.cpp`` (d0067d0): the ``DType`` enum (compared by
integer value, lines 195-207), ``FP8FwdTensors`` / ``FP8BwdTensors`` (lines 734-751, values from
``csrc/common.h``), ``quantize(tensor, quantizer, output=None, noop=None)`` and
``dequantize(input, otype)`` (``csrc/extensions/cast.cpp``), ``fused_multi_row_padding`` /
``fused_multi_row_unpadding`` (``csrc/extensions/padding.cpp``, ``common/util/padding.cu``) and
``layernorm_bwd`` / ``rmsnorm_bwd`` (``csrc/extensions/normalization.cpp`` 13-60, 216-257).  Under ``fp8sim run`` (or
``fp8sim.shim.install()``) ``import transformer_engine_torch`` is this module; any other name of
the extension raises ``NotImplementedError`` naming it.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from .constants import DType, TE_DType_To_Torch

__all__ = [
    "DType",
    "FP8FwdTensors",
    "FP8BwdTensors",
    "FP8TensorMeta",
    "quantize",
    "dequantize",
    "fused_multi_row_padding",
    "fused_multi_row_unpadding",
    "layernorm_bwd",
    "rmsnorm_bwd",
]


class FP8FwdTensors(enum.IntEnum):
    """Forward slots of a module's FP8 meta (``csrc/common.h`` ``enum FP8FwdTensors``)."""

    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensors(enum.IntEnum):
    """Backward slots of a module's FP8 meta (``csrc/common.h`` ``enum FP8BwdTensors``)."""

    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


class FP8TensorMeta:
    """TE's ``FP8TensorMeta``: ``scale``, ``scale_inv`` and ``amax_history`` (None until set)."""

    def __init__(self) -> None:
        self.scale: torch.Tensor | None = None
        self.scale_inv: torch.Tensor | None = None
        self.amax_history: torch.Tensor | None = None


def quantize(tensor: torch.Tensor, quantizer: Any, output: Any = None, noop: torch.Tensor | None = None) -> Any:
    """``tensor`` (read contiguously) quantized by ``quantizer`` into a new tensor or into ``output``
    (``noop``: a one-element tensor; 1 skips the update, as TE's kernels read the flag).  No autograd:
    the extension returns a detached result.  ``quantizer=None`` copies the tensor (TE's NoneQuantizer)."""
    src = tensor.detach().contiguous()
    if quantizer is None:
        if output is not None:
            output.copy_(src)
            return output
        return src.clone()
    if output is not None:
        return quantizer.update_quantized(src, output, noop_flag=noop)
    if noop is not None and float(noop.reshape(-1)[0]) == 1.0:
        return quantizer.make_empty(src.shape, dtype=src.dtype, device=src.device)
    return quantizer.quantize_impl(src)


def dequantize(input: Any, otype: DType | int) -> torch.Tensor:  # noqa: A002 - TE's argument name
    """``input`` (a quantized tensor or storage) dequantized to the torch dtype of ``otype``."""
    dtype = TE_DType_To_Torch.get(DType.cast(otype))
    if dtype is None or not dtype.is_floating_point or dtype.itemsize < 2:
        raise ValueError(f"dequantize: otype must be kFloat32, kFloat16 or kBFloat16, got {DType.cast(otype)!r}")
    return input.dequantize(dtype=dtype)


def _check_splits(name: str, src: list[int], dst: list[int]) -> None:
    if len(src) != len(dst):
        raise ValueError(f"{name}: {len(src)} input splits but {len(dst)} output splits")


def fused_multi_row_padding(
    input: torch.Tensor,  # noqa: A002 - TE's argument name
    output: torch.Tensor,
    input_row_list: list[int],
    padded_input_row_list: list[int],
) -> None:
    """Copy each row block of ``input`` (sizes ``input_row_list``) into ``output`` at the start of its
    padded block (sizes ``padded_input_row_list``); the padding rows are zero (padding.cu)."""
    _check_splits("fused_multi_row_padding", input_row_list, padded_input_row_list)
    src = dst = 0
    with torch.no_grad():
        for rows, padded in zip(input_row_list, padded_input_row_list, strict=True):
            output[dst : dst + rows].copy_(input[src : src + rows])
            output[dst + rows : dst + padded].zero_()
            src, dst = src + rows, dst + padded


def fused_multi_row_unpadding(
    input: torch.Tensor,  # noqa: A002 - TE's argument name
    output: torch.Tensor,
    input_row_list: list[int],
    unpadded_input_row_list: list[int],
) -> None:
    """The first ``unpadded_input_row_list[i]`` rows of each padded block (sizes ``input_row_list``) of
    ``input``, concatenated into ``output``."""
    _check_splits("fused_multi_row_unpadding", input_row_list, unpadded_input_row_list)
    src = dst = 0
    with torch.no_grad():
        for padded, rows in zip(input_row_list, unpadded_input_row_list, strict=True):
            output[dst : dst + rows].copy_(input[src : src + rows])
            src, dst = src + padded, dst + rows


def _float32_inputs(x: torch.Tensor, gamma: torch.Tensor, zero_centered_gamma: bool) -> tuple[torch.Tensor, ...]:
    """The norm backwards' float32 ``x`` (contiguous, as TE's kernels read it) and ``gamma`` (``+ 1`` when
    zero-centred)."""
    from .module._norm_prologue import gamma32

    return x.detach().contiguous().float(), gamma32(gamma.detach().contiguous(), zero_centered_gamma)


def layernorm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    mu: torch.Tensor,
    rsigma: torch.Tensor,
    gamma: torch.Tensor,
    sm_margin: int,
    zero_centered_gamma: bool,
) -> list[torch.Tensor]:
    """``[dx, dgamma, dbeta]`` of LayerNorm over the last dimension of the 2-D ``x`` from its saved float32
    statistics ``mu`` / ``rsigma`` (one per row), computed in float32 (``gamma + 1`` when zero-centred) and
    rounded once to ``x``'s / ``gamma``'s dtype, the arithmetic of fp8sim's LayerNorm modules' backward.
    ``sm_margin`` only sizes the CUDA grid and changes no value."""
    from .module._norm_prologue import layernorm_backward

    del sm_margin
    x32, g32 = _float32_inputs(x, gamma, zero_centered_gamma)
    dz32 = dz.detach().contiguous().float().view(x32.shape)
    dx, dg, db = layernorm_backward(dz32, x32, mu.detach().float(), rsigma.detach().float(), g32, torch.zeros_like(g32))
    return [dx.to(x.dtype), dg.to(gamma.dtype), db.to(gamma.dtype)]


def rmsnorm_bwd(
    dz: torch.Tensor,
    x: torch.Tensor,
    rsigma: torch.Tensor,
    gamma: torch.Tensor,
    sm_margin: int,
    zero_centered_gamma: bool,
) -> list[torch.Tensor]:
    """``[dx, dgamma]`` of RMSNorm over the last dimension of the 2-D ``x`` from its saved float32 ``rsigma``
    (one per row), computed in float32 (``gamma + 1`` when zero-centred) and rounded once to ``x``'s /
    ``gamma``'s dtype: the arithmetic of fp8sim's RMSNorm backward (``module/_norm_prologue.py``).
    ``sm_margin`` only sizes the CUDA grid and changes no value."""
    from .module._norm_prologue import rmsnorm_backward

    del sm_margin
    x32, g32 = _float32_inputs(x, gamma, zero_centered_gamma)
    dx, dg = rmsnorm_backward(dz.detach().contiguous().float().view(x32.shape), x32, rsigma.detach().float(), g32)
    return [dx.to(x.dtype), dg.to(gamma.dtype)]
