"""Helpers the fusible operations share (TE 2.20.0.dev0 ``pytorch/ops/_common.py`` and the
``utils.py`` helpers the ops call: device and dtype canonicalisation, dequantize-or-cast, autocast
dtype, Megatron-style ``main_grad`` plumbing)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensorStorage,
    Quantizer,
)

__all__ = [
    "canonicalize_device",
    "canonicalize_dtype",
    "devices_match",
    "clear_tensor_data",
    "is_quantized_tensor",
    "maybe_dequantize",
    "maybe_autocast_dtype",
    "get_fused_normalization_quantizer",
    "validate_or_alloc_output",
    "get_main_grad_from_param",
    "get_accumulate_flag_in_param",
    "get_dummy_wgrads_for_params",
    "view_main_grad_as_grouped_buffer",
]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def canonicalize_device(device: torch.device | str | None) -> torch.device:
    """TE ``utils.canonicalize_device``; ``None`` is torch's default device (the CPU here, where TE
    takes the current CUDA device)."""
    if device is None:
        return torch.get_default_device()
    return device if isinstance(device, torch.device) else torch.device(device)


def canonicalize_dtype(dtype: torch.dtype | None) -> torch.dtype:
    """TE ``utils.canonicalize_dtype``: ``None`` is torch's default dtype."""
    return torch.get_default_dtype() if dtype is None else dtype


def devices_match(a: torch.device | str, b: torch.device | str) -> bool:
    return torch.device(a) == torch.device(b)


def clear_tensor_data(*tensors: Any) -> None:
    """TE frees saved activations early in backward; fp8sim lets the garbage collector do it (no
    effect on the numbers)."""


def is_quantized_tensor(tensor: Any) -> bool:
    """TE ``_common.is_quantized_tensor``: a TE quantized tensor (or storage)."""
    return isinstance(tensor, QuantizedTensorStorage)


def maybe_dequantize(tensor: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """TE ``_common.maybe_dequantize``: dequantize to ``dtype``, or cast a plain tensor and make it contiguous."""
    if is_quantized_tensor(tensor):
        return tensor.dequantize(dtype=dtype)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def maybe_autocast_dtype(*, device_type: str = "cpu", default_dtype: torch.dtype | None = None) -> torch.dtype:
    """TE ``_common.maybe_autocast_dtype``: the ``torch.autocast`` dtype when autocast is on for
    ``device_type`` (TE asks CUDA's; fp8sim computes on the CPU and asks the tensors' device)."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return canonicalize_dtype(default_dtype)


def compute_dtype(reference: Any, default: torch.dtype) -> torch.dtype:
    """The dtype an op computes in: the autocast dtype of ``reference``'s device, else ``default``
    (TE: ``torch.get_autocast_dtype("cuda")`` under ``torch.is_autocast_enabled()``)."""
    dev = reference.device.type if isinstance(reference, torch.Tensor) else "cpu"
    return maybe_autocast_dtype(device_type=dev, default_dtype=default)


def get_fused_normalization_quantizer(quantizer: Quantizer | None) -> Quantizer | None:
    """TE: the quantizers the fused normalization kernels write (others give a high-precision output)."""
    kinds = (Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, Float8BlockQuantizer, NVFP4Quantizer)
    return quantizer if isinstance(quantizer, kinds) else None


def validate_or_alloc_output(
    buffer: torch.Tensor | None, shape: Any, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """TE ``_common.validate_or_alloc_output``: the caller's buffer, checked, or a new one."""
    shape = tuple(shape)
    if buffer is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(buffer.shape) != shape:
        raise ValueError(f"Output buffer shape {tuple(buffer.shape)} does not match {shape}.")
    if buffer.dtype != dtype:
        raise ValueError(f"Output buffer dtype {buffer.dtype} does not match {dtype}.")
    if buffer.device != device:
        raise ValueError(f"Output buffer device {buffer.device} does not match {device}.")
    if not buffer.is_contiguous():
        raise ValueError("Output buffer must be contiguous.")
    if buffer.requires_grad:
        raise ValueError("Output buffer must not require gradient.")
    return buffer


def get_main_grad_from_param(weight_param: torch.nn.Parameter, *, op_label: str = "") -> torch.Tensor:
    """TE: the ``main_grad`` the wgrad GEMM writes into (refreshed from FSDP when it owns it)."""
    if hasattr(weight_param, "__fsdp_param__"):
        weight_param.main_grad = weight_param.get_main_grad()
    if getattr(weight_param, "main_grad", None) is None:
        prefix = f"{op_label} " if op_label else ""
        raise RuntimeError(
            f"{prefix}operation is configured with accumulate_into_main_grad=True, "
            "but weight parameter does not have a valid main_grad attribute"
        )
    return weight_param.main_grad


def get_accumulate_flag_in_param(weight_param: torch.nn.Parameter) -> bool:
    """TE: accumulate into ``main_grad`` unless the parameter says ``overwrite_main_grad=True``."""
    return not getattr(weight_param, "overwrite_main_grad", False)


def get_dummy_wgrads_for_params(weight_params: list) -> list:
    """TE: for parameters with ``grad_added_to_main_grad`` set it and return a dummy ``.grad``
    (zeroed with ``zero_out_wgrad``); None for the others."""
    from ..module.base import get_dummy_wgrad

    out: list = []
    for p in weight_params:
        if hasattr(p, "grad_added_to_main_grad"):
            p.grad_added_to_main_grad = True
            out.append(get_dummy_wgrad(list(p.size()), p.dtype, zero=getattr(p, "zero_out_wgrad", False)))
        else:
            out.append(None)
    return out


def view_main_grad_as_grouped_buffer(
    main_grad: torch.Tensor, num_groups: int, weight_shape: tuple[int, ...], *, label: str = ""
) -> torch.Tensor:
    """TE: ``main_grad`` viewed as ``(num_groups, *weight_shape)`` without a copy."""
    shape = (num_groups, *weight_shape)
    if tuple(main_grad.shape) == shape:
        return main_grad
    prefix = f"{label} " if label else "Grouped weight "
    if main_grad.numel() != math.prod(shape):
        raise RuntimeError(
            f"{prefix}main_grad expected shape {shape} or matching numel, but got shape {tuple(main_grad.shape)}"
        )
    try:
        return main_grad.view(shape)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{prefix}main_grad must be viewable as {shape} without copy, but got shape "
            f"{tuple(main_grad.shape)} and stride {tuple(main_grad.stride())}"
        ) from exc
