"""TE's 4over6 NVFP4 (``fp8sim.scaling.nvfp4_4over6``) against a per-block reference written here from
``transformer_engine/common/cast/nvfp4/quantize_4over6_nvfp4.cuh`` (``compute_scale_pair``,
``cvt_fp32_to_fp4_8x_with_error`` without fast math, ``accumulate_dequant_error``, ``err_map4 < err_map6``)
and ``core_nvfp4.cuh`` (``compute_global_encode_scaling_factor_FP4``), one float32 operation at a time,
with ml_dtypes' E4M3 / E2M1 casts (after TE's clamps) as the rounding oracle.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.scaling.nvfp4_4over6 import quantize_nvfp4_4over6

F = np.float32


def _e4m3(v: np.float32) -> tuple[int, np.float32]:
    c = np.array(min(v, F(448)), np.float32).astype(ml_dtypes.float8_e4m3fn)
    return int(c.view(np.uint8)), F(c.astype(np.float32))


def _e2m1(v: np.float32) -> tuple[int, np.float32]:
    if np.isnan(v):
        return 0x7, F(6)
    c = np.array(np.clip(v, F(-6), F(6)), np.float32).astype(ml_dtypes.float4_e2m1fn)
    return int(c.view(np.uint8)) & 0xF, F(c.astype(np.float32))


def _reference(x: np.ndarray, mode: str, emax: int):
    flat = x.astype(np.float32).reshape(-1, 16)
    amax = F(0)
    for v in flat.reshape(-1):
        amax = F(np.fmax(amax, abs(v)))
    num = F(6 * emax)
    s_enc = F(min(F(num / amax), np.finfo(np.float32).max)) if amax != 0 else F(1)
    if s_enc == 0:
        s_enc = F(1)
    s_dec = F(F(1) / s_enc)
    codes, scales = [], []
    for blk in flat:
        bmax = F(0)
        for v in blk:
            bmax = F(np.fmax(bmax, abs(v)))
        base = F(F(bmax / F(6)) * s_enc)
        cands = []
        for s_in in (F(min(F(base * F(1.5)), F(448))), F(min(base, F(448)))):
            sc, sf = _e4m3(s_in)
            with np.errstate(divide="ignore"):
                inv = F(min(F(F(1) / F(sf * s_dec)), np.finfo(np.float32).max))
            err, cs = F(0), []
            for v in blk:
                c, q = _e2m1(F(v * inv))
                cs.append(c)
                d = F(F(F(F(q * sf) * amax) / num) - v)
                err = F(err + (abs(d) if mode == "MAE" else F(d * d)))
            cands.append((cs, sc, err))
        pick = cands[0] if cands[0][2] < cands[1][2] else cands[1]
        codes.append(pick[0])
        scales.append(pick[1])
    return np.array(codes, np.uint8).reshape(x.shape), np.array(scales, np.uint8), s_dec


@pytest.mark.parametrize("emax", [256, 448])
@pytest.mark.parametrize("mode", ["MAE", "MSE"])
def test_4over6_equals_kernel_reference(mode, emax):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 64)) * np.exp(2 * rng.standard_normal((8, 64)))).astype(np.float32)
    x[0, :16] = 0
    x[1, 3] = np.nan
    q = quantize_nvfp4_4over6(x, err_mode=mode, e4m3_max=emax)
    codes, scales, s_dec = _reference(x, mode, emax)
    assert np.array_equal(q.codes, codes)
    assert np.array_equal(q.scales.reshape(-1), scales)
    assert np.float32(q.global_scale) == s_dec


def test_both_candidates_are_chosen_somewhere():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    q = quantize_nvfp4_4over6(x)
    # map-to-4 blocks put the block max near FP4 4 (code 6), map-to-6 near 6 (code 7)
    top = (q.codes & 0x7).reshape(-1, 16).max(axis=1)
    assert (top == 6).any() and (top == 7).any()


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown err_mode 'L2'; known: MAE, MSE"):
        quantize_nvfp4_4over6(np.zeros((1, 16), np.float32), err_mode="L2")
    with pytest.raises(ValueError, match="e4m3_max must be 256 or 448"):
        quantize_nvfp4_4over6(np.zeros((1, 16), np.float32), e4m3_max=300)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4_4over6(np.zeros((1, 8), np.float32))
