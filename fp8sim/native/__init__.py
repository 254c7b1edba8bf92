"""Native evidence: capture results on real hardware and compare them with the emulator."""

from .compare import CompareResult, OpResult, accumulator_for, cast_convention_for, compare_capture
from .fileformat import CaptureFileError, read_bundle, write_bundle
from .suite import GemmCase, gemm_cases, gemm_operands, input_set

__all__ = [
    "CaptureFileError",
    "CompareResult",
    "OpResult",
    "accumulator_for",
    "cast_convention_for",
    "compare_capture",
    "read_bundle",
    "write_bundle",
    "GemmCase",
    "gemm_cases",
    "gemm_operands",
    "input_set",
]
