"""Emulated FP8 GEMM: tensor-core instruction models and ``scaled_mm``."""

from .instructions import INSTRUCTION_MODELS, InstructionModel, dot_add, get_instruction_model

__all__ = ["INSTRUCTION_MODELS", "InstructionModel", "dot_add", "get_instruction_model"]
