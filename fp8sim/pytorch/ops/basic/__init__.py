"""Basic fusible operations (TE 2.20.0.dev0 ``pytorch/ops/basic/``)."""

from .activation import GEGLU, GELU, GLU, QGEGLU, QGELU, ReGLU, ReLU, ScaledSReLU, SiLU, SReGLU, SReLU
from .add_extra_input import AddExtraInput
from .all_gather import AllGather
from .all_reduce import AllReduce
from .basic_linear import BasicLinear
from .bias import Bias
from .constant_scale import ConstantScale
from .dropout import Dropout
from .grouped_linear import GroupedLinear, is_op_fuser_grouped_tensor_path_supported
from .identity import Identity
from .l2normalization import L2Normalization
from .layer_norm import LayerNorm
from .make_extra_output import MakeExtraOutput
from .quantize import Quantize
from .reduce_scatter import ReduceScatter
from .reshape import Reshape
from .rmsnorm import RMSNorm
from .swiglu import ClampedSwiGLU, ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSwiGLU, SiTUGLU, SwiGLU

__all__ = [
    "GELU",
    "GEGLU",
    "GLU",
    "QGELU",
    "QGEGLU",
    "ReLU",
    "ReGLU",
    "SReLU",
    "ScaledSReLU",
    "SReGLU",
    "SiLU",
    "AddExtraInput",
    "AllGather",
    "AllReduce",
    "BasicLinear",
    "Bias",
    "ConstantScale",
    "Dropout",
    "GroupedLinear",
    "is_op_fuser_grouped_tensor_path_supported",
    "Identity",
    "L2Normalization",
    "LayerNorm",
    "MakeExtraOutput",
    "Quantize",
    "ReduceScatter",
    "Reshape",
    "RMSNorm",
    "ClampedSwiGLU",
    "ScaledClampedQGeGLU",
    "ScaledSiTUGLU",
    "ScaledSwiGLU",
    "SiTUGLU",
    "SwiGLU",
]
