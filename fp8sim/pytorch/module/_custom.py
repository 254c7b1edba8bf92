"""A ``CustomRecipe`` in the GEMM modules (TE 2.20.0.dev0 ``module/base.py`` ``set_meta_tensor`` with
``CustomRecipeState``, and each module's ``get_quantizer_roles``).

The module calls ``qfactory(role)`` once per slot when it first runs under a given recipe object (TE keeps
the state while ``recipe_state.recipe is recipe``): ``3 * num_gemms`` forward slots (input, weight,
output per GEMM) and ``2 * num_gemms`` backward slots (grad_output, grad_input), with TE's roles, the
output and grad-input slots ``None`` unless ``output_quantizer_role`` / ``grad_input_quantizer_role`` are
set.  Each GEMM operand is then the slot quantizer's tensor, read as cuBLAS reads it; an
``IdentityQuantizer`` slot enters the GEMM in its high-precision dtype (TE ``general_gemm`` dequantizes
it), and two such operands make a high-precision GEMM.  A custom quantizer's tensor (``.custom`` True: TE's
``NVFP4QuantizerRef``, ``CurrentScalingQuantizerRef``) goes, as in TE's ``general_gemm``, to
``custom_recipes.gemm.custom_gemm``, i.e. its quantizer's ``qgemm`` (the module's bias enters that GEMM).
``DelayedScalingRequest`` slots share one
delayed-scaling state per direction, registered in the global amax buffer as the built-in recipe's.  The
slots are rebuilt (``qfactory`` called again) when TE rebuilds them: a new recipe object, or a changed
``output_quantizer_role`` / ``grad_input_quantizer_role`` at the next ``init_fp8_meta_tensors``.
"""

from __future__ import annotations

from typing import Any

import torch

from ...recipe import CustomRecipe
from ._operands import Operand, operand_of_tensor

__all__ = ["quantizer_roles", "ensure_custom", "custom_operand"]


def quantizer_roles(module: Any, fwd: bool) -> list:
    """TE's ``get_quantizer_roles(fwd=..., num_quantizers=...)`` of ``module`` (``linear.py:1816``,
    ``layernorm_linear.py:1607``, ``grouped_linear.py:1841``, ``layernorm_mlp.py:2185`` at d0067d0)."""
    from ..tensor import QuantizerRole

    name = getattr(module, "name", None) or ""
    out_role = getattr(module, "_output_quantizer_role", None)
    gi_role = getattr(module, "_grad_input_quantizer_role", None)
    n = len(module.fp8_gemms)
    if type(module).__name__ == "LayerNormMLP":
        fc1, fc2 = (f"{name}.{g}" if name else g for g in ("fc1", "fc2"))

        def role(t: str, nm: str) -> Any:
            return QuantizerRole(module_type="linear", tensor_type=t, name=nm)

        if fwd:  # fc1's output is fc2's input: labelled by its consumer
            base = [role("input", fc1), role("weight", fc1), role("input", fc2)]
            base += [role("input", fc2), role("weight", fc2), out_role]
        else:
            base = [role("grad_output", fc1), gi_role, role("grad_output", fc2), role("grad_output", fc1)]
        count = 3 * n if fwd else 2 * n
        return [base[i % len(base)] for i in range(count)]
    mtype = "grouped_linear" if type(module).__name__ == "GroupedLinear" else "linear"
    if fwd:
        base = [
            QuantizerRole(module_type=mtype, tensor_type="input", name=name),
            QuantizerRole(module_type=mtype, tensor_type="weight", name=name),
            out_role,
        ]
    else:
        base = [QuantizerRole(module_type=mtype, tensor_type="grad_output", name=name), gi_role]
    return [base[i % len(base)] for i in range((3 if fwd else 2) * n)]


def ensure_custom(module: Any, recipe: CustomRecipe) -> dict[str, list]:
    """The module's slot quantizers for ``recipe`` (``{"scaling_fwd": [...], "scaling_bwd": [...]}``): those of
    its ``CustomRecipeState`` while that state was built for an equal recipe, else built now
    (``module/_meta_states.py``)."""
    from .._recipe_state import CustomRecipeState

    state = module._recipe_states().get("scaling_fwd")
    if not (isinstance(state, CustomRecipeState) and state.recipe == recipe):  # TE: an equal recipe keeps them
        module.init_fp8_meta_tensors(recipe)
    return dict(module.__dict__["_custom_quantizers_by_key"])


def custom_operand(quantizer: Any, x: torch.Tensor, k_axis: int) -> Operand:
    """``x`` (2-D) quantized by a slot quantizer, as the GEMM reducing over ``k_axis`` reads it."""
    from ..tensor import IdentityQuantizer
    from ..tensor.hybrid_tensor import HybridQuantizer

    if isinstance(quantizer, HybridQuantizer):  # TE general_gemm: the sub-storage of the direction this GEMM reads
        if k_axis != 0:
            return custom_operand(quantizer.rowwise_quantizer, x, k_axis)
        return custom_operand(quantizer.columnwise_quantizer, quantizer.columnwise_source_tensor(x.detach()), k_axis)
    if isinstance(quantizer, IdentityQuantizer):
        held = quantizer(x.detach())._hp_data
        return Operand(held.float(), None, high_precision=True)
    if getattr(quantizer, "custom", False):  # TE's reference quantizers: general_gemm hands them to custom_gemm
        return Operand(None, None, custom=quantizer.quantize(x.detach()))
    if not hasattr(quantizer, "quantize"):
        raise TypeError(
            f"CustomRecipe qfactory returned {type(quantizer).__name__}; fp8sim's modules take TE quantizers "
            "(Float8Quantizer, Float8CurrentScalingQuantizer, MXFP8Quantizer, Float8BlockQuantizer, "
            "NVFP4Quantizer, IdentityQuantizer), custom quantizers (.custom True) or a DelayedScalingRequest"
        )
    return operand_of_tensor(quantizer(x.detach()), k_axis == 0)
