"""TE's fusible operations, emulated (TE 2.20.0.dev0 ``transformer_engine.pytorch.ops``; TE calls the API
experimental).

Build a model from basic ops (``BasicLinear``, ``Bias``, ``LayerNorm``, ``RMSNorm``, activations,
``Quantize``, tensor-parallel collectives, ...) in a :class:`Sequential`; the operation fuser runs runs of
them as one autograd function and applies TE's fusions where TE applies them, with TE's numerics
(a fused producer writes its float32 result straight into the next op's quantizer; a fused GEMM adds
bias / residual in its float32 epilogue).  Userbuffers fusions and the fusible ``GroupedLinear`` need CUDA
and are refused.  See ``docs/te_ops.md``.
"""

from . import fused
from .basic import (
    GEGLU,
    GELU,
    GLU,
    QGEGLU,
    QGELU,
    AddExtraInput,
    AllGather,
    AllReduce,
    BasicLinear,
    Bias,
    ClampedSwiGLU,
    ConstantScale,
    Dropout,
    GroupedLinear,
    Identity,
    L2Normalization,
    LayerNorm,
    MakeExtraOutput,
    Quantize,
    ReduceScatter,
    ReGLU,
    ReLU,
    Reshape,
    RMSNorm,
    ScaledClampedQGeGLU,
    ScaledSiTUGLU,
    ScaledSReLU,
    ScaledSwiGLU,
    SiLU,
    SiTUGLU,
    SReGLU,
    SReLU,
    SwiGLU,
    is_op_fuser_grouped_tensor_path_supported,
)
from .fuser import register_backward_fusion, register_forward_backward_fusion, register_forward_fusion
from .linear import Linear
from .op import BasicOperation, FusedOperation, FusibleOperation
from .sequential import Sequential

__all__ = [
    "Sequential",
    "Linear",
    "BasicOperation",
    "FusedOperation",
    "FusibleOperation",
    "register_forward_fusion",
    "register_backward_fusion",
    "register_forward_backward_fusion",
    "fused",
    "AddExtraInput",
    "AllGather",
    "AllReduce",
    "BasicLinear",
    "Bias",
    "ClampedSwiGLU",
    "ConstantScale",
    "Dropout",
    "GEGLU",
    "GELU",
    "GLU",
    "GroupedLinear",
    "Identity",
    "L2Normalization",
    "LayerNorm",
    "MakeExtraOutput",
    "QGEGLU",
    "QGELU",
    "Quantize",
    "ReduceScatter",
    "ReGLU",
    "ReLU",
    "Reshape",
    "RMSNorm",
    "ScaledClampedQGeGLU",
    "ScaledSiTUGLU",
    "ScaledSReLU",
    "ScaledSwiGLU",
    "SiLU",
    "SiTUGLU",
    "SReGLU",
    "SReLU",
    "SwiGLU",
    "is_op_fuser_grouped_tensor_path_supported",
]
