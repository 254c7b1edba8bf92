"""A TE quantized tensor passed into ``Linear``: its own codes and scales are the GEMM operand.

TE ``module/linear.py`` (2.20, d0067d0) ``_linear_forward_impl``, without an input all-gather (lines
421-437): an input that is a ``QuantizedTensorStorage`` gets ``update_usage(rowwise_usage=True)`` and goes
into the fprop GEMM as it is; only other inputs meet the INPUT quantizer.  Whatever its type: the GEMM
(``common/gemm/cublaslt_gemm.cu`` 106-111, ``CanonicalizeGemmInput``) then refuses operands whose scaling
modes differ (1D and 2D FP8 block scaling mix; 2D by 2D is refused at 580-582).  The backward's wgrad reads
the same tensor's columnwise copy (``linear.py`` 954-958: "already quantized", kept; 1175-1177:
``update_usage(columnwise_usage=True)``), which the tensor makes from its rowwise copy where TE can (2D
tiles) or TE's error.  The per-tensor ``Float8Tensor`` takes the FP8 hand-off path (``_fp8_handoff``).
"""

from __future__ import annotations

from typing import Any

from ...recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)
from ._operands import Operand, operand_of_tensor

__all__ = ["scaling_mode", "recipe_weight_mode", "check_input_scaling", "input_operand"]

_DELAYED, _MX, _NVFP4 = "NVTE_DELAYED_TENSOR_SCALING", "NVTE_MXFP8_1D_SCALING", "NVTE_NVFP4_1D_SCALING"
_BLOCK_1D, _BLOCK_2D = "NVTE_BLOCK_SCALING_1D", "NVTE_BLOCK_SCALING_2D"


def scaling_mode(t: Any) -> str | None:
    """TE's ``NVTEScalingMode`` name of a quantized tensor (``transformer_engine.cpp`` ``to_string``), or
    None for a tensor that is not one of the four FP8/FP4 storages."""
    from ..tensor import (
        Float8BlockwiseQTensorStorage,
        Float8TensorStorage,
        MXFP8TensorStorage,
        NVFP4TensorStorage,
    )

    if isinstance(t, Float8TensorStorage):  # delayed and current scaling share the mode
        return _DELAYED
    if isinstance(t, MXFP8TensorStorage):
        return _MX
    if isinstance(t, Float8BlockwiseQTensorStorage):
        return _BLOCK_2D if t._is_2D_scaled else _BLOCK_1D
    if isinstance(t, NVFP4TensorStorage):
        return _NVFP4
    return None


def recipe_weight_mode(recipe: Recipe) -> str | None:
    """The scaling mode of the weight operand the recipe's WEIGHT quantizer makes (Float8BlockScaling:
    ``w_block_scaling_dim``); None for a recipe whose quantizers are the user's (``CustomRecipe``)."""
    if isinstance(recipe, (DelayedScaling, Float8CurrentScaling)):
        return _DELAYED
    if isinstance(recipe, MXFP8BlockScaling):
        return _MX
    if isinstance(recipe, Float8BlockScaling):
        return _BLOCK_2D if recipe.w_block_scaling_dim == 2 else _BLOCK_1D
    if isinstance(recipe, NVFP4BlockScaling):
        return _NVFP4
    return None


def check_input_scaling(inp: Any, recipe: Recipe) -> bool:
    """Whether ``inp`` is a quantized tensor the fprop GEMM takes as it is under ``recipe``; raises TE's GEMM
    error where its scaling mode does not meet the weight's (A: the weight, B: the input, as TE's
    ``general_gemm(weightmat, inputmat_total)``)."""
    mode = scaling_mode(inp)
    if mode is None:
        return False
    weight = recipe_weight_mode(recipe)
    if weight is None:
        raise NotImplementedError(
            f"fp8sim: a {type(inp).__name__} input to a GEMM module under {type(recipe).__name__} is not emulated "
            "(TE uses it as it is beside the custom quantizers' weight)"
        )
    blocks = (_BLOCK_1D, _BLOCK_2D)
    if mode != weight and not (mode in blocks and weight in blocks):
        raise RuntimeError(
            "Inputs A and B to GEMM need to have compatible scaling modes, but got "
            f"A.scaling_mode = {weight}, B.scaling_mode = {mode}"
        )
    if mode == weight == _BLOCK_2D:
        raise RuntimeError("Only 1D by 1D, 1D by 2D, and 2D by 1D block scaling GEMM is supported, but got 2D by 2D")
    variant = getattr(recipe, "fp8sim_nvfp4_variant", "e4m3x16")
    if mode == _NVFP4 and variant != "e4m3x16":
        raise NotImplementedError(
            f"fp8sim: an NVFP4Tensor input (E4M3 scales per 16) beside fp8sim_nvfp4_variant={variant!r} weights "
            "is not emulated"
        )
    return True


def input_operand(t: Any, columnwise: bool) -> Operand:
    """The operand of the quantized input ``t`` in its 2-D view: the rowwise copy for fprop (TE
    ``update_usage(rowwise_usage=True)``), the columnwise copy for wgrad (``update_usage(columnwise_usage=True)``:
    made from the rowwise copy where the tensor can, else the tensor's error)."""
    if columnwise:
        t.update_usage(columnwise_usage=True)
    else:
        t.update_usage(rowwise_usage=True)
    return operand_of_tensor(t, columnwise)
