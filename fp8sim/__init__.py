"""fp8sim: a bit-exact, hardware-agnostic FP8 emulator and numerics simulator.

``import fp8sim`` needs only numpy and ml_dtypes; torch is imported where it is used.
"""

from __future__ import annotations

from ._util import moved as _moved
from .cast import ROUNDING_MODES, decode, encode, quantize
from .cast.conventions import CONVENTIONS, Convention, get_convention
from .formats import (
    E2M1,
    E2M3,
    E3M2,
    E4M3,
    E4M3FNUZ,
    E5M2,
    E5M2FNUZ,
    E8M0,
    FORMATS,
    UE5M3,
    FloatFormat,
    format_names,
    get_format,
)

__version__ = "0.1.0"

_moved.install()  # old module paths (fp8sim.shim, fp8sim.study, fp8sim.distributed, ...) keep importing


def __getattr__(name: str) -> object:
    return _moved.attribute(__name__, name)


__all__ = [
    "FloatFormat",
    "FORMATS",
    "get_format",
    "format_names",
    "E4M3",
    "E5M2",
    "E8M0",
    "UE5M3",
    "E4M3FNUZ",
    "E5M2FNUZ",
    "E2M1",
    "E2M3",
    "E3M2",
    "encode",
    "decode",
    "quantize",
    "ROUNDING_MODES",
    "Convention",
    "CONVENTIONS",
    "get_convention",
    "__version__",
]
