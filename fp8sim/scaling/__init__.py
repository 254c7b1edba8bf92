"""Scaling: recipes' state machines and block layouts over the cast core.

Modules: ``delayed`` (TE DelayedScaling state), ``current`` (TE current scaling, torchao scale
math), ``block`` (1x128 / 128x128), ``mx`` (MX with E8M0 scales), ``nvfp4``, ``packing``; every
layout returns a :class:`QuantizedData`.
"""

from .block import quantize_block_scaling
from .current import compute_scale_from_amax, quantize_current_scaling, quantize_torchao, torchao_amax_to_scale
from .delayed import DelayedScaler
from .mx import MX_ELEM_FORMATS, MX_FLAVORS, SCALE_RULES, e8m0_scale_codes, quantize_mx, quantize_mx_rowwise_columnwise
from .nvfp4 import apply_rht, dequantize_nvfp4, quantize_nvfp4, quantize_nvfp4_role, rht_matrix
from .packing import pack_fp4, pack_fp6, unpack_fp4, unpack_fp6
from .quantized import QuantizedData, _deprecated_name, expand_blocks

__all__ = [
    "QuantizedData",
    "expand_blocks",
    "DelayedScaler",
    "compute_scale_from_amax",
    "quantize_current_scaling",
    "quantize_torchao",
    "torchao_amax_to_scale",
    "quantize_block_scaling",
    "MX_ELEM_FORMATS",
    "MX_FLAVORS",
    "SCALE_RULES",
    "e8m0_scale_codes",
    "quantize_mx",
    "quantize_mx_rowwise_columnwise",
    "apply_rht",
    "dequantize_nvfp4",
    "quantize_nvfp4",
    "quantize_nvfp4_role",
    "rht_matrix",
    "pack_fp4",
    "pack_fp6",
    "unpack_fp4",
    "unpack_fp6",
]


def __getattr__(name: str) -> object:
    return _deprecated_name(__name__, name)
