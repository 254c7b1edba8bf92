"""Properties every cast must have (spec section 2), on hypothesis-drawn inputs.

- monotonic: x <= y implies quantize(x) <= quantize(y) (non-NaN results), every deterministic mode;
- idempotent: quantizing a quantized value changes nothing (codes equal), every mode;
- representable values round-trip: encode(decode(c)) == c for every non-NaN code, every mode
  (Inf codes saturate to max when saturate=True; fnuz has no -0 code, so nothing to special-case);
- sign symmetry: encode(-x) is encode(x) with the sign bit flipped for nearest_even,
  nearest_away, toward_zero and stochastic (same seed: the bits depend on the index, not the
  value), and encode(-x, up) is encode(x, down) with the sign flipped; fnuz maps a signed zero to
  0x00 and both NaNs to 0x80.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ALL_MODES, DETERMINISTIC_MODES, FORMAT_NAMES, assert_codes_equal, critical_points
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fp8sim
from fp8sim.testing.oracles import require

BACKENDS = ("numpy-float32", "numpy-float64", "torch-float64")
F32_MAX = float(np.finfo(np.float32).max)
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _floats_near_grid(fmt: str) -> st.SearchStrategy[float]:
    """Any float, floats in the format's range, and grid points / midpoints nudged by a few ulps."""
    f = fp8sim.get_format(fmt)
    pts = [float(p) for p in critical_points(fmt)]
    nudged = st.builds(
        lambda p, k, s: s * float(np.float32(p) + np.float32(k) * np.spacing(np.float32(p))),
        st.sampled_from(pts),
        st.integers(-3, 3),
        st.sampled_from([1.0, -1.0]),
    )
    return st.one_of(
        st.floats(allow_nan=False, width=32),
        st.floats(-min(2 * f.max, F32_MAX), min(2 * f.max, F32_MAX), width=32),
        st.floats(-4 * f.smallest_positive, 4 * f.smallest_positive, width=32),
        nudged,
    )


def _arrays(fmt: str) -> st.SearchStrategy[list[float]]:
    return st.lists(_floats_near_grid(fmt), min_size=1, max_size=64)


def _container(x: np.ndarray, backend: str):
    x = x.astype(np.float32 if backend.endswith("float32") else np.float64)
    if backend.startswith("torch"):
        torch = require("torch")
        return torch.from_numpy(x)
    return x


def _np(a) -> np.ndarray:
    return a.numpy() if hasattr(a, "numpy") else np.asarray(a)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@SETTINGS
@given(data=st.data())
def test_quantize_is_monotonic_in_every_deterministic_mode(fmt, backend, data):
    xs = np.sort(np.array(data.draw(_arrays(fmt)), np.float64))
    x = _container(xs, backend)
    for rounding in DETERMINISTIC_MODES:
        for saturate in (False, True):
            q = _np(fp8sim.quantize(x, fmt, rounding=rounding, saturate=saturate)).astype(np.float64)
            keep = q[~np.isnan(q)]
            bad = np.flatnonzero(keep[1:] < keep[:-1])  # Inf - Inf is NaN: compare, do not subtract
            assert bad.size == 0, (
                f"{fmt} rounding={rounding} saturate={saturate} {backend}: not monotonic: "
                f"sorted inputs {_np(x)[~np.isnan(q)][bad[0] : bad[0] + 2]} -> {keep[bad[0] : bad[0] + 2]}"
            )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
@SETTINGS
@given(data=st.data())
def test_quantize_is_idempotent_in_every_mode(fmt, backend, data):
    x = _container(np.array(data.draw(_arrays(fmt)), np.float64), backend)
    for rounding in ALL_MODES:
        seed = 5 if rounding == "stochastic" else None
        for saturate in (False, True):
            kw = {"rounding": rounding, "saturate": saturate, "seed": seed}
            codes = fp8sim.encode(x, fmt, **kw)
            q = fp8sim.quantize(x, fmt, **kw)
            again = fp8sim.encode(q, fmt, **kw)
            assert_codes_equal(
                again, codes, fmt, q, f"quantize twice, rounding={rounding} saturate={saturate} {backend}"
            )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("rounding", ALL_MODES)
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_every_representable_value_round_trips(fmt, rounding, saturate, backend):
    """Exhaustive over codes: decode then encode gives the same code."""
    f = fp8sim.get_format(fmt)
    codes = np.array([c for c in range(f.num_codes) if not f.is_nan_code(c)], np.uint8)
    values = fp8sim.decode(codes, f)
    want = codes.copy()
    if saturate and f.has_inf:
        want[np.isinf(values)] = np.where(values[np.isinf(values)] > 0, f.max_code, f.max_code | f.sign_mask)
    seed = 0 if rounding == "stochastic" else None
    got = fp8sim.encode(_container(values, backend), f, rounding=rounding, saturate=saturate, seed=seed)
    assert_codes_equal(got, want, f, values, f"round trip rounding={rounding} saturate={saturate} {backend}")


def _negated_codes(codes: np.ndarray, f: fp8sim.FloatFormat) -> np.ndarray:
    """The code of -v for the code of v (NaN codes are compared by class anyway)."""
    flipped = codes ^ np.uint8(f.sign_mask)
    if f.specials == "fnuz":  # no -0: zero stays 0x00, and the NaN 0x80 stays NaN
        flipped = np.where((codes == 0) | (codes == f.sign_mask), codes, flipped).astype(np.uint8)
    return flipped


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", [n for n in FORMAT_NAMES if fp8sim.get_format(n).signed])
@SETTINGS
@given(data=st.data())
def test_negating_the_input_flips_the_sign_bit(fmt, backend, data):
    f = fp8sim.get_format(fmt)
    xs = np.array(data.draw(_arrays(fmt)) + [np.nan], np.float64)
    x, nx = _container(xs, backend), _container(-xs, backend)
    pairs = [(m, m) for m in ("nearest_even", "nearest_away", "toward_zero", "stochastic")]
    pairs += [("up", "down"), ("down", "up")]
    for mode, mirrored in pairs:
        for saturate in (False, True):
            s1 = 17 if mode == "stochastic" else None
            pos = _np(fp8sim.encode(x, f, rounding=mirrored, saturate=saturate, seed=s1))
            neg = fp8sim.encode(nx, f, rounding=mode, saturate=saturate, seed=s1)
            assert_codes_equal(
                neg,
                _negated_codes(pos, f),
                f,
                -xs,
                f"encode(-x, {mode}) vs -encode(x, {mirrored}), saturate={saturate} {backend}",
            )
