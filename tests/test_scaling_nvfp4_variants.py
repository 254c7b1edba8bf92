"""NVFP4 variants (fp8sim.scaling.nvfp4_variants): UE5M3 scales per 16 and E4M3 scales per 32.

The quantization reference below is written from TransformerEngine PR#3325 at its head
b47e1f88b71134da6853d42c57ad5810f9802e68: ``common/cast/nvfp4/core_nvfp4.cuh`` lines 54-94
(``compute_decoding_scaling_factor`` / ``compute_global_encode_scaling_factor_FP4`` templated on the scale
type, ``TypeExtrema<fp8ue5m3>::max = 114688`` in ``common/common.h``), ``quantize_transpose_nvfp4.cuh``
(``S_enc = 1`` without an amax; ``enc = fminf(1 / (s_blk * S_dec), FLT_MAX)``) and
``dequantize_nvfp4.cuh`` (``final = s_blk * amax * (1 / (6 * SCALE_MAX))``, ``amax = 6 * SCALE_MAX`` when
the tensor has none).  Element and scale casts use ml_dtypes (float4_e2m1fn, float8_e5m3fnu,
float8_e4m3fn) as oracles; GEMMs use Fraction sums rounded once to float32.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from fp8sim.formats import E4M3, UE5M3
from fp8sim.gemm import scaled_mm
from fp8sim.scaling.nvfp4 import quantize_nvfp4
from fp8sim.scaling.nvfp4_variants import dequantize_nvfp4_variant, quantize_nvfp4_variant
from fp8sim.scaling.packing import pack_fp4, unpack_fp4
from fp8sim.scaling.swizzle import from_blocked
from fp8sim.testing.oracles import require_feature

# the UE5M3 oracle: ml_dtypes 0.7.0 has float8_e5m3fnu (older releases skip the module with the reason, CI too)
E5M3FNU = require_feature("ml_dtypes", "float8_e5m3fnu", since="0.7.0", reason="oracle for the UE5M3 block scales")

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
SCALE = {"ue5m3x16": (E5M3FNU, 114688.0, 16), "e4m3x32": (ml_dtypes.float8_e4m3fn, 448.0, 32)}


def ref_quantize(x: np.ndarray, variant: str, second_level: bool = True, amax=None):
    """TE PR#3325's rule, element by element in float32, casts by ml_dtypes (satfinite: clamp first)."""
    sdt, smax, bs = SCALE[variant]
    x = x.astype(np.float32)
    rows, k = x.shape
    if second_level:
        mags = np.abs(x.reshape(-1))
        amax = F32(max([F32(0)] + [m for m in mags if not np.isnan(m)])) if amax is None else F32(amax)
        with np.errstate(divide="ignore", over="ignore"):
            s_enc = F32(min(F32(F32(6 * smax) / amax), FLT_MAX))
        if amax == 0 or s_enc == 0:
            s_enc = F32(1)
    else:
        s_enc = F32(1)
    s_dec = F32(F32(1) / s_enc)
    codes = np.zeros((rows, k), np.uint8)
    scales = np.zeros((rows, k // bs), np.uint8)
    for r in range(rows):
        for b in range(k // bs):
            blk = x[r, b * bs : (b + 1) * bs]
            vm = F32(max([F32(0)] + [abs(v) for v in blk if not np.isnan(v)]))
            s = F32(min(F32(vm * F32(s_enc * F32(F32(1) / F32(6)))), FLT_MAX))
            sc = np.array([min(s, F32(smax))], np.float32).astype(sdt)
            scales[r, b] = sc.view(np.uint8)[0]
            with np.errstate(divide="ignore", over="ignore"):
                enc = F32(min(F32(F32(1) / F32(F32(sc.astype(np.float32)[0]) * s_dec)), FLT_MAX))
            for i, xv in enumerate(blk):
                with np.errstate(over="ignore", invalid="ignore"):
                    v = F32(min(max(F32(xv * enc), F32(-6)), F32(6)))
                if v == 0 or np.isnan(v):
                    continue  # TE's cast_to_fp4x2: ±0 and NaN give code 0
                codes[r, b * bs + i] = np.array([v], np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)[0]
    return codes, scales, s_dec, (amax if second_level else None)


def _data(shape, seed, spread=8):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, (shape[0], 1)))
    return x.astype(np.float32)


def _diff(got, want, fmt):
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    first = bad[:1]
    return f"{bad.size} differ ({fmt}); first at {first}: got {got.reshape(-1)[first]}, want {want.reshape(-1)[first]}"


@pytest.mark.parametrize("variant", ["ue5m3x16", "e4m3x32"])
@pytest.mark.parametrize("second_level", [True, False])
def test_variant_quantize_matches_te_pr3325_rule_with_ml_dtypes_casts(variant, second_level):
    x = _data((8, 64), 1)
    x[0, 3], x[2, :16] = np.nan, 0.0
    qt = quantize_nvfp4_variant(x, variant, second_level_scale=second_level)
    codes, scales, s_dec, amax = ref_quantize(x, variant, second_level)
    assert np.array_equal(qt.scales, scales), _diff(qt.scales, scales, variant + " scales")
    assert np.array_equal(qt.codes, codes), _diff(qt.codes, codes, "e2m1")
    assert qt.global_scale == s_dec and qt.global_amax == amax
    assert qt.scale_format == (UE5M3 if variant == "ue5m3x16" else E4M3) and qt.block[-1] == SCALE[variant][2]


def test_ue5m3_reaches_scales_e4m3_flushes_and_is_no_e4m3_fallback():
    """Negative control: a block 2^-20 below the amax keeps a nonzero UE5M3 scale (448 * 2^-20 < 2^-10, half
    E4M3's smallest subnormal, flushes; 114688 * 2^-20 = 7 * 2^-6 is a UE5M3 value)."""
    x = np.ones((16, 32), np.float32)
    x[:, 16:] *= F32(2.0**-20)
    ue = quantize_nvfp4_variant(x, "ue5m3x16")
    e4 = quantize_nvfp4(x)
    assert (e4.scales[:, 1] == 0).all() and (ue.scales[:, 1] == 0x5E).all()  # 0x5E: 1.75 * 2^-4 in UE5M3
    assert (e4.dequantize()[:, 16:] == 0).all()
    assert np.allclose(ue.dequantize()[:, 16:], 2.0**-20, rtol=2.0**-22, atol=0)


def test_e4m3x32_blocks_span_32_and_is_no_16_element_fallback():
    x = np.ones((16, 64), np.float32)
    x[:, 16:32] = 100.0  # one 16-block large: per-32 blocks share its scale with the ones before it
    q32, q16 = quantize_nvfp4_variant(x, "e4m3x32"), quantize_nvfp4_variant(x, "e4m3x16")
    assert q32.scales.shape == (16, 2) and q16.scales.shape == (16, 4)
    # ones beside 100s in one 32-block: 1 / (100 / 6) is below E2M1's 0.25 rounding point -> 0
    assert (q32.dequantize()[:, :16] == 0).all()
    assert np.allclose(q16.dequantize()[:, :16], 1.0, rtol=2**-6, atol=0)


def test_given_global_amax_and_saturating_ue5m3_scale():
    x = np.full((16, 16), 1000.0, np.float32)
    qt = quantize_nvfp4_variant(x, "ue5m3x16", global_amax=1e-3)  # scale would be 1e6 * ...: saturates
    codes, scales, _, _ = ref_quantize(x, "ue5m3x16", amax=1e-3)
    assert np.array_equal(qt.scales, scales) and scales[0, 0] == 0xFE  # 114688, the max finite code


@pytest.mark.parametrize("variant", ["ue5m3x16", "e4m3x32"])
@pytest.mark.parametrize("second_level", [True, False])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_dequantize_is_te_pr3325_dequantize_kernel(variant, second_level, out_dtype):
    sdt, smax, _ = SCALE[variant]
    x = _data((16, 64), 2)
    qt = quantize_nvfp4_variant(x, variant, second_level_scale=second_level)
    amax = F32(6 * smax) if qt.global_amax is None else F32(qt.global_amax)
    factor_inv = F32(F32(1) / F32(6 * smax))
    bs = qt.block[-1]
    want = np.zeros(x.shape, np.float32)
    vals = qt.codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    svals = qt.scales.view(sdt).astype(np.float32)
    for r in range(16):
        for c in range(64):
            final = F32(F32(svals[r, c // bs] * amax) * factor_inv)
            want[r, c] = F32(vals[r, c] * final)
    got = dequantize_nvfp4_variant(qt, out_dtype=out_dtype)
    want = want.astype(ml_dtypes.bfloat16) if out_dtype == "bfloat16" else want
    assert np.array_equal(
        got.view(np.uint16 if out_dtype == "bfloat16" else np.uint32),
        want.view(got.view(np.uint16 if out_dtype == "bfloat16" else np.uint32).dtype),
    )


def test_packing_and_ue5m3_swizzle_round_trip():
    x = _data((128, 64), 3)
    qt = quantize_nvfp4_variant(x, "ue5m3x16", swizzle=True)
    assert np.array_equal(unpack_fp4(pack_fp4(qt.codes)), qt.codes)
    assert np.array_equal(from_blocked(qt.blocked_scales, 128, 4), qt.scales)
    # the 128x4 layout itself (cuBLAS): row r, column c of a tile at (r % 32) * 16 + (r // 32) * 4 + c
    assert qt.blocked_scales[(37 % 32) * 16 + (37 // 32) * 4 + 2] == qt.scales[37, 2]
    with pytest.raises(ValueError, match="swizzle"):
        quantize_nvfp4_variant(x, "e4m3x32", swizzle=True)


def test_bad_arguments_are_named():
    x = np.ones((16, 32), np.float32)
    with pytest.raises(ValueError, match="unknown NVFP4 variant 'x'; known: e4m3x16, ue5m3x16, e4m3x32"):
        quantize_nvfp4_variant(x, "x")
    with pytest.raises(ValueError, match="divisible by the e4m3x32 block size 32"):
        quantize_nvfp4_variant(np.ones((16, 48), np.float32), "e4m3x32")
    with pytest.raises(ValueError, match="second_level_scale=False"):
        quantize_nvfp4_variant(x, "ue5m3x16", second_level_scale=False, global_amax=1.0)


# -- GEMMs ----------------------------------------------------------------------------------


def f32_rn(fr: Fraction) -> np.float32:
    """Fraction -> float32, nearest even (no double rounding through float64)."""
    c = np.float32(float(fr))
    cands = [np.nextafter(c, F32(-np.inf)), c, np.nextafter(c, F32(np.inf))]
    best = min(cands, key=lambda v: (abs(Fraction(float(v)) - fr), int(np.array(v).view(np.uint32)) & 1))
    return F32(best)


def _fraction_gemm(ac, bc, sa, sb, sdt, bs):
    """sum_k (code_a * s_a) * (code_b * s_b), exact; a (M, K) codes, b (K, N) codes, scales (M, K/bs), (K/bs, N)."""
    va = ac.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    vb = bc.view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    fsa, fsb = sa.view(sdt).astype(np.float64), sb.view(sdt).astype(np.float64)
    m, k = ac.shape
    n = bc.shape[1]
    out = np.zeros((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            s = sum(
                Fraction(va[i, t]) * Fraction(fsa[i, t // bs]) * Fraction(vb[t, j]) * Fraction(fsb[t // bs, j])
                for t in range(k)
            )
            out[i, j] = f32_rn(s)
    return out


@pytest.mark.parametrize("variant,fmt", [("ue5m3x16", "ue5m3"), ("e4m3x32", "e4m3")])
def test_scaled_mm_exact_block_scaled_variant_matches_fraction_sum(variant, fmt):
    sdt, _, bs = SCALE[variant]
    a = quantize_nvfp4_variant(_data((4, 64), 4), variant)
    b = quantize_nvfp4_variant(_data((3, 64), 5), variant)
    ac, sa, bc, sb = a.codes, a.scales, np.ascontiguousarray(b.codes.T), np.ascontiguousarray(b.scales.T)
    kw = dict(strict=False, out_dtype="float32", a_format="e2m1", b_format="e2m1", accumulator="exact")
    got = scaled_mm(ac, bc, sa, sb, block_scale_format=fmt, **kw)
    want = _fraction_gemm(ac, bc, sa, sb, sdt, bs)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), _diff(got, want, variant)
    # negative control: without the option the same codes read as E4M3 per 16 / E8M0 per 32
    fallback = scaled_mm(ac, bc, sa, sb, **kw)
    assert not np.array_equal(fallback, want)


@pytest.mark.parametrize("variant,fmt", [("ue5m3x16", "ue5m3"), ("e4m3x32", "e4m3")])
def test_scaled_mm_dequantized_fp32_variant(variant, fmt):
    """dequantized_fp32: fl32(code * scale) per operand, one float32 matmul.  Scales and codes are chosen so
    every product and partial sum is exact in float32, so the BLAS order cannot matter."""
    sdt, _, bs = SCALE[variant]
    rng = np.random.default_rng(6)
    k = 64
    ac = rng.integers(0, 16, (4, k)).astype(np.uint8)
    bc = rng.integers(0, 16, (k, 3)).astype(np.uint8)
    ones = np.array([1.0, 2.0, 0.5, 1.5], np.float32).astype(sdt).view(np.uint8)
    sa, sb = rng.choice(ones, (4, k // bs)), rng.choice(ones, (k // bs, 3))
    got = scaled_mm(ac, bc, sa, sb, out_dtype="float32", a_format="e2m1", b_format="e2m1",
                    accumulator="dequantized_fp32", block_scale_format=fmt, strict=False)  # fmt: skip
    want = _fraction_gemm(ac, bc, sa, sb, sdt, bs)
    assert np.array_equal(got, want)
    if fmt == "ue5m3":  # negative control: 0x38 etc. mean other values in E4M3
        assert not np.array_equal(scaled_mm(ac, bc, sa, sb, out_dtype="float32", a_format="e2m1", b_format="e2m1",
                                            accumulator="dequantized_fp32", strict=False), want)  # fmt: skip


def test_scaled_mm_refuses_tensor_core_accumulators_and_bad_shapes():
    a = quantize_nvfp4_variant(_data((4, 64), 7), "ue5m3x16")
    bc, sb = np.ascontiguousarray(a.codes.T), np.ascontiguousarray(a.scales.T)
    kw = dict(strict=False, out_dtype="float32", a_format="e2m1", b_format="e2m1")
    with pytest.raises(NotImplementedError, match="no tensor-core instruction model"):
        scaled_mm(a.codes, bc, a.scales, sb, accumulator="blackwell", block_scale_format="ue5m3", **kw)
    with pytest.raises(ValueError, match="block_scale_format must be None or one of e8m0, e4m3, ue5m3"):
        scaled_mm(a.codes, bc, a.scales, sb, accumulator="exact", block_scale_format="fp8", **kw)
    with pytest.raises(ValueError, match="B = 16"):
        scaled_mm(a.codes, bc, a.scales[:, :2], sb[:2], accumulator="exact", block_scale_format="ue5m3", **kw)
