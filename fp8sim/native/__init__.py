"""Native evidence: capture results on real hardware and compare them with the emulator, and infer the
rule (rounding, format, saturation; accumulator) that explains a captured output."""

from ._inference import Candidate, Inference
from .compare import CompareResult, OpResult, accumulator_for, cast_convention_for, compare_capture
from .fileformat import CaptureFileError, read_bundle, write_bundle
from .infer_gemm import infer_accumulator
from .infer_rounding import infer_rule
from .suite import GemmCase, gemm_cases, gemm_operands, input_set

__all__ = [
    "CaptureFileError",
    "CompareResult",
    "OpResult",
    "accumulator_for",
    "cast_convention_for",
    "compare_capture",
    "infer_rule",
    "infer_accumulator",
    "Inference",
    "Candidate",
    "read_bundle",
    "write_bundle",
    "GemmCase",
    "gemm_cases",
    "gemm_operands",
    "input_set",
]
