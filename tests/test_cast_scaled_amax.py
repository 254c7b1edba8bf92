"""``numpy_backend.encode_scaled_with_amax``: the fused cast that current and delayed scaling use.

Contract: the codes are ``encode(fl32(x * scale))`` with nearest-even rounding and the given overflow
policy, and the amax is TE's amax of the *unscaled* float32 ``x`` (max |x|, NaN skipped, 0 for an empty or
all-NaN input).  Oracles: ml_dtypes' casts of the float32 product (non-saturating: ml_dtypes' own rule;
saturating: the product clipped to +-max first, as CUDA's satfinite does), numpy's ``nanmax`` for the
amax, and the spec's exact Fraction reference (``conftest.ref_encode_vec``) for a format record whose grid
reaches below float32 bit 16 (the exact path: no lookup table).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_codes_equal, ref_encode_array

import fp8sim
from fp8sim.cast.numpy_backend import encode_scaled_with_amax

_ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def _inputs(n: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float32)
    x[:9] = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 3e38, -3e38, 2.0**-149]
    return x


def _ml_codes(prod: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    f = fp8sim.get_format(fmt)
    if saturate:
        prod = np.clip(prod, -f.max, f.max)  # NaN stays NaN, +-Inf become +-max
    return prod.astype(_ML[fmt]).view(np.uint8)


def _amax(x: np.ndarray) -> np.float32:
    finite_or_inf = np.abs(x[~np.isnan(x)])
    return np.float32(finite_or_inf.max() if finite_or_inf.size else 0.0)


@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nonsat"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_codes_are_the_cast_of_the_float32_product_and_amax_is_of_the_unscaled_input(fmt, saturate):
    # more than one chunk of 2^16 elements, in a 2-D shape
    x = _inputs(2 * 70_000).reshape(2, 70_000)
    scale = np.float32(3.7)
    codes, amax = encode_scaled_with_amax(x, scale, fp8sim.get_format(fmt), saturate)
    with np.errstate(over="ignore", invalid="ignore"):
        prod = x * scale  # float32 times float32: the float32 product, rounded once
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    assert_codes_equal(codes, _ml_codes(prod, fmt, saturate), fmt, prod, f"saturate={saturate}")
    assert isinstance(amax, np.float32) and amax == _amax(x) == np.inf
    finite = np.where(np.isinf(x), 0, x)
    assert encode_scaled_with_amax(finite, scale, fp8sim.get_format(fmt), saturate)[1] == _amax(finite)


def test_default_saturates_and_amax_skips_nan_and_is_zero_when_empty():
    f = fp8sim.get_format("e4m3")
    x = np.array([np.nan, -500.0, 2.0], np.float32)
    codes, amax = encode_scaled_with_amax(x, np.float32(2.0), f)
    assert codes.tolist() == [0x7F, 0xFE, 0x48] and amax == np.float32(500.0)  # the unscaled amax
    codes, amax = encode_scaled_with_amax(np.array([np.nan], np.float32), np.float32(2.0), f)
    assert codes.tolist() == [0x7F] and amax == 0.0
    codes, amax = encode_scaled_with_amax(np.zeros((0, 3), np.float32), np.float32(2.0), f)
    assert codes.shape == (0, 3) and codes.dtype == np.uint8 and amax == 0.0


# a record whose smallest half-spacing (2^-144) lies below float32 bit 16: the exact path, no table
_DEEP = fp8sim.FloatFormat("x_e4m3_b140", 4, 3, 140, specials="none")


@pytest.mark.parametrize("saturate", [True, False], ids=["sat", "nonsat"])
def test_a_format_without_a_float32_table_takes_the_exact_nearest_even_path(saturate):
    from fp8sim.cast._tables import f32_table_ok

    assert not f32_table_ok(_DEEP)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(400) * np.exp2(rng.integers(-20, 4, 400))).astype(np.float32)
    x[:6] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0]
    scale = np.float32(2.0**-128 * 1.3)
    codes, amax = encode_scaled_with_amax(x, scale, _DEEP, saturate)
    with np.errstate(over="ignore", invalid="ignore"):
        prod = (x * scale).astype(np.float32)
    want = ref_encode_array(prod, _DEEP, "nearest_even", saturate)
    assert_codes_equal(codes, want, _DEEP, prod, f"saturate={saturate}")
    assert amax == _amax(x)
