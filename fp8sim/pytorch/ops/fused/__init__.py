"""Fused operations (TE 2.20.0.dev0 ``pytorch/ops/fused/``), registered with the operation fuser in TE's
order: forward ``UserbuffersForwardLinear``, ``ForwardLinearBiasAdd``, ``ForwardLinearBiasActivation``,
``ForwardLinearScaleAdd``; backward ``UserbuffersBackwardLinear``, ``BackwardLinearAdd``,
``BackwardLinearScale``, ``BackwardActivationBias``, ``BackwardAddRMSNorm``."""

from ..fuser import register_backward_fusion, register_forward_fusion
from .backward_activation_bias import BackwardActivationBias
from .backward_add_rmsnorm import BackwardAddRMSNorm
from .backward_linear_add import BackwardLinearAdd
from .backward_linear_scale import BackwardLinearScale
from .forward_linear_bias_activation import ForwardLinearBiasActivation
from .forward_linear_bias_add import ForwardLinearBiasAdd
from .forward_linear_scale_add import ForwardLinearScaleAdd
from .grouped_mlp import GroupedMLP_CuTeGEMMGLU, GroupedMLP_CuTeGEMMUnary
from .userbuffers_backward_linear import UserbuffersBackwardLinear
from .userbuffers_forward_linear import UserbuffersForwardLinear

__all__ = [
    "BackwardActivationBias",
    "BackwardAddRMSNorm",
    "BackwardLinearAdd",
    "BackwardLinearScale",
    "ForwardLinearBiasActivation",
    "ForwardLinearBiasAdd",
    "ForwardLinearScaleAdd",
    "UserbuffersBackwardLinear",
    "UserbuffersForwardLinear",
    "GroupedMLP_CuTeGEMMGLU",
    "GroupedMLP_CuTeGEMMUnary",
]

register_forward_fusion(UserbuffersForwardLinear.fuse_forward_ops)
register_forward_fusion(ForwardLinearBiasAdd.fuse_forward_ops)
register_forward_fusion(ForwardLinearBiasActivation.fuse_forward_ops)
register_forward_fusion(ForwardLinearScaleAdd.fuse_forward_ops)
register_backward_fusion(UserbuffersBackwardLinear.fuse_backward_ops)
register_backward_fusion(BackwardLinearAdd.fuse_backward_ops)
register_backward_fusion(BackwardLinearScale.fuse_backward_ops)
register_backward_fusion(BackwardActivationBias.fuse_backward_ops)
register_backward_fusion(BackwardAddRMSNorm.fuse_backward_ops)
