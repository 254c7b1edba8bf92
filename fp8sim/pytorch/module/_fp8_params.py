"""FP8 primary weights (``quantized_model_init``): module weights held as TE quantized tensors.

TE ``module/base.py`` ``reset_parameters``: inside ``quantized_model_init`` each weight is quantized
by the module's weight quantizer right after its initialisation and registered as an
``nn.Parameter`` wrapping the quantized tensor; ``preserve_high_precision_init_val`` keeps a CPU
copy of the initial value behind ``get_high_precision_init_val()`` / ``clear_high_precision_init_val()``.
The forward GEMM then uses the tensor's own codes and ``scale_inv`` (nothing re-quantized).
fp8sim emulates the per-tensor recipes (delayed and current scaling); block recipes are refused.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import torch
from torch import nn

from ...cast import decode
from ...recipe import DelayedScaling, Float8CurrentScaling, Recipe, tensor_format
from ._operands import Operand

__all__ = ["quantize_primary_weights", "operand_from_fp8_weight", "is_fp8_weight"]


def is_fp8_weight(w: Any) -> bool:
    from ..tensor import QuantizedTensor

    return isinstance(w, QuantizedTensor)


def _weight_quantizer(module: Any, name: str, recipe: Recipe) -> Any:
    from ..constants import DType
    from ..tensor import Float8CurrentScalingQuantizer, delayed_scaling_quantizers

    fp8 = DType.kFloat8E4M3 if tensor_format(recipe.fp8_format, True).name == "e4m3" else DType.kFloat8E5M2
    if isinstance(recipe, DelayedScaling):
        g = module.fp8_gemms[module._gemm_of_weight(name)]
        g.ensure(recipe)
        return delayed_scaling_quantizers(g.fwd)[1]  # the WEIGHT slot of that GEMM's forward state
    if isinstance(recipe, Float8CurrentScaling):
        qp = recipe.fp8_quant_fwd_weight
        return Float8CurrentScalingQuantizer(fp8, force_pow_2_scales=qp.power_2_scale, amax_epsilon=qp.amax_epsilon)
    raise NotImplementedError(
        f"transformer_engine.pytorch.quantized_model_init with {type(recipe).__name__}: FP8 primary weights are "
        "emulated for DelayedScaling and Float8CurrentScaling only"
    )


def quantize_primary_weights(module: Any, names: list[str], recipe: Recipe, preserve: bool) -> None:
    """Replace each weight ``names[i]`` of ``module`` by an ``nn.Parameter`` of its quantized tensor
    (TE base.py ``reset_parameters``: the column-wise copy only where grad is enabled)."""
    columnwise = torch.is_grad_enabled()
    for name in names:
        hp = getattr(module, name)
        if hp.device.type == "meta":
            continue
        quantizer = _weight_quantizer(module, name, recipe)
        quantizer.set_usage(rowwise=True, columnwise=columnwise)
        with torch.no_grad():
            q = quantizer(hp.detach())
        param = nn.Parameter(q, requires_grad=hp.requires_grad)
        if preserve:
            _attach_high_precision_init_val(param, hp.detach().to("cpu", copy=True))
        module.register_parameter(name, param)


def _attach_high_precision_init_val(param: Any, value: torch.Tensor) -> None:
    """TE ``base.py`` ``_attach_high_precision_init_val``."""
    param._high_precision_init_val = value

    def get(self: Any) -> torch.Tensor | None:
        return getattr(self, "_high_precision_init_val", None)

    def clear(self: Any) -> None:
        self._high_precision_init_val = None

    param.get_high_precision_init_val = types.MethodType(get, param)
    param.clear_high_precision_init_val = types.MethodType(clear, param)


def operand_from_fp8_weight(w: Any) -> Operand:
    """The GEMM operand of an FP8 primary weight: its own codes and ``scale_inv``."""
    from ...formats import get_format
    from ..constants import DType

    fmt = get_format("e4m3" if w._fp8_dtype == DType.kFloat8E4M3 else "e5m2")
    codes = w._data.reshape(w.shape)
    return Operand(None, fmt, decode(codes, fmt), codes, float(np.float32(w._scale_inv.reshape(-1)[0].item())))
