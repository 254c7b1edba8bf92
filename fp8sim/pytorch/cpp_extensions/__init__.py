"""TE's ``transformer_engine.pytorch.cpp_extensions``: the GEMM entry point ``general_gemm``."""

from .gemm import general_gemm, validate_gemm_scale

__all__ = ["general_gemm", "validate_gemm_scale"]
