"""The normalization in front of a GEMM (``LayerNormLinear``, ``LayerNormMLP``), as TE fuses it.

Under delayed scaling TE's LayerNorm/RMSNorm kernel quantizes its float32 output straight to FP8
(amax on the float32 values) unless the norm output is returned; under current scaling, MXFP8 and
the others the output is rounded to the activation dtype first (``module/layernorm_linear.py``:
``with_quantized_norm``; spec 0 "fused producers").  The same holds for the activation in front
of ``fc2``.
"""

from __future__ import annotations

from typing import Any

import torch

from ...recipe import CustomRecipe, DelayedScaling
from ..quantization import current_state, get_recipe
from ._normalization import normalize

__all__ = ["fused_producer", "norm_for_gemm"]


def fused_producer(return_output: bool = False, norm_of: Any = None) -> bool:
    """True when the producer's float32 result goes straight into the FP8 quantization.  ``norm_of``: the
    module whose norm this is; under a ``CustomRecipe`` its first GEMM's input slot decides, as TE's
    ``with_quantized_norm`` hands that quantizer to the norm kernel, which fuses a delayed-scaling
    ``Float8Quantizer`` only (an activation is never fused under a custom recipe: ``layernorm_mlp.py:645``)."""
    st = current_state()
    if not st.enabled or return_output:
        return False
    recipe = get_recipe()
    if isinstance(recipe, CustomRecipe) and norm_of is not None:
        from ..tensor import Float8Quantizer

        norm_of._init_fp8_metadata(recipe, st.group)  # TE prepare_forward, before the norm
        return isinstance(next(iter(norm_of.fp8_gemms.values())).custom[0][0], Float8Quantizer)
    return isinstance(recipe, DelayedScaling) and getattr(recipe, "backward_override", None) is None


def norm_for_gemm(
    module: Any, inp: torch.Tensor, return_output: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.dtype, bool]:
    """``(gemm_input, ln_out, act_dtype, fused)``: the normalized input (float32 when ``fused``),
    the norm output in the activation dtype, and the activation dtype."""
    act = module._activation_dtype(inp)
    fused = fused_producer(return_output, module)
    with torch.autocast(inp.device.type, enabled=False):
        w = module.layer_norm_weight.to(act)  # TE casts the norm parameters to the activation dtype
        b = None if module.layer_norm_bias is None else module.layer_norm_bias.to(act)
        ln32 = normalize(inp.to(act), w, b, module.eps, module.normalization, module.zero_centered_gamma)
    ln = ln32.to(act)
    return (ln32 if fused else ln), ln, act, fused
