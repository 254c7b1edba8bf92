"""Stochastic rounding (spec 2.2, the SR row; fp8sim.cast docstring).

Semantics checked: element i (its flat C-order index in the call) gets 32 random bits
r_i = ``fp8sim.cast._random.numpy_bits(seed, 0, n)[i]``, and |x| rounds away from zero iff
``floor(f * 2^32) + r_i >= 2^32``, f the fraction of the way from the lower grid neighbour to the
upper one.  That is gfloat's ``RoundMode.StochasticFastest`` with ``srnumbits=32, srbits=r_i``.
Overflow follows nearest rounding.  Representable values never move.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import (
    FORMAT_NAMES,
    all_bfloat16,
    all_float16,
    assert_codes_equal,
    gfloat_format,
    ref_encode,
    widen,
)

import fp8sim
from fp8sim.cast._random import numpy_bits
from fp8sim.testing.oracles import require

BACKENDS = ("numpy-float32", "numpy-float64", "torch-float32", "torch-float64")


def _as(x32: np.ndarray, backend: str):
    """The same float32 values in another container (exact)."""
    x = x32 if backend.endswith("float32") else widen(x32, np.float64)
    if backend.startswith("torch"):
        torch = require("torch")
        return torch.from_numpy(np.ascontiguousarray(x))
    return x


def _np(codes) -> np.ndarray:
    return codes.numpy() if hasattr(codes, "numpy") else np.asarray(codes)


def _samples(fmt: str, n: int, seed: int = 0) -> np.ndarray:
    """float32 values: 7/8 log-uniform over [smallest/4, 1.75 max] (underflow, subnormals, normals
    and overflow), 1/8 log-uniform over [smallest 2^-40, smallest] (deep underflow, where P(away)
    is tiny but not 0); random signs; plus zeros, Inf and NaN."""
    f = fp8sim.get_format(fmt)
    rng = np.random.default_rng(seed)
    lo, hi = math.log2(f.smallest_positive / 4), math.log2(1.75 * f.max)
    deep = math.log2(f.smallest_positive) - 40
    mag = np.exp2(np.where(rng.random(n) < 0.875, rng.uniform(lo, hi, n), rng.uniform(deep, lo + 2, n)))
    x = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, f.max, -f.max], np.float32)
    return np.concatenate([special, x])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_stochastic_result_is_toward_zero_or_away_from_zero_neighbour(fmt, saturate, backend):
    x = _samples(fmt, 20_000)
    kw = {"saturate": saturate}
    rz = fp8sim.encode(x, fmt, rounding="toward_zero", **kw)
    up, down = fp8sim.encode(x, fmt, rounding="up", **kw), fp8sim.encode(x, fmt, rounding="down", **kw)
    away = np.where(np.signbit(x), down, up)
    # (stochastic overflow follows nearest rounding, which is what up/down do toward their direction)
    sr = _np(fp8sim.encode(_as(x, backend), fmt, rounding="stochastic", seed=1234, **kw))
    want = np.where(sr == away, away, rz)
    assert_codes_equal(sr, want, fmt, x, f"stochastic in {{RZ, away}} saturate={saturate} {backend}")
    differ = rz != away
    assert (sr[differ] == rz[differ]).sum() > 100 and (sr[differ] == away[differ]).sum() > 100


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_stochastic_leaves_representable_values_unchanged(fmt, saturate, backend):
    f = fp8sim.get_format(fmt)
    codes = np.array([c for c in range(f.num_codes) if not f.is_nan_code(c)], np.uint8)
    values = fp8sim.decode(np.tile(codes, 200), f)  # 200 different random draws per value
    want = np.tile(codes, 200)
    if saturate and f.has_inf:  # +-Inf saturates to +-max
        inf = np.isinf(values)
        want = np.where(inf, np.where(values > 0, f.max_code, f.max_code | f.sign_mask), want).astype(np.uint8)
    got = fp8sim.encode(_as(values, backend), f, rounding="stochastic", saturate=saturate, seed=7)
    assert_codes_equal(got, want, f, values, f"stochastic on grid values {backend}")


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_same_seed_gives_same_codes_on_every_backend_and_dtype(fmt):
    x = _samples(fmt, 50_000, seed=3)
    want = fp8sim.encode(x, fmt, rounding="stochastic", seed=99)
    assert_codes_equal(fp8sim.encode(x, fmt, rounding="stochastic", seed=99), want, fmt, x, "rerun")
    for backend in BACKENDS[1:]:
        got = fp8sim.encode(_as(x, backend), fmt, rounding="stochastic", seed=99)
        assert_codes_equal(got, want, fmt, x, f"{backend} vs numpy-float32")


@pytest.mark.parametrize("source", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_every_16bit_input_gives_the_same_stochastic_codes_in_every_container(fmt, source):
    """All 2^16 float16 / bfloat16 patterns, NaN signs included (they pick the FP4/FP6 code): numpy
    native, float32 and float64 arrays and torch native / float32 tensors agree, and every code is
    the toward-zero or the away-from-zero neighbour."""
    x = all_float16() if source == "float16" else all_bfloat16()
    x32 = widen(x, np.float32)
    want = fp8sim.encode(x, fmt, rounding="stochastic", seed=77)
    others = {"numpy-float32": x32, "numpy-float64": widen(x, np.float64)}
    torch = require("torch")
    others["torch-native"] = torch.from_numpy(x.view(np.int16)).view(
        torch.float16 if source == "float16" else torch.bfloat16
    )
    others["torch-float32"] = torch.from_numpy(x32)
    for name, xin in others.items():
        got = fp8sim.encode(xin, fmt, rounding="stochastic", seed=77)
        assert_codes_equal(got, want, fmt, x, f"stochastic {source} as {name} vs numpy {source}")
    rz = fp8sim.encode(x, fmt, rounding="toward_zero")
    away = np.where(np.signbit(x32), fp8sim.encode(x, fmt, rounding="down"), fp8sim.encode(x, fmt, rounding="up"))
    assert_codes_equal(want, np.where(want == away, away, rz), fmt, x, f"stochastic {source} in {{RZ, away}}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e8m0"])
def test_stochastic_bits_follow_flat_c_order_index(fmt, backend):
    """Reshaping keeps the flat order, so the codes are the same; a transposed (non-contiguous)
    view is processed in its own C order, like its contiguous copy."""
    x = _samples(fmt, 6 * 4096 - 8, seed=5)
    flat = _np(fp8sim.encode(_as(x, backend), fmt, rounding="stochastic", seed=11))
    x3 = _as(x.reshape(6, 64, 64), backend)
    got = _np(fp8sim.encode(x3, fmt, rounding="stochastic", seed=11))
    assert got.shape == (6, 64, 64)
    assert_codes_equal(got.reshape(-1), flat, fmt, x, f"reshaped {backend}")
    xt = x.reshape(96, 256).T
    want_t = _np(fp8sim.encode(_as(np.ascontiguousarray(xt), backend), fmt, rounding="stochastic", seed=11))
    got_t = _np(
        fp8sim.encode(
            _as(xt, backend) if backend.startswith("numpy") else _as(x.reshape(96, 256), backend).T,
            fmt,
            rounding="stochastic",
            seed=11,
        )
    )
    assert_codes_equal(got_t, want_t, fmt, np.ascontiguousarray(xt), f"transposed {backend}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_3m_elements_cross_internal_chunks_with_the_global_index(backend):
    """3M elements cross the 64K and 256K internal chunks.  Oracle, written here in float64 (exact
    for these inputs): E4M3 grid spacing q = 2^(max(e, -6) - 3), t = |x|/q, f = t - floor(t), and
    |x| rounds away iff floor(f * 2^32) + numpy_bits(seed, 0, n)[i] >= 2^32."""
    n = 3_000_000 + 17
    rng = np.random.default_rng(8)
    f = fp8sim.get_format("e4m3")
    x = (rng.uniform(0, f.max, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    if backend.endswith("float64"):
        x = rng.uniform(-f.max, f.max, n)  # full float64 precision: the exact path
    a = np.abs(widen(x, np.float64))
    e = np.maximum(np.frexp(a)[1] - 1, 1 - f.bias)
    q = np.ldexp(1.0, e - f.mbits)
    t = a / q
    n_lo = np.floor(t)
    frac = np.floor((t - n_lo) * 2.0**32)
    r = numpy_bits(4242, 0, n).astype(np.float64)
    want = np.copysign((n_lo + (frac + r >= 2.0**32)) * q, x)
    xin = x if backend.startswith("numpy") else _as(x, "torch-" + backend.split("-")[1])
    got = _np(fp8sim.quantize(xin, f, rounding="stochastic", seed=4242)).astype(np.float64)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"e4m3 stochastic {backend}: {bad.size} of {n} differ; first at flat index {bad[0]}: "
        f"input {float(x[bad[0]])!r}, got {got[bad[0]]!r}, want {want[bad[0]]!r}"
    )


def test_random_bits_agree_between_numpy_and_torch_beyond_2_to_the_32():
    """The per-element bits are a function of (seed, flat index) only, also for indices >= 2^32
    (where the numpy generator takes another branch)."""
    torch = require("torch")
    from fp8sim.cast._random import numpy_bits_at, torch_bits, torch_bits_at

    for seed in (0, 1, 2**40 + 3, 2**64 - 1):
        a = numpy_bits(seed, 2**32 - 3, 6)
        assert np.array_equal(a, numpy_bits_at(seed, np.arange(2**32 - 3, 2**32 + 3, dtype=np.uint64)))
        assert np.array_equal(a[:3], numpy_bits(seed, 2**32 - 3, 3))
        assert np.array_equal(a[3:], numpy_bits_at(seed, np.arange(2**32, 2**32 + 3, dtype=np.uint64)))
        assert np.array_equal(a.astype(np.int64), torch_bits(seed, 2**32 - 3, 6, "cpu").numpy())
        idx = np.array([0, 1, 2**31, 2**32, 2**33 + 5, 2**40 + 7, 2**62], np.int64)
        want = numpy_bits_at(seed, idx.astype(np.uint64)).astype(np.int64)
        assert np.array_equal(torch_bits_at(seed, torch.from_numpy(idx)).numpy(), want)
        assert len(set(a.tolist())) == 6


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_different_seeds_give_different_codes(fmt):
    x = _samples(fmt, 20_000, seed=9)
    f = fp8sim.get_format(fmt)
    a = fp8sim.encode(x, f, rounding="stochastic", seed=1)
    b = fp8sim.encode(x, f, rounding="stochastic", seed=2)
    c = fp8sim.encode(x, f, rounding="stochastic", seed=2**63 + 1)
    ambiguous = fp8sim.encode(x, f, rounding="toward_zero") != np.where(
        np.signbit(x), fp8sim.encode(x, f, rounding="down"), fp8sim.encode(x, f, rounding="up")
    )
    # with f uniform on (0, 1) two independent draws differ with probability 2f(1-f), 1/3 on average
    assert (a != b)[ambiguous].mean() > 0.2 and (b != c)[ambiguous].mean() > 0.2


# -- against gfloat StochasticFastest and the Fraction reference -------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_matches_gfloat_stochastic_fastest_with_32_bits(fmt, saturate, backend):
    """gfloat ``round_float(fi, x, StochasticFastest, sat, srbits=r_i, srnumbits=32)`` on float32
    samples.  Skipped elements: E8M0 inputs not >= 2^-127 (gfloat returns values outside E8M0), negative
    inputs of unsigned formats (gfloat keeps their sign) and
    FP4/FP6 NaN (gfloat raises); FP4/FP6 non-saturating overflow, where gfloat raises, is max (spec
    2.2).  The Fraction reference (``conftest.ref_encode`` with the same bits) is checked too."""
    gf = require("gfloat")
    f = fp8sim.get_format(fmt)
    fi = gfloat_format(fmt)
    seed = 2024
    x = _samples(fmt, 1500, seed=1)
    r = numpy_bits(seed, 0, x.size)
    got_codes = _np(fp8sim.encode(_as(x, backend), f, rounding="stochastic", saturate=saturate, seed=seed))
    got = fp8sim.decode(got_codes, f)
    ref = np.array(
        [ref_encode(float(v), f, "stochastic", saturate, int(b)) for v, b in zip(x, r, strict=True)], np.uint8
    )
    assert_codes_equal(got_codes, ref, f, x, f"stochastic vs Fraction reference saturate={saturate} {backend}")
    for i, (v, b) in enumerate(zip(x, r, strict=True)):
        v = float(v)
        if not f.subnormals and not v >= f.min_normal:
            continue
        if not f.signed and (v < 0 or math.copysign(1.0, v) < 0):
            continue
        try:
            want = gf.round_float(fi, v, gf.RoundMode.StochasticFastest, saturate, srbits=int(b), srnumbits=32)
        except ValueError:
            if math.isnan(v):
                continue
            want = math.copysign(f.max, v)
        g = float(got[i])
        ok = (math.isnan(g) and math.isnan(want)) or (g == want and math.copysign(1, g) == math.copysign(1, want))
        assert ok, (
            f"{fmt} stochastic saturate={saturate} {backend}: index {i} input {v!r} ({v.hex()}) bits "
            f"0x{int(b):08X}: fp8sim {g!r} (code 0x{int(got_codes[i]):02X}), gfloat {want!r}"
        )


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_full_precision_float64_matches_fraction_reference(fmt, saturate, backend):
    """float64 inputs with all 53 bits in use (not float32 values): f is exact, floor(f 2^32)
    drops its low bits, and the same r_i decide."""
    rng = np.random.default_rng(12)
    x32 = _samples(fmt, 1500, seed=4)
    x = widen(x32, np.float64) * (1 + rng.uniform(-(2.0**-24), 2.0**-24, x32.size))
    seed = 555
    r = numpy_bits(seed, 0, x.size)
    want = np.array(
        [ref_encode(float(v), fmt, "stochastic", saturate, int(b)) for v, b in zip(x, r, strict=True)], np.uint8
    )
    xin = x
    if backend == "torch":
        torch = require("torch")
        xin = torch.from_numpy(x)
    got = fp8sim.encode(xin, fmt, rounding="stochastic", saturate=saturate, seed=seed)
    assert_codes_equal(got, want, fmt, x, f"stochastic float64 saturate={saturate} {backend}")


# -- unbiasedness -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize(
    ("fmt", "lo", "hi"), [("e4m3", 1.0, 1.125), ("e5m2", 1.0, 1.25), ("e2m1", 2.0, 3.0), ("e8m0", 1.0, 2.0)]
)
def test_stochastic_rounding_is_unbiased(fmt, lo, hi, sign, dtype):
    """x = lo + 0.3 (hi - lo) (to the input precision).  With r uniform, P(up) = p =
    floor(f 2^32) / 2^32 exactly, so over n = 200,000 elements mean(quantize(x)) has expectation
    lo + p (hi - lo) and standard deviation sigma = (hi - lo) sqrt(p (1 - p) / n) = 0.00102 (hi - lo).
    The bound is 5 sigma = 0.0051 (hi - lo): a false alarm has probability < 1e-6, and a bias of
    one percentage point in P(up) (0.01 (hi - lo), about 10 sigma) fails the test."""
    if sign < 0 and not fp8sim.get_format(fmt).signed:
        pytest.skip("E8M0 is unsigned")
    n = 200_000
    gap = hi - lo
    x1 = np.array(lo + 0.3 * gap, dtype)
    f = (float(x1) - lo) / gap  # exact: lo, hi and x1 share a binade
    p = math.floor(f * 2**32) / 2**32
    x = np.full(n, sign * x1, dtype)
    q = fp8sim.quantize(x, fmt, rounding="stochastic", seed=31337).astype(np.float64)
    assert set(np.unique(np.abs(q))) <= {lo, hi}
    sigma = gap * math.sqrt(p * (1 - p) / n)
    bound = 5 * sigma
    assert bound < 0.01 * gap
    mean = float(np.mean(np.abs(q)))
    assert abs(mean - (lo + p * gap)) <= bound, (
        f"{fmt} {dtype}: mean |quantize(x)| = {mean!r}, expected {lo + p * gap!r} +- {bound:.3g} "
        f"(P(up) measured {(mean - lo) / gap:.5f}, expected {p:.5f})"
    )
