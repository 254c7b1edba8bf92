"""torchao float8 training (spec 6.1, 6.2), emulated bit for bit without torchao.

``convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("rowwise"))`` swaps
``nn.Linear`` modules for :class:`Float8Linear`, whose forward and backward GEMMs reproduce
torchao 0.18's float8 arithmetic (``emulate=True`` by default; fp8sim tensor-core accumulators via
``accumulator=``).  The config classes keep torchao's names, defaults and messages.  Needs torch.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("fp8sim.torchao needs torch (pip install torch); torchao itself is not required") from exc

from .config import (
    CastConfig,
    Float8GemmConfig,
    Float8LinearConfig,
    Float8LinearRecipeName,
    ScalingGranularity,
    ScalingType,
    e4m3_dtype,
    e5m2_dtype,
)
from .float8_linear_utils import convert_to_float8_training, swap_linear_layers
from .fsdp import WeightWithDynamicFloat8CastTensor, precompute_float8_dynamic_scale_for_fsdp
from .linear import Float8Linear

__all__ = [
    "ScalingType",
    "ScalingGranularity",
    "CastConfig",
    "Float8GemmConfig",
    "Float8LinearRecipeName",
    "Float8LinearConfig",
    "Float8Linear",
    "convert_to_float8_training",
    "swap_linear_layers",
    "e4m3_dtype",
    "e5m2_dtype",
    "WeightWithDynamicFloat8CastTensor",
    "precompute_float8_dynamic_scale_for_fsdp",
]

# MXFP8 training (torchao prototype/moe_training), issue 17
from .mx_linear import (  # noqa: E402
    KernelPreference,
    MXFP8Linear,
    MXFP8TrainingOpConfig,
    MXFP8TrainingRecipe,
    ScaleCalculationMode,
    convert_to_mxfp8_training,
)

__all__ += [
    "KernelPreference",
    "ScaleCalculationMode",
    "MXFP8TrainingRecipe",
    "MXFP8TrainingOpConfig",
    "MXFP8Linear",
    "convert_to_mxfp8_training",
]

# MoE grouped-GEMM training (torchao prototype/moe_training), issue 17
from .moe import (  # noqa: E402
    Float8TrainingOpConfig,
    Float8TrainingRecipe,
    convert_to_moe_training,
    fp8_rowwise_grouped_mm,
    mxfp8_grouped_mm,
)

__all__ += [
    "Float8TrainingRecipe",
    "Float8TrainingOpConfig",
    "convert_to_moe_training",
    "fp8_rowwise_grouped_mm",
    "mxfp8_grouped_mm",
]

# NVFP4 training (torchao prototype/moe_training/nvfp4_training), issue 17
from .nvfp4_linear import NVFP4Linear, NVFP4TrainingConfig, convert_to_nvfp4_training, nvfp4_linear  # noqa: E402

__all__ += ["NVFP4TrainingConfig", "NVFP4Linear", "nvfp4_linear", "convert_to_nvfp4_training"]
