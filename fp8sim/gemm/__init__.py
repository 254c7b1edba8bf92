"""Emulated FP8 GEMM: tensor-core instruction models, accumulator presets, split-K, device profiles and
``scaled_mm``."""

from .accumulators import ACCUMULATORS, Accumulator, get_accumulator
from .emulate import emulate_scaled_mm
from .instructions import INSTRUCTION_MODELS, InstructionModel, dot_add, get_instruction_model
from .profiles import PROFILES, DeviceProfile, SplitChoice, SplitKUnknownError, get_profile, is_profile
from .scaled_mm import scaled_mm
from .torch_cpu import torch_cpu_kernel

__all__ = [
    "ACCUMULATORS",
    "Accumulator",
    "get_accumulator",
    "INSTRUCTION_MODELS",
    "InstructionModel",
    "dot_add",
    "get_instruction_model",
    "scaled_mm",
    "DeviceProfile",
    "PROFILES",
    "SplitChoice",
    "SplitKUnknownError",
    "get_profile",
    "is_profile",
    "emulate_scaled_mm",
    "torch_cpu_kernel",
]
