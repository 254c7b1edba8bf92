"""TE's modules (``transformer_engine/pytorch/module/``): ``Linear``, ``LayerNorm``, ``RMSNorm``,
``LayerNormLinear``, ``LayerNormMLP``.

Outside ``autocast`` they are plain layers.  Inside, every GEMM quantizes its operands per the
active recipe (forward tensors in the forward format, gradients in the backward one: E5M2 under
HYBRID) and runs on the emulated GEMM.  Each GEMM owns TE's delayed-scaling state, saved in the
``state_dict`` as ``_extra_state``.
"""

from ._activations import ACTIVATIONS as _ACTIVATIONS  # noqa: F401 - the pre-restructure name
from .base import TransformerEngineBaseModule, _check_dims, _FP8Base, _GemmState  # noqa: F401
from .fp8_padding import Fp8Padding, Fp8Unpadding
from .grouped_linear import GroupedLinear, is_module_grouped_tensor_path_supported  # issue 17
from .layernorm import LayerNorm
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .rmsnorm import RMSNorm

__all__ = ["Linear", "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP", "TransformerEngineBaseModule"]
__all__ += ["GroupedLinear", "is_module_grouped_tensor_path_supported", "Fp8Padding", "Fp8Unpadding"]
