"""TE ``quantization.py``'s device-support answers and default recipe, for the emulated device
(``fp8sim.pytorch.utils.get_device_compute_capability``); re-exported by :mod:`fp8sim.pytorch.quantization`."""

from __future__ import annotations

from typing import Any

from ..recipe import DelayedScaling, Recipe

__all__ = [
    "check_fp8_support",
    "check_mxfp8_support",
    "check_nvfp4_support",
    "check_fp8_block_scaling_support",
    "is_fp8_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "is_fp8_block_scaling_available",
    "get_default_fp8_recipe",
    "get_default_recipe",
]


def check_fp8_support() -> tuple[bool, str]:
    """TE: FP8 needs compute capability 8.9 or higher."""
    from .utils import get_device_compute_capability

    if get_device_compute_capability() >= (8, 9):
        return True, ""
    return False, "Device compute capability 8.9 or higher required for FP8 execution."


def check_mxfp8_support() -> tuple[bool, str]:
    """TE: MXFP8 needs compute capability [10.0, 12.0)."""
    from .utils import get_device_compute_capability

    cc = get_device_compute_capability()
    if cc >= (12, 0):
        return False, "MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet."
    if cc >= (10, 0):
        return True, ""
    return False, "Device compute capability 10.0 or higher required for MXFP8 execution."


def check_nvfp4_support() -> tuple[bool, str]:
    """TE: NVFP4 needs compute capability 10.0 or higher."""
    from .utils import get_device_compute_capability

    if get_device_compute_capability() >= (10, 0):
        return True, ""
    return False, "Device compute capability 10.0 or higher required for NVFP4 execution."


def check_fp8_block_scaling_support() -> tuple[bool, str]:
    """TE: FP8 block scaling needs compute capability 9.0 or higher (and CUDA >= 12.9)."""
    from .utils import get_device_compute_capability

    if get_device_compute_capability() >= (9, 0):
        return True, ""
    return False, "FP8 block scaled GEMM requires compute capability 9.0 or higher and CUDA >= 12.9."


def _probe(check: Any, return_reason: bool) -> bool | tuple[bool, str]:
    return check() if return_reason else check()[0]


def is_fp8_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """TE ``is_fp8_available`` (delayed and current scaling) on the emulated device."""
    return _probe(check_fp8_support, return_reason)


def is_mxfp8_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """TE ``is_mxfp8_available`` on the emulated device."""
    return _probe(check_mxfp8_support, return_reason)


def is_nvfp4_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """TE ``is_nvfp4_available`` on the emulated device."""
    return _probe(check_nvfp4_support, return_reason)


def is_fp8_block_scaling_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """TE ``is_fp8_block_scaling_available`` on the emulated device."""
    return _probe(check_fp8_block_scaling_support, return_reason)


def get_default_fp8_recipe() -> Recipe:
    """TE's default recipe for the emulated device: MXFP8 where supported, current scaling on 12.0+,
    else delayed scaling."""
    from ..recipe import Float8CurrentScaling, MXFP8BlockScaling
    from .utils import get_device_compute_capability

    if check_mxfp8_support()[0]:
        return MXFP8BlockScaling()
    if get_device_compute_capability() >= (12, 0):
        return Float8CurrentScaling()
    return DelayedScaling()


def get_default_recipe() -> Recipe:
    """TE ``get_default_recipe``: :func:`get_default_fp8_recipe`."""
    return get_default_fp8_recipe()
