"""Number formats as data: one frozen record per format, everything else derived.

A code is laid out as ``[sign][exponent: ebits][mantissa: mbits]`` in its low bits (no sign bit
for unsigned formats).  ``specials`` says how the top of the code space is used:

- ``"ieee"``: the all-ones exponent holds Inf (mantissa 0) and NaN (E5M2).
- ``"fn"``: only the all-ones magnitude code is NaN; no Inf (E4M3FN, E8M0FNU, E5M3FNU).
- ``"fnuz"``: the negative-zero code is the single NaN; no Inf and no -0 (E4M3FNUZ, E5M2FNUZ).
- ``"none"``: every code is a finite number (FP4/FP6).

Semantics: ``docs/semantics.md`` section 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

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
]

Specials = Literal["ieee", "fn", "fnuz", "none"]
_SPECIALS = ("ieee", "fn", "fnuz", "none")


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format with at most 8 bits per code.

    ``subnormals=False`` means exponent field 0 encodes the normal value ``2^-bias`` (E8M0); such a
    format has no zero and, for now, must have ``mbits == 0``.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    signed: bool = True
    specials: Specials = "ieee"
    subnormals: bool = True
    ml_dtypes_name: str | None = None
    torch_name: str | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.specials not in _SPECIALS:
            raise ValueError(f"specials must be one of {', '.join(_SPECIALS)}; got {self.specials!r}")
        if self.ebits < 1 or self.mbits < 0:
            raise ValueError(f"ebits must be >= 1 and mbits >= 0; got ebits={self.ebits}, mbits={self.mbits}")
        if self.bits > 8:
            raise ValueError(f"at most 8 bits per code are supported; {self.name} has {self.bits}")
        if not self.subnormals and self.mbits != 0:
            raise ValueError("subnormals=False is supported only with mbits == 0 (E8M0-like formats)")
        if self.specials == "fnuz" and not self.signed:
            raise ValueError("specials='fnuz' needs a signed format (its NaN is the -0 code)")
        if self.specials == "ieee" and self.ebits < 2:
            raise ValueError("specials='ieee' needs ebits >= 2")
        if not isinstance(self.bias, int) or isinstance(self.bias, bool):
            raise TypeError(f"bias must be an integer; got {self.bias!r}")
        # values are decoded to float32: the largest must stay below 2^128 and the smallest at or
        # above float32's smallest subnormal 2^-149
        top_field = (self.max_code >> self.mbits) & ((1 << self.ebits) - 1)
        lo = top_field - 127
        hi = (150 - self.mbits) if self.subnormals else 149
        if not lo <= self.bias <= hi:
            raise ValueError(
                f"bias={self.bias} puts {self.name}'s values outside float32's range; "
                f"for ebits={self.ebits}, mbits={self.mbits} the bias must be in [{lo}, {hi}]"
            )

    # -- layout -----------------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Bits per code (sign + exponent + mantissa)."""
        return int(self.signed) + self.ebits + self.mbits

    @property
    def num_codes(self) -> int:
        return 1 << self.bits

    @property
    def sign_mask(self) -> int:
        """The sign bit of a code, 0 for unsigned formats."""
        return (1 << (self.bits - 1)) if self.signed else 0

    @property
    def magnitude_mask(self) -> int:
        return (1 << (self.ebits + self.mbits)) - 1

    # -- specials -----------------------------------------------------------------------------
    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "none"

    @property
    def has_zero(self) -> bool:
        return self.subnormals

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.has_zero and self.specials != "fnuz"

    @property
    def max_code(self) -> int:
        """Code of the largest finite value (positive)."""
        top = self.magnitude_mask
        if self.specials == "ieee":
            return ((1 << self.ebits) - 1 << self.mbits) - 1
        if self.specials == "fn":
            return top - 1
        return top

    @property
    def inf_code(self) -> int | None:
        """Code of +Inf, or None."""
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else None

    @property
    def nan_code(self) -> int | None:
        """The canonical (positive, quiet) NaN code that encode produces, or None."""
        if self.specials == "ieee":
            return (((1 << self.ebits) - 1) << self.mbits) | (1 << (self.mbits - 1) if self.mbits else 1)
        if self.specials == "fn":
            return self.magnitude_mask
        if self.specials == "fnuz":
            return self.sign_mask
        return None

    def is_nan_code(self, code: int) -> bool:
        """True if ``code`` decodes to NaN."""
        mag = code & self.magnitude_mask
        if self.specials == "ieee":
            return mag >> self.mbits == (1 << self.ebits) - 1 and mag & ((1 << self.mbits) - 1) != 0
        if self.specials == "fn":
            return mag == self.magnitude_mask
        if self.specials == "fnuz":
            return code == self.sign_mask
        return False

    # -- values -------------------------------------------------------------------------------
    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal value."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite value."""
        return (self.max_code >> self.mbits) - self.bias

    def code_value(self, code: int) -> float:
        """Exact value of a code as a Python float (NaN / +-Inf for specials)."""
        if not 0 <= code < self.num_codes:
            raise ValueError(f"code {code} out of range for {self.name} (0..{self.num_codes - 1})")
        if self.is_nan_code(code):
            return math.nan
        negative = bool(code & self.sign_mask)
        mag = code & self.magnitude_mask
        if self.has_inf and mag == self.inf_code:
            return -math.inf if negative else math.inf
        e, m = mag >> self.mbits, mag & ((1 << self.mbits) - 1)
        if e == 0 and self.subnormals:
            v = math.ldexp(m, self.emin - self.mbits)
        else:
            v = math.ldexp((1 << self.mbits) + m, e - self.bias - self.mbits)
        return -v if negative else v

    @property
    def max(self) -> float:
        """Largest finite value."""
        return self.code_value(self.max_code)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value (ml_dtypes ``finfo.tiny``)."""
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float | None:
        """Smallest positive subnormal value, None if the format has no subnormals."""
        return math.ldexp(1.0, self.emin - self.mbits) if self.subnormals and self.mbits else None

    @property
    def smallest_positive(self) -> float:
        """Smallest positive value (subnormal if the format has them)."""
        return self.min_subnormal or self.min_normal

    @property
    def eps(self) -> float:
        """Distance from 1.0 to the next larger value, ``2^-mbits``."""
        return math.ldexp(1.0, -self.mbits)

    # -- library dtypes -----------------------------------------------------------------------
    @property
    def ml_dtype(self) -> Any:
        """The matching ml_dtypes scalar type, or None."""
        if self.ml_dtypes_name is None:
            return None
        import ml_dtypes

        return getattr(ml_dtypes, self.ml_dtypes_name, None)

    @property
    def torch_dtype(self) -> Any:
        """The matching torch dtype, or None (no torch, or this torch lacks it)."""
        if self.torch_name is None:
            return None
        try:
            import torch
        except ImportError:
            return None
        return getattr(torch, self.torch_name, None)

    def __str__(self) -> str:
        return self.name


E4M3 = FloatFormat(
    "e4m3",
    4,
    3,
    7,
    specials="fn",
    ml_dtypes_name="float8_e4m3fn",
    torch_name="float8_e4m3fn",
    aliases=("float8_e4m3fn", "e4m3fn"),
)
E5M2 = FloatFormat(
    "e5m2", 5, 2, 15, specials="ieee", ml_dtypes_name="float8_e5m2", torch_name="float8_e5m2", aliases=("float8_e5m2",)
)
E8M0 = FloatFormat(
    "e8m0",
    8,
    0,
    127,
    signed=False,
    specials="fn",
    subnormals=False,
    ml_dtypes_name="float8_e8m0fnu",
    torch_name="float8_e8m0fnu",
    aliases=("float8_e8m0fnu", "e8m0fnu", "ue8m0"),
)
UE5M3 = FloatFormat(
    "ue5m3",
    5,
    3,
    15,
    signed=False,
    specials="fn",
    ml_dtypes_name="float8_e5m3fnu",  # ml_dtypes >= 0.7.0; CUDA's __nv_fp8_ue5m3
    torch_name="float8_e5m3fnu",  # no torch release has it yet: torch_dtype is None until one does
    aliases=("float8_e5m3fnu", "e5m3fnu"),
)
E4M3FNUZ = FloatFormat(
    "e4m3fnuz",
    4,
    3,
    8,
    specials="fnuz",
    ml_dtypes_name="float8_e4m3fnuz",
    torch_name="float8_e4m3fnuz",
    aliases=("float8_e4m3fnuz",),
)
E5M2FNUZ = FloatFormat(
    "e5m2fnuz",
    5,
    2,
    16,
    specials="fnuz",
    ml_dtypes_name="float8_e5m2fnuz",
    torch_name="float8_e5m2fnuz",
    aliases=("float8_e5m2fnuz",),
)
E2M1 = FloatFormat(
    "e2m1", 2, 1, 1, specials="none", ml_dtypes_name="float4_e2m1fn", aliases=("float4_e2m1fn", "e2m1fn", "fp4")
)
E2M3 = FloatFormat(
    "e2m3", 2, 3, 1, specials="none", ml_dtypes_name="float6_e2m3fn", aliases=("float6_e2m3fn", "e2m3fn")
)
E3M2 = FloatFormat(
    "e3m2", 3, 2, 3, specials="none", ml_dtypes_name="float6_e3m2fn", aliases=("float6_e3m2fn", "e3m2fn")
)

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (E4M3, E5M2, E8M0, UE5M3, E4M3FNUZ, E5M2FNUZ, E2M1, E2M3, E3M2)}
_BY_NAME: dict[str, FloatFormat] = {
    **{a: f for f in FORMATS.values() for a in f.aliases},
    **FORMATS,
}


def format_names() -> list[str]:
    """Every accepted format name, canonical names first."""
    return list(FORMATS) + [a for f in FORMATS.values() for a in f.aliases]


def get_format(fmt: str | FloatFormat, *, arg: str = "fmt") -> FloatFormat:
    """Resolve a format name (canonical or alias, case-insensitive) or pass a FloatFormat through.
    ``arg``: the argument's name in the messages (e.g. ``elem_format``)."""
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, str):
        found = _BY_NAME.get(fmt.lower())
        if found is not None:
            return found
        where = "" if arg == "fmt" else f" for {arg}"
        raise ValueError(f"unknown format {fmt!r}{where}; known: {', '.join(format_names())}")
    raise TypeError(f"{arg} must be a format name or a FloatFormat, got {type(fmt).__name__}")
