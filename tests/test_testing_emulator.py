"""fp8sim.testing.assert_matches_emulator and emulate.

Oracles: "kernels" written from the spec with ml_dtypes casts (clip to +-max, then ``astype``:
round to nearest even, saturating) and float32 numpy arithmetic, never with fp8sim's quantizers:
TE current / delayed / 1x128 block scaling (spec 5.1, 4.3, 5.3), MXFP8 RCEIL (5.2), NVFP4 (5.4),
and an exact GEMM from float64 sums of E4M3 products (exact: at most 41 significant bits).
The wrong kernel rounds toward zero (fp8sim ``rounding="toward_zero"``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from fp8sim.testing import assert_matches_emulator, emulate
from fp8sim.testing.oracles import require

torch = require("torch")

F32 = np.float32
ALL_F16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
CAST_FORMATS = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")


def _satfinite(x: np.ndarray, fmt: str) -> np.ndarray:
    """Reference cast: clip to +-max, then ml_dtypes' round-to-nearest-even ``astype``; uint8 codes."""
    dt = fp8sim.get_format(fmt).ml_dtype
    m = F32(ml_dtypes.finfo(dt).max)
    with np.errstate(invalid="ignore"):
        return np.clip(np.asarray(x, F32), -m, m).astype(dt).view(np.uint8)


def _raises(fn, *args, **kw) -> str:  # noqa: ANN001, ANN002, ANN003
    with pytest.raises(AssertionError) as info:
        fn(*args, **kw)
    return str(info.value)


def _randn(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


# -- casts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", CAST_FORMATS)
def test_nearest_even_kernel_passes_and_toward_zero_kernel_is_caught(fmt: str) -> None:
    x = ALL_F16
    good = _satfinite(x, fmt).view(fp8sim.get_format(fmt).ml_dtype)  # a float8 array, as a kernel returns
    for op in ("cast", "encode", "quantize"):
        assert_matches_emulator(good, op, x, fmt=fmt)
    bad = fp8sim.encode(x, fmt, rounding="toward_zero", saturate=True)
    msg = _raises(assert_matches_emulator, bad, "cast", x, fmt=fmt)
    n = int(np.count_nonzero(bad != _satfinite(x, fmt)))
    assert n > 1000 and f"not bit-exact: {n} of 65536 elements differ" in msg
    assert f"compared as {fmt} codes" in msg and "max ULP distance 1" in msg


def test_ulp_budget_admits_one_code_and_reports_the_worst() -> None:
    x = ALL_F16
    bad = fp8sim.encode(x, "e4m3", rounding="toward_zero", saturate=True)
    assert_matches_emulator(bad, "cast", x, fmt="e4m3", ulp_budget=1)
    worse = _satfinite(x, "e4m3")
    i = int(np.flatnonzero(x == np.float16(1.0))[0])
    worse[i] += 3  # 1.0 (0x38) becomes 1.375 (0x3B)
    msg = _raises(assert_matches_emulator, worse, "cast", x, fmt="e4m3", ulp_budget=2)
    assert "not within 2 ULP: 1 of 65536 elements" in msg
    assert f"worst: [{i}]: actual 1.375 (e4m3 0x3B) | expected 1.0 (e4m3 0x38) | 3 ULP" in msg


def test_torch_kernels_against_casts_and_conventions() -> None:
    with np.errstate(invalid="ignore"):  # signalling-NaN patterns warn when widened
        wide = ALL_F16.astype(F32)
    x = torch.from_numpy(np.concatenate([wide, F32([1e6, -1e6, np.inf, -np.inf])]))
    ok = ~torch.isnan(x)
    sat = x.clamp(-448, 448).to(torch.float8_e4m3fn)
    assert_matches_emulator(sat, "cast", x, fmt="e4m3", saturate=True)
    assert_matches_emulator(sat, "cast", x, fmt="e4m3", convention="torchao")
    e5 = x[ok].to(torch.float8_e5m2)  # torch eager: E5M2 overflow -> Inf (non-saturating)
    assert_matches_emulator(e5, "cast", x[ok], fmt="e5m2", convention="torch_eager")
    msg = _raises(assert_matches_emulator, e5, "cast", x[ok], fmt="e5m2", saturate=True)
    assert "(e5m2 0x7C) | expected 57344.0 (e5m2 0x7B) | 1 ULP" in msg  # Inf against max


def test_stochastic_cast_is_reproducible_with_a_seed() -> None:
    x = _randn(1000)
    codes = fp8sim.encode(x, "e5m2", rounding="stochastic", seed=7)
    assert_matches_emulator(codes, "encode", x, fmt="e5m2", rounding="stochastic", seed=7)
    with pytest.raises(ValueError, match="needs seed="):
        assert_matches_emulator(codes, "encode", x, fmt="e5m2", rounding="stochastic")


def test_emulate_returns_codes_values_and_torch_for_torch() -> None:
    x = np.float32([1.0625, 500.0])
    np.testing.assert_array_equal(emulate("encode", x, fmt="e4m3"), np.uint8([0x38, 0x7E]))
    np.testing.assert_array_equal(emulate("quantize", x, fmt="e4m3"), F32([1.0, 448.0]))
    assert emulate("cast", torch.from_numpy(x), fmt="e4m3").dtype == torch.uint8


# -- recipes ------------------------------------------------------------------------------------


def _te_current(x: np.ndarray, fmax: float, fmt: str) -> tuple[np.ndarray, np.float32]:
    scale = F32(fmax) / np.abs(x).max()
    return _satfinite(x * scale, fmt), F32(1) / scale


def test_current_scaling_data_and_scale_inv() -> None:
    x = _randn(8, 96) * F32(5)
    data, scale_inv = _te_current(x, 448, "e4m3")
    recipe = Float8CurrentScaling(fp8_format=Format.E4M3)
    assert_matches_emulator((data, scale_inv), recipe, x)
    assert_matches_emulator((torch.from_numpy(data).view(torch.float8_e4m3fn), torch.tensor(scale_inv)), recipe, x)
    assert_matches_emulator(data, recipe, torch.from_numpy(x))  # data alone
    off = np.nextafter(scale_inv, F32(1))
    msg = _raises(assert_matches_emulator, (data, off), recipe, x)
    assert msg.startswith("Float8CurrentScaling (role input, e4m3) scales: not bit-exact") and "1 ULP" in msg
    grad_data, grad_inv = _te_current(x, 57344, "e5m2")  # HYBRID: gradients are E5M2
    assert_matches_emulator((grad_data, grad_inv), Float8CurrentScaling(), x, role="grad")


def test_delayed_scaling_casts_with_the_given_scale() -> None:
    x = _randn(4, 64) * F32(300)
    assert_matches_emulator((_satfinite(x * F32(0.75), "e4m3"), F32(1) / F32(0.75)), DelayedScaling(), x, scale=0.75)
    assert_matches_emulator(_satfinite(x, "e4m3"), DelayedScaling(), x)  # first step: scale 1
    assert_matches_emulator(_satfinite(x * F32(2), "e5m2"), DelayedScaling(), x, role="grad", scale=2.0)


def test_block_scaling_1x128_with_a_partial_edge_block() -> None:
    x = _randn(4, 300, seed=1) * F32(7)
    data = np.empty(x.shape, np.uint8)
    scale_inv = np.empty((4, 3), F32)
    for r in range(4):
        for b in range(3):
            blk = x[r, 128 * b : 128 * (b + 1)]
            scale = F32(448) / np.abs(blk).max()
            scale = F32(2.0 ** np.floor(np.log2(scale)))  # pow2: exact round down
            data[r, 128 * b : 128 * (b + 1)] = _satfinite(blk * scale, "e4m3")
            scale_inv[r, b] = F32(1) / scale
    assert_matches_emulator((data, scale_inv), Float8BlockScaling(), x)
    assert emulate(Float8BlockScaling(), x[:, :256], role="weight").block == (128, 128)
    assert emulate(Float8BlockScaling(), x[:, :256], columnwise=True).block == (128, 1)


def test_mxfp8_rceil_scales_and_data() -> None:
    x = _randn(6, 64, seed=2) * F32(100)
    blocks = x.reshape(6, 2, 32)
    d = np.abs(blocks).max(axis=-1) * F32(1.0 / 448.0)  # fl32(amax * fl32(1/max))
    mant, ex = np.frexp(d)
    e = np.where(mant == 0.5, ex - 1, ex)  # exponent of d, rounded up
    data = _satfinite(blocks * np.exp2(-e)[..., None].astype(F32), "e4m3").reshape(6, 64)
    assert_matches_emulator((data, (e + 127).astype(np.uint8)), MXFP8BlockScaling(), x)
    e8m0 = torch.from_numpy((e + 127).astype(np.uint8)).view(torch.float8_e8m0fnu)
    assert_matches_emulator((torch.from_numpy(data).view(torch.float8_e4m3fn), e8m0), MXFP8BlockScaling(), x)


def test_nvfp4_input_rowwise_copy() -> None:
    x = _randn(16, 64, seed=3)
    flt_max = F32(np.finfo(F32).max)
    s_enc = np.fmin(F32(2688) / np.abs(x).max(), flt_max)
    vec_max = np.abs(x.reshape(16, 4, 16)).max(axis=-1)
    s_blk = _satfinite(vec_max * (s_enc * (F32(1) / F32(6))), "e4m3")
    s_dec = F32(1) / s_enc
    enc = np.fmin(F32(1) / (s_blk.view(ml_dtypes.float8_e4m3fn).astype(F32) * s_dec), flt_max)
    v = np.clip(x.reshape(16, 4, 16) * enc[..., None], F32(-6), F32(6))
    codes = v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(16, 64)
    assert_matches_emulator((codes, s_blk, s_dec), NVFP4BlockScaling(), x)
    msg = _raises(assert_matches_emulator, (codes, s_blk, np.nextafter(s_dec, F32(0))), NVFP4BlockScaling(), x)
    assert "global scale: not bit-exact" in msg
    assert emulate(NVFP4BlockScaling(), x, role="weight").block == (16, 16)
    assert emulate(NVFP4BlockScaling(disable_2d_quantization=True), x, role="weight").block == (1, 16)
    with pytest.raises(ValueError, match="stochastic rounding: pass seed="):
        emulate(NVFP4BlockScaling(), x, role="grad")
    with pytest.raises(ValueError, match="4over6"):
        emulate(NVFP4BlockScaling(nvfp4_4over6="all"), x)


# -- scaled_mm ----------------------------------------------------------------------------------


def _e4m3_operands(m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    return (_satfinite(rng.standard_normal((m, k)) * 8, "e4m3"), _satfinite(rng.standard_normal((k, n)) * 8, "e4m3"))


def _exact_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    va = a.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    vb = b.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return va @ vb  # every partial sum is exact in float64


def test_scaled_mm_exact_accumulator_and_ulp_budget() -> None:
    a, b = _e4m3_operands(16, 64, 32)
    want = _exact_product(a, b).astype(F32)
    one = np.float32(1.0)
    kw = dict(out_dtype="float32", accumulator="exact", a_format="e4m3", b_format="e4m3")
    assert_matches_emulator(want, "scaled_mm", a, b, one, one, **kw)
    off = want.copy()
    off.view(np.uint32)[3, 5] += np.uint32(2)
    msg = _raises(assert_matches_emulator, off, "scaled_mm", a, b, one, one, ulp_budget=1, **kw)
    assert "worst: [3, 5]:" in msg and "| 2 ULP" in msg
    assert_matches_emulator(off, "scaled_mm", a, b, one, one, ulp_budget=2, **kw)


def test_scaled_mm_torch_operands_and_fp8_output() -> None:
    a, b = _e4m3_operands(16, 32, 16)
    ta = torch.from_numpy(a).view(torch.float8_e4m3fn)
    tb = torch.from_numpy(np.ascontiguousarray(b.T)).view(torch.float8_e4m3fn).t()  # column-major
    one = torch.tensor(1.0)
    want = _satfinite(_exact_product(a, b).astype(F32), "e4m3")
    assert_matches_emulator(want, "scaled_mm", ta, tb, one, one, accumulator="exact")
    positional = (ta, tb, one, one, None, None, torch.float8_e4m3fn)  # bias, scale_result, out_dtype
    assert_matches_emulator(
        torch.from_numpy(want).view(torch.float8_e4m3fn), "scaled_mm", *positional, accumulator="exact"
    )


# -- errors -------------------------------------------------------------------------------------


def test_errors_name_the_fix() -> None:
    x = np.float32([1.0])
    with pytest.raises(TypeError, match=r"needs fmt="):
        emulate("cast", x)
    with pytest.raises(TypeError, match="unknown option.*rouding.*accepted: fmt, rounding"):
        emulate("cast", x, fmt="e4m3", rouding="up")
    with pytest.raises(ValueError, match="convention= fixes rounding and saturate; drop saturate"):
        emulate("cast", x, fmt="e4m3", convention="torchao", saturate=True)
    with pytest.raises(TypeError, match=r"pass an instance, e.g. Float8CurrentScaling\(\)"):
        emulate(Float8CurrentScaling, x)
    with pytest.raises(ValueError, match="unknown op 'matmul'"):
        emulate("matmul", x)
    with pytest.raises(TypeError, match="takes one input tensor, got 2"):
        emulate("cast", x, x, fmt="e4m3")
    with pytest.raises(ValueError, match="unknown role 'output'"):
        emulate(MXFP8BlockScaling(), np.zeros((2, 32), F32), role="output")
