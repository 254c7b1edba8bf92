"""TE's ``transformer_engine.pytorch.constants``: the ``DType`` tags, torch dtype maps, FP8 meta
indices, and the recipe-to-dtype helpers of ``quantization.py`` (``get_fp8_torch_dtype`` ...).

Values are TE's (``common/include/transformer_engine/transformer_engine.h`` ``enum class DType``;
``pytorch/csrc/common.h`` ``FP8FwdTensors`` / ``FP8BwdTensors``), so integers stored by TE code
mean the same here.
"""

from __future__ import annotations

import enum
from types import SimpleNamespace

import torch

from ..recipe import Format, Recipe

__all__ = [
    "DType",
    "TE_DType",
    "TE_DType_To_Torch",
    "FP8FwdTensorIdx",
    "FP8BwdTensorIdx",
    "AttnMaskTypes",
    "AttnTypes",
    "AttnBiasTypes",
    "QKVLayouts",
    "LayerTypes",
    "GemmParallelModes",
    "dist_group_type",
    "MXFP8_BLOCK_SCALING_SIZE",
    "NVFP4_BLOCK_SCALING_SIZE",
    "get_fp8_torch_dtype",
    "get_fp8_te_dtype",
    "get_fp4_te_dtype",
    "get_fp8_max",
]


class DType(enum.IntEnum):
    """TE's dtype tags (the backend enum's values; the pybind enum binds these members)."""

    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10

    @classmethod
    def cast(cls, dtype: DType | int) -> DType:
        """A ``DType`` (or an enum with the same integer value) as a ``DType``."""
        return dtype if isinstance(dtype, cls) else cls(int(dtype))


TE_DType: dict[torch.dtype, DType] = {
    torch.uint8: DType.kByte,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
    torch.int32: DType.kInt32,
    torch.float32: DType.kFloat32,
    torch.half: DType.kFloat16,
    torch.bfloat16: DType.kBFloat16,
}
TE_DType_To_Torch: dict[DType, torch.dtype] = {v: k for k, v in TE_DType.items()}

FP8FwdTensorIdx = SimpleNamespace(
    GEMM1_INPUT=0, GEMM1_WEIGHT=1, GEMM1_OUTPUT=2, GEMM2_INPUT=3, GEMM2_WEIGHT=4, GEMM2_OUTPUT=5, GEMM3_OUTPUT=8
)
FP8BwdTensorIdx = SimpleNamespace(
    GRAD_OUTPUT1=0, GRAD_INPUT1=1, GRAD_OUTPUT2=2, GRAD_INPUT2=3, GRAD_OUTPUT3=4, GRAD_INPUT3=5
)

AttnMaskTypes = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
AttnTypes = ("self", "cross")
AttnBiasTypes = ("pre_scale_bias", "post_scale_bias", "no_bias", "alibi")
QKVLayouts = tuple(
    "sb3hd sbh3d sbhd_sb2hd sbhd_sbh2d sbhd_sbhd_sbhd bs3hd bsh3d bshd_bs2hd bshd_bsh2d bshd_bshd_bshd "
    "t3hd th3d thd_t2hd thd_th2d thd_thd_thd sbhd_bshd_bshd bshd_sbhd_sbhd thd_bshd_bshd thd_sbhd_sbhd "
    "paged_kv_bshd_bshd_bshd paged_kv_bshd_sbhd_sbhd paged_kv_sbhd_bshd_bshd paged_kv_sbhd_sbhd_sbhd "
    "paged_kv_thd_bshd_bshd paged_kv_thd_sbhd_sbhd".split()
)
LayerTypes = ("encoder", "decoder")
GemmParallelModes = ("row", "column", None)
dist_group_type = getattr(getattr(torch, "distributed", None), "ProcessGroup", object)

MXFP8_BLOCK_SCALING_SIZE = 32
NVFP4_BLOCK_SCALING_SIZE = 16


def _e4m3(recipe: Recipe, fprop_tensor: bool) -> bool:
    fmt = recipe.fp8_format
    return fmt == Format.E4M3 or (fmt == Format.HYBRID and fprop_tensor)


def get_fp8_torch_dtype(fp8_recipe: Recipe, fprop_tensor: bool = True) -> torch.dtype:
    """``torch.float8_e4m3fn`` for E4M3 recipes and HYBRID forward tensors, else ``torch.float8_e5m2``."""
    return torch.float8_e4m3fn if _e4m3(fp8_recipe, fprop_tensor) else torch.float8_e5m2


def get_fp8_te_dtype(fp8_recipe: Recipe, fprop_tensor: bool = True) -> DType:
    """The ``DType`` of :func:`get_fp8_torch_dtype`."""
    return DType.kFloat8E4M3 if _e4m3(fp8_recipe, fprop_tensor) else DType.kFloat8E5M2


def get_fp4_te_dtype(fp4_recipe: Recipe) -> DType:
    """``DType.kFloat4E2M1`` for an E2M1 recipe."""
    if fp4_recipe.fp4_format == Format.E2M1:
        return DType.kFloat4E2M1
    raise ValueError(f"Unsupported FP4 format: {fp4_recipe.fp4_format}")


def get_fp8_max(fp8_recipe: Recipe, fprop_tensor: bool = True) -> int:
    """The FP8 maximum as TE's Python number: 448 (E4M3) or 57344 (E5M2)."""
    return Format.E4M3.value.max_fwd if _e4m3(fp8_recipe, fprop_tensor) else Format.E5M2.value.max_fwd
