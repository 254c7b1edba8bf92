"""FloatFormat records against ml_dtypes (spec section 1) and the registry's error messages."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from conftest import ml_dtype

import fp8sim
from fp8sim.formats import FORMATS, FloatFormat, get_format
from fp8sim.testing.oracles import require

ALL = list(FORMATS.values())


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_derived_limits_match_ml_dtypes_finfo(fmt: FloatFormat) -> None:
    fi = ml_dtypes.finfo(ml_dtype(fmt))
    assert fmt.bits == fi.bits
    assert fmt.max == float(fi.max)
    assert fmt.min_normal == float(fi.tiny)
    assert fmt.smallest_positive == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.num_codes == 1 << fi.bits


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_every_code_value_matches_ml_dtypes(fmt: FloatFormat) -> None:
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    want = codes.view(ml_dtype(fmt)).astype(np.float64)
    for c in range(fmt.num_codes):
        got = fmt.code_value(c)
        if math.isnan(want[c]):
            assert math.isnan(got) and fmt.is_nan_code(c), f"{fmt.name} code 0x{c:02x}: want NaN, got {got}"
        else:
            assert got == want[c] and not fmt.is_nan_code(c), f"{fmt.name} code 0x{c:02x}: {got} != {want[c]}"
            assert math.copysign(1, got) == math.copysign(1, want[c]), f"{fmt.name} 0x{c:02x}: sign of zero"


# Spec section 1 table, written by hand: (max code, first NaN code or None, Inf code or None)
SPEC_TABLE = {
    "e4m3": (0x7E, 0x7F, None),
    "e5m2": (0x7B, 0x7D, 0x7C),
    "e4m3fnuz": (0x7F, 0x80, None),
    "e5m2fnuz": (0x7F, 0x80, None),
    "e8m0": (0xFE, 0xFF, None),
    "e2m1": (0x7, None, None),
    "e2m3": (0x1F, None, None),
    "e3m2": (0x1F, None, None),
}


@pytest.mark.parametrize("name", SPEC_TABLE)
def test_special_codes_follow_spec_table(name: str) -> None:
    fmt = FORMATS[name]
    max_code, nan, inf = SPEC_TABLE[name]
    assert fmt.max_code == max_code
    assert fmt.inf_code == inf
    assert fmt.is_nan_code(nan) if nan is not None else not fmt.has_nan


def test_registry_names_aliases_and_attributes() -> None:
    assert fp8sim.get_format("float8_e4m3fn") is fp8sim.E4M3
    assert fp8sim.get_format("FLOAT8_E5M2") is fp8sim.E5M2
    assert fp8sim.get_format("float8_e8m0fnu") is fp8sim.E8M0
    assert fp8sim.get_format("float4_e2m1fn") is fp8sim.E2M1
    assert fp8sim.get_format("float6_e2m3fn") is fp8sim.E2M3
    assert fp8sim.get_format("float6_e3m2fn") is fp8sim.E3M2
    assert fp8sim.get_format(fp8sim.E4M3FNUZ) is fp8sim.E4M3FNUZ
    assert get_format("e5m2fnuz") is fp8sim.E5M2FNUZ


def test_unknown_format_lists_known_names() -> None:
    with pytest.raises(ValueError, match=r"unknown format 'e4m4'; known: e4m3, e5m2, e8m0"):
        get_format("e4m4")
    with pytest.raises(TypeError, match="fmt must be"):
        get_format(3)  # type: ignore[arg-type]


def test_torch_dtypes_where_torch_has_them() -> None:
    torch = require("torch")
    assert fp8sim.E4M3.torch_dtype is torch.float8_e4m3fn
    assert fp8sim.E5M2.torch_dtype is torch.float8_e5m2
    assert fp8sim.E8M0.torch_dtype is torch.float8_e8m0fnu
    assert fp8sim.E2M1.torch_dtype is None  # torch has only the packed float4_e2m1fn_x2


def test_invalid_records_are_rejected_with_the_field_named() -> None:
    with pytest.raises(ValueError, match="specials must be one of"):
        FloatFormat("x", 4, 3, 7, specials="weird")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most 8 bits"):
        FloatFormat("x", 5, 5, 15)
    with pytest.raises(ValueError, match="subnormals=False"):
        FloatFormat("x", 4, 3, 7, subnormals=False)


def test_user_defined_format_is_usable_end_to_end() -> None:
    """Formats are data: a new record works through encode/decode with no other change."""
    e3m4 = FloatFormat("e3m4", 3, 4, 3, specials="none")
    assert e3m4.max == 31.0  # 2^(7-3) * (1 + 15/16)
    x = np.array([0.1, 1.03125, 100.0, -0.0], dtype=np.float32)
    got = fp8sim.quantize(x, e3m4)
    assert got.tolist() == [0.09375, 1.0, 31.0, -0.0]  # 0.1 -> 6 * 2^-6; tie at 1+1/32 -> even
