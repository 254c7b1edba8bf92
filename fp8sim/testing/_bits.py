"""Bit patterns of arrays and tensors, read through an encoding: a narrow format, a wide IEEE dtype
or an integer dtype.  The core of ``assert_bit_exact`` and ``compare``.

Every element is held as its bit pattern (uint64).  ULP distance is the number of steps between
two patterns in the ordered sequence of the encoding's non-NaN patterns, in which -0 sits just
below +0 (formats without -0 skip it): ``ordered(p) = mag`` for a positive pattern, ``-mag - 1``
for a negative one (``-mag`` without a -0), ``p`` for unsigned formats and the value for integers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np

from ..cast import encode
from ..cast._tables import code_values
from ..formats import FORMATS, FloatFormat, get_format

_WIDE = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}
_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


@dataclass(frozen=True)
class Encoding:
    """How bit patterns are read: ``kind`` is "format" (``fmt``), "ieee" (a numpy/ml_dtypes float
    dtype of 16, 32 or 64 bits) or "int" (an integer dtype; patterns hold the value)."""

    name: str
    kind: str
    bits: int
    fmt: FloatFormat | None = None
    dtype: Any = None

    @property
    def signed(self) -> bool:
        if self.kind == "format":
            return self.fmt.signed
        return self.kind == "ieee" or np.dtype(self.dtype).kind == "i"

    @property
    def negative_zero(self) -> bool:
        return self.fmt.has_negative_zero if self.kind == "format" else self.kind == "ieee"

    @property
    def hex_digits(self) -> int:
        return -(-self.bits // 4)

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.kind == "format":
            return self.fmt.max
        if self.kind == "ieee":
            return float(ml_dtypes.finfo(self.dtype).max)
        return float(np.iinfo(self.dtype).max)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value (0 for integers)."""
        if self.kind == "format":
            return self.fmt.min_normal
        if self.kind == "ieee":
            return float(ml_dtypes.finfo(self.dtype).smallest_normal)
        return 0.0

    def describe(self) -> str:
        return f"{self.name} codes" if self.kind == "format" else f"{self.name} bit patterns"


def format_encoding(fmt: FloatFormat) -> Encoding:
    return Encoding(fmt.name, "format", fmt.bits, fmt=fmt)


# -- reading patterns ---------------------------------------------------------------------------


def values(enc: Encoding, bits: np.ndarray) -> np.ndarray:
    """float64 values of the patterns (exact; NaN for NaN patterns)."""
    if enc.kind == "format":
        return code_values(enc.fmt)[bits.astype(np.intp)]
    if enc.kind == "ieee":
        raw = bits.astype(_UINT[enc.bits]).view(enc.dtype)
        with np.errstate(invalid="ignore"):
            return raw.astype(np.float64)
    return bits.view(np.int64).astype(np.float64)


def isnan(enc: Encoding, bits: np.ndarray) -> np.ndarray:
    if enc.kind == "int":
        return np.zeros(bits.shape, bool)
    return np.isnan(values(enc, bits))


def ordered(enc: Encoding, bits: np.ndarray) -> np.ndarray:
    """int64 position of each pattern in the encoding's order (see the module docstring)."""
    if enc.kind == "int":
        return bits.view(np.int64)
    if not enc.signed:
        return bits.astype(np.int64)
    sign = np.uint64(1 << (enc.bits - 1))
    mag = (bits & (sign - np.uint64(1))).astype(np.int64)
    neg = (bits & sign) != 0
    return np.where(neg, -mag - int(enc.negative_zero), mag)


def from_ordered(enc: Encoding, pos: np.ndarray) -> np.ndarray:
    """Inverse of :func:`ordered` (signed float encodings; positions may run past the ends)."""
    sign = np.uint64(1 << (enc.bits - 1))
    lim = sign - np.uint64(1)
    neg = pos < 0
    mag = np.where(neg, -pos - int(enc.negative_zero), pos)
    mag = np.clip(mag, 0, int(min(lim, np.iinfo(np.int64).max))).astype(np.uint64)
    return np.where(neg, mag | sign, mag)


def ulp_distance(enc: Encoding, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """uint64 ``|ordered(a) - ordered(b)|`` (exact: the true difference is below 2^64)."""
    oa, ob = ordered(enc, a).view(np.uint64), ordered(enc, b).view(np.uint64)
    ge = ordered(enc, a) >= ordered(enc, b)
    return np.where(ge, oa - ob, ob - oa)


def hex_of(enc: Encoding, bit: int) -> str:
    if enc.kind == "int":
        bit &= (1 << enc.bits) - 1
    return f"0x{bit:0{enc.hex_digits}X}"


# -- inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One operand: ``bits`` under ``enc`` (the comparison encoding), and, when the caller's
    values were converted into ``enc`` (floats given with ``fmt=``), their own ``shown`` encoding and
    ``shown_bits``."""

    bits: np.ndarray
    enc: Encoding
    shown: Encoding | None = None
    shown_bits: np.ndarray | None = None


def to_numpy(x: Any, arg: str) -> np.ndarray:
    """``x`` as a numpy array; torch tensors (any device) are moved to the CPU, keeping their bits
    (bfloat16 and float8 become the ml_dtypes types)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        t = x.detach().cpu().resolve_conj().resolve_neg()
        name = str(t.dtype).replace("torch.", "")
        if name == "bfloat16":
            return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if name == "float4_e2m1fn_x2":
            raise TypeError(
                f"{arg} is packed FP4 (float4_e2m1fn_x2): unpack it first (fp8sim.scaling.packing.unpack_fp4) "
                "and pass fmt='e2m1'"
            )
        if name.startswith("float8"):
            return t.view(torch.uint8).numpy().view(getattr(ml_dtypes, name))
        if t.dtype == torch.bool or t.is_complex():
            raise TypeError(f"{arg} must hold numbers (float or integer codes), got {t.dtype}")
        return t.numpy()
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{arg} must be an array, a tensor or a number, got {type(x).__name__}")
    arr = np.asarray(x)
    if arr.dtype.kind in "fiu" and not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype.kind not in "fiuV" or arr.dtype == bool:
        raise TypeError(f"{arg} must hold numbers (float or integer codes), got dtype {arr.dtype}")
    return arr


@cache
def _ml_format(dtype_name: str) -> FloatFormat | None:
    for f in FORMATS.values():
        if f.ml_dtypes_name == dtype_name:
            return f
    return None


def native_encoding(arr: np.ndarray, arg: str) -> Encoding:
    """The encoding of an array's own dtype."""
    dt = arr.dtype
    if dt.kind in "iu":
        return Encoding(dt.name, "int", dt.itemsize * 8, dtype=dt)
    if dt.name in _WIDE and (dt.kind == "f" or dt.type.__module__.startswith("ml_dtypes")):
        return Encoding(dt.name, "ieee", _WIDE[dt.name], dtype=dt)
    fmt = _ml_format(dt.name) if dt.type.__module__.startswith("ml_dtypes") else None
    if fmt is not None:
        return format_encoding(fmt)
    raise TypeError(f"{arg} has dtype {dt}, which fp8sim cannot read as bit patterns; pass fmt= or cast it")


def native_bits(arr: np.ndarray, enc: Encoding) -> np.ndarray:
    if enc.kind == "int":
        return arr.astype(np.int64).view(np.uint64)
    if enc.kind == "format":
        return (arr.view(np.uint8) & np.uint8(enc.fmt.num_codes - 1)).astype(np.uint64)
    return arr.view(_UINT[enc.bits]).astype(np.uint64)


def read(x: Any, fmt: FloatFormat | None, arg: str) -> Side:
    """Read ``x`` as bit patterns: of its own dtype, or, with ``fmt``, as codes of ``fmt``
    (integers are codes, floats must be values of ``fmt``)."""
    arr = to_numpy(x, arg)
    enc = native_encoding(arr, arg)
    bits = native_bits(arr, enc)
    if fmt is None:
        return Side(bits, enc)
    target = format_encoding(fmt)
    if enc.kind == "int":
        v = bits.view(np.int64)
        if v.size and (v.min() < 0 or v.max() >= fmt.num_codes):
            bad = int(v.min()) if v.min() < 0 else int(v.max())
            raise ValueError(f"{arg} holds code {bad}, out of range for {fmt.name}: codes are 0..{fmt.num_codes - 1}")
        return Side(bits, target)
    if enc == target:
        return Side(bits, target)
    vals = values(enc, bits)
    codes = encode(vals, fmt, saturate=False).astype(np.uint64)
    back = values(target, codes)
    ok = (back == vals) | (np.isnan(back) & np.isnan(vals))
    if not ok.all():
        i = int(np.argmax(~ok.reshape(-1)))
        idx = _index(i, vals.shape)
        raise ValueError(
            f"{arg}{idx} = {_dec(vals.reshape(-1)[i])} ({enc.name} {hex_of(enc, int(bits.reshape(-1)[i]))}) is not "
            f"a value of {fmt.name}: with fmt= pass codes or values on the {fmt.name} grid (e.g. fp8sim.quantize)"
        )
    return Side(codes, target, enc, bits)


def _index(i: int, shape: tuple[int, ...]) -> str:
    return str([int(k) for k in np.unravel_index(i, shape)]) if shape else "[()]"


def _dec(v: float) -> str:
    return repr(float(v))


def midpoint(enc: Encoding, x: np.ndarray) -> np.ndarray:
    """True where float64 ``x`` lies exactly halfway between two adjacent finite values of ``enc``."""
    if enc.kind == "ieee" and enc.bits == 64:  # a float64 input is a float64 value: never between two
        return np.zeros(x.shape, bool)
    if enc.kind == "int":  # adjacent values are consecutive integers
        info = np.iinfo(enc.dtype)
        with np.errstate(invalid="ignore"):
            return (x - np.floor(x) == 0.5) & (x > info.min) & (x < info.max)
    with np.errstate(invalid="ignore", over="ignore"):
        if enc.kind == "format":
            near = encode(x, enc.fmt, saturate=False).astype(np.uint64)
        else:
            near = native_bits(x.astype(enc.dtype), enc)
        r = values(enc, near)
        if not enc.signed:  # unsigned: codes are ordered as the values
            step = np.where(x > r, 1, -1)
            other = np.clip(near.astype(np.int64) + step, 0, enc.fmt.num_codes - 1).astype(np.uint64)
        else:
            other = from_ordered(enc, ordered(enc, near) + np.where(x > r, 1, -1))
        nb = values(enc, other)
        return np.isfinite(r) & np.isfinite(nb) & (x != r) & (2 * x == r + nb)


def is_subnormal(enc: Encoding, v: np.ndarray) -> np.ndarray:
    a = np.abs(v)
    return (a > 0) & (a < enc.min_normal)


def fmt_or_none(fmt: Any) -> FloatFormat | None:
    return None if fmt is None else get_format(fmt)


def pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.4g}%" if total else "0%"
