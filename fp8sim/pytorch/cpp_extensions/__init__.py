"""TE's ``transformer_engine.pytorch.cpp_extensions``: the GEMM entry point ``general_gemm``, and (as TE's
``from transformer_engine_torch import *``) the extension's functions fp8sim emulates."""

from .._tex import layernorm_bwd
from .gemm import general_gemm, validate_gemm_scale

__all__ = ["general_gemm", "validate_gemm_scale", "layernorm_bwd"]
