"""A module's ``quantizers`` as TE exposes them: ``{"scaling_fwd": [...], "scaling_bwd": [...]}``.

TE ``module/base.py`` builds them from the recipe state (``quantization.py`` ``RecipeState.make_quantizers``):
``3 * num_gemms`` forward slots (input, weight, output per GEMM) and ``2 * num_gemms`` backward slots
(grad_output, grad_input).  Delayed scaling gives live views of the module's state; the stateless
recipes give quantizers configured as TE configures them (NVFP4: ``NVFP4BlockScalingRecipeState.make_quantizers``,
RHT / stochastic rounding / 2D tiles from the role's ``QParams``, 4over6 from ``nvfp4_4over6``).
"""

from __future__ import annotations

from typing import Any

from ...recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
    tensor_format,
)

__all__ = ["module_quantizers"]


def _dtype(recipe: Recipe, forward: bool) -> Any:
    from ..constants import DType

    return DType.kFloat8E4M3 if tensor_format(recipe.fp8_format, forward).name == "e4m3" else DType.kFloat8E5M2


def _pick(role: str, inp: Any, weight: Any, grad: Any) -> Any:
    """TE's per-role dispatch (``_slot_tensor_type``): gradients, weights, and the rest as inputs."""
    return grad if role.startswith("grad") else weight if role == "weight" else inp


def _stateless(recipe: Recipe, forward: bool, slot: int) -> Any:
    from ..tensor import Float8BlockQuantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer

    role = ("input", "weight", "output")[slot % 3] if forward else ("grad_output", "grad_input")[slot % 2]
    dt = _dtype(recipe, forward)
    if isinstance(recipe, Float8CurrentScaling):
        if role in ("output", "grad_input"):  # TE make_quantizers: only these keep the recipe-wide setting
            return Float8CurrentScalingQuantizer(dt, force_pow_2_scales=recipe.use_power_2_scales)
        # linear.py _customize_quantizers_float8_current_scaling: input, weight, grad_output from the QParams
        qp = _pick(role, recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight, recipe.fp8_quant_bwd_grad)
        return Float8CurrentScalingQuantizer(dt, force_pow_2_scales=qp.power_2_scale, amax_epsilon=qp.amax_epsilon)
    if isinstance(recipe, MXFP8BlockScaling):
        two_d = forward and role == "weight" and getattr(recipe, "enable_2d_quantization", False)
        return MXFP8Quantizer(dt, with_2d_quantization=two_d)
    if isinstance(recipe, Float8BlockScaling):
        dim = _pick(role, recipe.x_block_scaling_dim, recipe.w_block_scaling_dim, recipe.grad_block_scaling_dim)
        qp = _pick(role, recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight, recipe.fp8_quant_bwd_grad)
        return Float8BlockQuantizer(
            dt,
            rowwise=True,
            columnwise=True,
            amax_epsilon=qp.amax_epsilon,
            force_pow_2_scales=qp.power_2_scale,
            block_scaling_dim=dim,
        )
    if isinstance(recipe, NVFP4BlockScaling):
        return _nvfp4(recipe, forward, role)
    raise NotImplementedError(f"module.quantizers for {type(recipe).__name__} is not emulated by fp8sim")


def _4over6_scope(scope: str, role: str) -> bool:
    return scope == "all" or (scope == "weights" and role == "weight") or (scope == "activations" and role != "weight")


def refuse_nvfp4_variant(recipe: Any, where: str) -> None:
    """Refuse the fp8sim extension ``fp8sim_nvfp4_variant`` where fp8sim does not carry it (``where``)."""
    variant = getattr(recipe, "fp8sim_nvfp4_variant", "e4m3x16")
    if isinstance(recipe, NVFP4BlockScaling) and variant != "e4m3x16":
        raise NotImplementedError(
            f"NVFP4BlockScaling(fp8sim_nvfp4_variant={variant!r}) runs in the modules' GEMMs only; {where} is not "
            "emulated with it (it would silently use TE's E4M3 scales per 16)"
        )


def _nvfp4(recipe: NVFP4BlockScaling, forward: bool, role: str) -> Any:
    """TE ``quantization.py`` ``NVFP4BlockScalingRecipeState.make_quantizers`` for one slot."""
    from ..tensor import NVFP4Quantizer

    refuse_nvfp4_variant(recipe, "TE's NVFP4Quantizer (te.ops, FP8 primary weights, module.quantizers)")

    qp = _pick(role, recipe.fp4_quant_fwd_inp, recipe.fp4_quant_fwd_weight, recipe.fp4_quant_bwd_grad)
    use_4over6 = forward and _4over6_scope(recipe.nvfp4_4over6, role)  # never for gradients
    e4m3_max = 448
    if use_4over6:
        if qp.random_hadamard_transform:
            raise ValueError("NVFP4 4over6 quantization does not support RHT.")
        if qp.stochastic_rounding:
            raise ValueError("NVFP4 4over6 quantization does not support stochastic rounding.")
        e4m3_max = 256 if _4over6_scope(recipe.nvfp4_4over6_e4m3_use_256, role) else 448
    return NVFP4Quantizer(
        rowwise=True,
        columnwise=True,
        with_rht=qp.random_hadamard_transform,
        with_post_rht_amax=qp.random_hadamard_transform,
        with_2d_quantization=qp.fp4_2d_quantization,
        stochastic_rounding=qp.stochastic_rounding,
        row_scaled_nvfp4=forward and role != "weight" and recipe.row_scaled_activation,
        nvfp4_use_4over6=use_4over6,
        nvfp4_e4m3_max=e4m3_max,
        nvfp4_4over6_err_mode=recipe.nvfp4_4over6_err_mode,
    )


def module_quantizers(module: Any, recipe: Recipe) -> dict[str, list]:
    """The ``quantizers`` of ``module`` under ``recipe``."""
    from ..tensor import delayed_scaling_quantizers

    gemms = list(module.fp8_gemms.values())
    if isinstance(recipe, CustomRecipe):  # the module builds them (module/_custom.py)
        return module._custom_quantizers(recipe)
    if isinstance(recipe, DelayedScaling):
        for g in gemms:
            g.ensure(recipe)
        return {
            "scaling_fwd": [q for g in gemms for q in delayed_scaling_quantizers(g.fwd)],
            "scaling_bwd": [q for g in gemms for q in delayed_scaling_quantizers(g.bwd)],
        }
    n = len(gemms)
    return {
        "scaling_fwd": [_stateless(recipe, True, i) for i in range(3 * n)],
        "scaling_bwd": [_stateless(recipe, False, i) for i in range(2 * n)],
    }
