"""Nearest-even casts and decode against the installed ml_dtypes, exhaustively over 16-bit inputs.

Semantics checked (spec sections 2.1 and 2.3):
- ``saturate=False`` is ml_dtypes ``astype`` exactly (non-saturating OCP rule; E8M0: zero and
  negatives give NaN 0xFF);
- ``saturate=True`` is ``np.clip(x, finfo.min, finfo.max)`` then ``astype`` (E8M0: finfo.min is
  2^-127, so zero and negatives give code 0x00); NaN stays NaN;
- decode of every code is ml_dtypes' value;
- float64 inputs are rounded once, from the exact value (spec 2.5 pitfall 1: ml_dtypes' own
  float64 array cast went through float32 and double-rounded before 0.7, fp8sim's core must not).

E8M0 is compared with the installed release's own nearest rule where it is not the core's (before
0.7: ``conftest.encode_like_installed_ml_dtypes``); the core's rule is ml_dtypes 0.7's.
"""

from __future__ import annotations

from functools import cache

import ml_dtypes
import numpy as np
import pytest
from conftest import (
    FORMAT_NAMES,
    all_bfloat16,
    all_float16,
    assert_codes_equal,
    encode_like_installed_ml_dtypes,
    midpoints,
    ml_dtype,
    ref_encode,
    widen,
)

import fp8sim
from fp8sim.testing.oracles import require

SOURCES = ("float16", "bfloat16")
CONTAINERS = (
    "numpy-native",
    "numpy-float32",
    "numpy-float64",
    *(pytest.param(c, marks=pytest.mark.torch) for c in ("torch-native", "torch-float32", "torch-float64")),
)


def _source(name: str) -> np.ndarray:
    return all_float16() if name == "float16" else all_bfloat16()


@cache
def _ml_dtypes_codes(fmt_name: str, source: str, saturate: bool) -> np.ndarray:
    """The oracle: ml_dtypes astype of the 16-bit values, after clipping to finfo when saturating.

    The clip runs in float32 (exact for 16-bit inputs): in float16 E8M0's finfo.min = 2^-127 would
    flush to 0.  NaN skips the clip, so its sign (which picks the FP4/FP6 code) is kept.
    """
    fmt = fp8sim.get_format(fmt_name)
    dt = ml_dtype(fmt)
    x = _source(source)
    if not saturate:
        with np.errstate(invalid="ignore"):
            return x.astype(dt).view(np.uint8)
    fi = ml_dtypes.finfo(dt)
    x32 = widen(x, np.float32)
    clipped = np.clip(x32, np.float32(fi.min), np.float32(fi.max))
    clipped = np.where(np.isnan(x32), x32, clipped)
    with np.errstate(invalid="ignore"):
        return clipped.astype(dt).view(np.uint8)


def _container(source: str, container: str):
    x = _source(source)
    if container == "numpy-native":
        return x
    if container == "numpy-float32":
        return widen(x, np.float32)
    if container == "numpy-float64":
        return widen(x, np.float64)
    torch = require("torch")
    if container == "torch-native":
        # from bits with .view, so NaN signs and payloads are kept
        dt = torch.float16 if source == "float16" else torch.bfloat16
        return torch.from_numpy(x.view(np.int16)).view(dt)
    if container == "torch-float32":
        return torch.from_numpy(widen(x, np.float32))
    return torch.from_numpy(widen(x, np.float64))


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_nonsaturating_nearest_even_matches_ml_dtypes_astype(fmt, source, container):
    x = _container(source, container)
    got = encode_like_installed_ml_dtypes(x, fmt, saturate=False)
    assert_codes_equal(got, _ml_dtypes_codes(fmt, source, False), fmt, x, f"saturate=False {source} as {container}")


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_saturating_nearest_even_matches_clip_then_ml_dtypes_astype(fmt, source, container):
    x = _container(source, container)
    got = encode_like_installed_ml_dtypes(x, fmt, saturate=True)
    assert_codes_equal(got, _ml_dtypes_codes(fmt, source, True), fmt, x, f"saturate=True {source} as {container}")


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_default_is_nearest_even_saturating(fmt):
    x = all_bfloat16()
    want = _ml_dtypes_codes(fmt, "bfloat16", True)
    core = fp8sim.encode(x, fmt, rounding="nearest_even", saturate=True)
    assert_codes_equal(fp8sim.encode(x, fmt), core, fmt, x, "defaults")
    assert_codes_equal(encode_like_installed_ml_dtypes(x, fmt, True), want, fmt, x, "ml_dtypes")


@pytest.mark.torch
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_torch_output_is_uint8_with_input_shape(fmt):
    torch = require("torch")
    x = torch.from_numpy(all_bfloat16().view(np.int16)).view(torch.bfloat16).reshape(256, 256)
    got = fp8sim.encode(x, fmt)
    assert got.dtype == torch.uint8 and got.shape == x.shape and got.device == x.device


# -- decode -------------------------------------------------------------------------------------


def _ml_decode(fmt: fp8sim.FloatFormat) -> np.ndarray:
    return np.arange(fmt.num_codes, dtype=np.uint8).view(ml_dtype(fmt)).astype(np.float32)


def _assert_same_floats(got: np.ndarray, want: np.ndarray, fmt: fp8sim.FloatFormat) -> None:
    """NaN by class; otherwise identical float32 bit patterns (so -0 and +0 differ)."""
    assert got.dtype == np.float32 and got.shape == want.shape
    gn, wn = np.isnan(got), np.isnan(want)
    gb, wb = got.view(np.uint32), want.view(np.uint32)
    bad = np.flatnonzero((gn != wn) | (~gn & (gb != wb)))
    if bad.size:
        c = int(bad[0])
        raise AssertionError(
            f"{fmt.name}: decode of code 0x{c:02X}: got {got[c]!r} (0x{gb[c]:08X}), "
            f"want ml_dtypes {want[c]!r} (0x{wb[c]:08X}); {bad.size} codes differ"
        )


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_decode_of_every_code_matches_ml_dtypes(fmt):
    f = fp8sim.get_format(fmt)
    codes = np.arange(f.num_codes, dtype=np.uint8)
    _assert_same_floats(fp8sim.decode(codes, f), _ml_decode(f), f)


@pytest.mark.torch
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_torch_decode_of_every_code_matches_ml_dtypes(fmt):
    torch = require("torch")
    f = fp8sim.get_format(fmt)
    got = fp8sim.decode(torch.arange(f.num_codes, dtype=torch.uint8), f)
    assert got.dtype == torch.float32
    _assert_same_floats(got.numpy(), _ml_decode(f), f)


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_code_value_and_scalar_decode_match_ml_dtypes(fmt):
    """FloatFormat.code_value (the reference grid in conftest is built from it) is ml_dtypes' value."""
    f = fp8sim.get_format(fmt)
    want = _ml_decode(f)
    got = np.array([f.code_value(c) for c in range(f.num_codes)], np.float64).astype(np.float32)
    _assert_same_floats(got, want, f)
    scalars = np.array([fp8sim.decode(c, f) for c in range(f.num_codes)], np.float64).astype(np.float32)
    _assert_same_floats(scalars, want, f)
    assert [f.is_nan_code(c) for c in range(f.num_codes)] == list(np.isnan(want))


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_format_record_matches_ml_dtypes_finfo(fmt):
    f = fp8sim.get_format(fmt)
    fi = ml_dtypes.finfo(ml_dtype(f))
    assert f.max == float(fi.max)
    assert f.min_normal == float(fi.smallest_normal)
    assert f.num_codes == 1 << fi.bits


# -- float64 is rounded once ----------------------------------------------------------------------


def _double_rounding_cases(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 values one float64 ulp above and below each midpoint (and the half step above max),
    positive and negative: float32 would round every one of them onto the midpoint itself."""
    xs = []
    for m in midpoints(fmt):
        mf = float(m)
        for x in (np.nextafter(mf, np.inf), np.nextafter(mf, 0.0)):
            assert float(np.float32(x)) == mf  # precondition: float32 lands on the midpoint
            xs += [x, -x]
    x = np.array(xs, np.float64)
    want = np.array([ref_encode(float(v), fmt, "nearest_even", True) for v in x], np.uint8)
    return x, want


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_float64_near_midpoints_rounds_once_from_exact_value(fmt):
    """Just above a midpoint rounds up, just below rounds down, whatever the tie rule would say."""
    x, want = _double_rounding_cases(fmt)
    assert_codes_equal(fp8sim.encode(x, fmt), want, fmt, x, "float64 array near midpoints")
    scalars = np.array([fp8sim.encode(float(v), fmt) for v in x], np.uint8)
    assert_codes_equal(scalars, want, fmt, x, "Python float near midpoints")
    np_scalars = np.array([fp8sim.encode(v, fmt) for v in x], np.uint8)  # numpy float64 scalars
    assert_codes_equal(np_scalars, want, fmt, x, "numpy float64 scalar near midpoints")


@pytest.mark.torch
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_torch_float64_near_midpoints_rounds_once_from_exact_value(fmt):
    torch = require("torch")
    x, want = _double_rounding_cases(fmt)
    assert_codes_equal(fp8sim.encode(torch.from_numpy(x), fmt), want, fmt, x, "torch float64 near midpoints")


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_float64_single_rounding_against_ml_dtypes_float64_cast(fmt):
    """Spec 2.5 pitfall 1: before 0.7, ml_dtypes' float64 array cast goes through float32, so on these
    inputs it lands on the tie rule; fp8sim must not follow it (and the cases must exercise that).
    ml_dtypes 0.7 rounds float64 once (``RoundToOddFloat``): there it is the oracle of the same codes."""
    from fp8sim.cast.conventions import ml_dtypes_rule

    x, want = _double_rounding_cases(fmt)
    dt = ml_dtype(fmt)
    fi = ml_dtypes.finfo(dt)
    ml = np.clip(x, float(fi.min), float(fi.max)).astype(dt).view(np.uint8)
    got = fp8sim.encode(x, fmt)
    assert_codes_equal(got, want, fmt, x, "float64 single rounding")
    if ml_dtypes_rule().float64 == "via_float32":
        assert (ml != want).any(), "no case separates single from double rounding"
    else:
        assert_codes_equal(got, ml, fmt, x, f"ml_dtypes {ml_dtypes.__version__} float64 (rounded once)")
