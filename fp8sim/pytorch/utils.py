"""TE ``transformer_engine/pytorch/utils.py``: initialisers and the device probes, answered for the
emulated device.

The emulated device is picked by ``FP8SIM_TE_DEVICE`` ("hopper": compute capability 9.0, the
default; "ada": 8.9; "blackwell": 10.0), read at each call; the probes apply TE's own rules to its
compute capability (the CUDA and cuBLASLt versions are taken as new enough).  fp8sim runs every
recipe on any emulated device; the probes only say what TE would say there.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "resolve_grouped_linear_single_param_flags",
    "init_method_normal",
    "init_method_constant",
    "scaled_init_method_normal",
    "attention_mask_func",
    "get_default_init_method",
    "get_device_compute_capability",
    "is_bf16_available",
    "is_bf16_compatible",
    "is_non_tn_fp8_gemm_supported",
    "EMULATED_DEVICES",
]

EMULATED_DEVICES = {"ada": (8, 9), "hopper": (9, 0), "blackwell": (10, 0)}


def get_device_compute_capability() -> tuple[int, int]:
    """The compute capability of the emulated device (``FP8SIM_TE_DEVICE``, default hopper: (9, 0))."""
    name = os.getenv("FP8SIM_TE_DEVICE", "hopper").strip().lower()
    if name not in EMULATED_DEVICES:
        raise ValueError(f"FP8SIM_TE_DEVICE={name!r} is not an emulated device; known: {', '.join(EMULATED_DEVICES)}")
    return EMULATED_DEVICES[name]


def is_bf16_compatible() -> bool:
    """TE: compute capability 8.0 or higher."""
    return get_device_compute_capability()[0] >= 8


def is_bf16_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """TE ``is_bf16_available``: ``(available, reason)`` with ``return_reason``."""
    available = is_bf16_compatible()
    if not return_reason:
        return available
    return available, "" if available else "BF16 support requires a GPU with compute capability 8.0 or higher."


def is_non_tn_fp8_gemm_supported() -> bool:
    """TE: FP8 GEMMs take non-TN layouts on capability [10.0, 12.0) and >= 13.0."""
    cc = get_device_compute_capability()
    return (10, 0) <= cc < (12, 0) or cc >= (13, 0)


def get_default_init_method() -> Callable[[torch.Tensor], Any]:
    """TE's default weight initialisation: ``N(0, 0.023)`` (``utils.get_default_init_method``)."""
    return init_method_normal(0.023)


def init_method_normal(sigma: float) -> Callable[[torch.Tensor], Any]:
    """TE ``utils.init_method_normal``: ``init_(t)`` fills ``t`` from ``N(0, sigma)``."""

    def init_(tensor: torch.Tensor) -> Any:
        return torch.nn.init.normal_(tensor, mean=0.0, std=sigma)

    return init_


def init_method_constant(val: float) -> Callable[[torch.Tensor], Any]:
    """TE ``utils.init_method_constant``: fills with ``val``."""

    def init_(tensor: torch.Tensor) -> Any:
        return torch.nn.init.constant_(tensor, val)

    return init_


def scaled_init_method_normal(sigma: float, num_layers: int) -> Callable[[torch.Tensor], Any]:
    """TE ``utils.scaled_init_method_normal``: ``init_(t)`` fills ``t`` from ``N(0, sigma / sqrt(2 * num_layers))``."""
    std = sigma / math.sqrt(2.0 * num_layers)

    def init_(tensor: torch.Tensor) -> Any:
        return torch.nn.init.normal_(tensor, mean=0.0, std=std)

    return init_


def attention_mask_func(attention_scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """TE ``utils.attention_mask_func``: fills the masked (True) scores with -10000.0, in place."""
    attention_scores.masked_fill_(attention_mask, -10000.0)
    return attention_scores


def resolve_grouped_linear_single_param_flags(
    single_grouped_weight: bool, single_grouped_bias: bool
) -> tuple[bool, bool]:
    """TE (utils.py 189-218): the flags pass only with ``NVTE_GROUPED_LINEAR_SINGLE_PARAM`` set (TE's
    experimental warning); otherwise both fall back to False with TE's warning."""
    if not (single_grouped_weight or single_grouped_bias):
        return single_grouped_weight, single_grouped_bias
    if int(os.environ.get("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "0")) <= 0:
        warnings.warn(
            f"GroupedLinear was constructed with single_grouped_weight={single_grouped_weight} "
            f"and single_grouped_bias={single_grouped_bias}, but the "
            "NVTE_GROUPED_LINEAR_SINGLE_PARAM environment variable is not set. "
            "Disabling single grouped weight/bias and falling back to per-expert parameters.",
            UserWarning,
            stacklevel=3,
        )
        return False, False
    warnings.warn(
        "GroupedLinear is using single_grouped_weight/single_grouped_bias. "
        "This feature is experimental, may change in future "
        "releases, and is known to be non-deterministic in certain cases.",
        UserWarning,
        stacklevel=3,
    )
    return single_grouped_weight, single_grouped_bias
