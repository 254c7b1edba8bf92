"""``qfactory`` functions that reproduce the built-in recipes' defaults through ``CustomRecipe`` (TE
2.20.0.dev0 ``pytorch/custom_recipes/quantizer_factories.py``): a starting point for overriding one
layer or one tensor type.  Each takes a ``QuantizerRole`` (or ``None``: a slot of unknown consumer)."""

from __future__ import annotations

from typing import Any

from ..constants import DType

__all__ = [
    "high_precision_factory",
    "delayed_scaling_factory",
    "current_scaling_factory",
    "float8_block_scaling_factory",
    "mxfp8_factory",
    "nvfp4_factory",
]


def _linear_role(role: Any, tensor_type: str) -> bool:
    return role is not None and role.module_type in ("linear", "grouped_linear") and role.tensor_type == tensor_type


def high_precision_factory(role: Any) -> Any:
    """Every slot an ``IdentityQuantizer``: all GEMMs in the activation dtype, nothing quantized."""
    from ..tensor import IdentityQuantizer

    return IdentityQuantizer()


def delayed_scaling_factory(role: Any) -> Any:
    """``DelayedScaling()``'s defaults: a ``DelayedScalingRequest`` (HYBRID, history 1024) for every slot."""
    from ...recipe import Format
    from ..quantization import DelayedScalingRequest

    return DelayedScalingRequest(fp8_format=Format.HYBRID)


def current_scaling_factory(role: Any) -> Any:
    """``Float8CurrentScaling()``'s defaults: E5M2 for a ``grad_output`` slot, else E4M3; no power-of-two
    scales, amax epsilon 0."""
    from ..tensor import Float8CurrentScalingQuantizer

    grad = role is not None and role.tensor_type == "grad_output"
    return Float8CurrentScalingQuantizer(
        fp8_dtype=DType.kFloat8E5M2 if grad else DType.kFloat8E4M3, force_pow_2_scales=False, amax_epsilon=0.0
    )


def float8_block_scaling_factory(role: Any) -> Any:
    """``Float8BlockScaling()``'s defaults: E4M3, power-of-two scales, 128x128 blocks for a linear weight
    and 1x128 for everything else."""
    from ..tensor import Float8BlockQuantizer

    return Float8BlockQuantizer(
        fp8_dtype=DType.kFloat8E4M3,
        rowwise=True,
        columnwise=True,
        amax_epsilon=0.0,
        force_pow_2_scales=True,
        block_scaling_dim=2 if _linear_role(role, "weight") else 1,
    )


def mxfp8_factory(role: Any) -> Any:
    """``MXFP8BlockScaling()``'s defaults: E4M3 elements, E8M0 scales per 32."""
    from ..tensor import MXFP8Quantizer

    return MXFP8Quantizer(fp8_dtype=DType.kFloat8E4M3)


def nvfp4_factory(role: Any) -> Any:
    """``NVFP4BlockScaling()``'s defaults: a linear weight in 16x16 tiles without RHT; a linear
    ``grad_output`` with RHT and stochastic rounding; every other slot with RHT."""
    from ..tensor import NVFP4Quantizer

    weight, grad = _linear_role(role, "weight"), _linear_role(role, "grad_output")
    return NVFP4Quantizer(
        fp4_dtype=DType.kFloat4E2M1,
        with_rht=not weight,
        with_post_rht_amax=not weight,
        with_2d_quantization=weight,
        stochastic_rounding=grad,
        with_random_sign_mask=True,
    )
