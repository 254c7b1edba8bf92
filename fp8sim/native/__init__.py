"""Native evidence: capture results on real hardware and compare them with the emulator."""

from .compare import CompareResult, OpResult, compare_capture
from .fileformat import CaptureFileError, read_bundle, write_bundle

__all__ = ["CaptureFileError", "CompareResult", "OpResult", "compare_capture", "read_bundle", "write_bundle"]
