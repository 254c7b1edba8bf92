"""TE current scaling (spec 5.1), torchao float8 scale math (6.2) and FP8 block scaling (5.3)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import fp8sim
from fp8sim.scaling.block import quantize_block_scaling
from fp8sim.scaling.current import (
    compute_scale_from_amax,
    quantize_current_scaling,
    quantize_torchao,
    torchao_amax_to_scale,
)
from fp8sim.testing.oracles import require

FLT_MAX = float(np.finfo(np.float32).max)

# spec 5.1, by hand: (amax, pow2, eps, expected scale)
TE_SCALE_CASES = [
    (0.0, False, 0.0, 1.0),
    (math.inf, False, 0.0, 1.0),
    (math.nan, False, 0.0, 1.0),
    (448.0, False, 0.0, 1.0),
    (1.0, False, 0.0, 448.0),
    (3.0, True, 0.0, 128.0),  # 149.33 rounded down to 2^7
    (0.75, True, 0.0, 512.0),  # 597.33 -> 2^9
    (1e-45, False, 0.0, FLT_MAX),  # 448 / 1e-45 overflows -> value_for_inf
    (1e-45, True, 0.0, 2.0**127),  # FLT_MAX masked to its exponent
    (0.0, False, 0.5, 896.0),  # eps replaces a zero amax
]


@pytest.mark.parametrize(("amax", "pow2", "eps", "want"), TE_SCALE_CASES)
def test_compute_scale_from_amax_spec_cases(amax: float, pow2: bool, eps: float, want: float) -> None:
    assert float(compute_scale_from_amax(np.float32(amax), 448.0, pow2=pow2, eps=eps)) == want


def test_compute_scale_from_amax_is_ieee_float32_division() -> None:
    torch = require("torch")
    rng = np.random.default_rng(3)
    amax = np.abs(rng.standard_normal(100_000) * np.exp2(rng.integers(-60, 60, 100_000))).astype(np.float32)
    want = (torch.tensor(448.0, dtype=torch.float32) / torch.from_numpy(amax)).numpy()
    want = np.where(np.isinf(want), np.float32(FLT_MAX), want)
    got = compute_scale_from_amax(amax, 448.0)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    p2 = compute_scale_from_amax(amax, 448.0, pow2=True)
    assert np.array_equal(p2, np.exp2(np.floor(np.log2(want.astype(np.float64)))).astype(np.float32))


def test_current_scaling_quantize_casts_with_satfinite_and_stores_scale_inv() -> None:
    x = np.array([1.0, -2.0, 0.3, np.nan, 4.0], np.float32)  # NaN skipped by the amax: 4
    q = quantize_current_scaling(x, "e4m3")
    scale = np.float32(448) / np.float32(4)
    assert q.scales.reshape(-1)[0] == np.float32(1) / scale
    # oracle: ml_dtypes after a clamp (satfinite == clamp then nearest-even, spec 2.3)
    want = np.clip(x * scale, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(q.codes, want)
    assert q.block == (5,) and q.shape == (5,)
    zero = quantize_current_scaling(np.zeros(4, np.float32))
    assert zero.scales.reshape(-1)[0] == 1.0


# ---- torchao: against its own functions --------------------------------------------------------


def _inputs():  # noqa: ANN202
    rng = np.random.default_rng(9)
    base = (rng.standard_t(2, size=(64, 96)) * np.exp2(rng.integers(-8, 8, (64, 1)))).astype(np.float32)
    special = base.copy()
    special[3, 5], special[7, 1], special[10, :] = np.inf, np.nan, 0.0
    return [base, special, np.zeros((4, 8), np.float32)]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("pow2", [False, True])
def test_torchao_tensorwise_and_rowwise_match_torchao(fmt: str, pow2: bool) -> None:
    torch = require("torch")
    fu = require("torchao.float8.float8_utils")
    from torchao.float8.config import ScalingGranularity

    dt = fp8sim.get_format(fmt).torch_dtype
    for x in _inputs():
        for in_dtype in (torch.float32, torch.bfloat16):
            xt = torch.from_numpy(x).to(in_dtype)
            for gran, dim in (
                (ScalingGranularity.TENSORWISE, None),
                (ScalingGranularity.AXISWISE, -1),
                (ScalingGranularity.AXISWISE, 0),
            ):
                scale = fu.tensor_to_scale(
                    xt, dt, scaling_granularity=gran, axiswise_dim=dim, round_scales_to_power_of_2=pow2
                )
                data = fu.to_fp8_saturated(xt.float() * scale, dt).view(torch.uint8).numpy()
                g = "tensorwise" if dim is None else "axiswise"
                q = quantize_torchao(
                    xt, fmt, granularity=g, axiswise_dim=dim if dim is not None else -1, round_scales_to_power_of_2=pow2
                )
                want_s = scale.numpy().reshape(q.scales.shape)
                assert np.array_equal(q.scales.view(np.uint32), want_s.view(np.uint32)) or (
                    np.isnan(q.scales).any() and np.array_equal(np.isnan(q.scales), np.isnan(want_s))
                ), f"{g} dim={dim} {in_dtype}: scales differ"
                nan_both = np.isnan(fp8sim.decode(q.codes, fmt)) & np.isnan(fp8sim.decode(data, fmt))
                assert ((q.codes == data) | nan_both).all(), f"{g} dim={dim} {in_dtype}: codes differ"
                deq = (torch.from_numpy(data).view(dt).float() / scale).numpy()
                got = q.dequantize()
                assert np.array_equal(np.isnan(got), np.isnan(deq)) and np.array_equal(
                    got[~np.isnan(got)], deq[~np.isnan(deq)]
                )


def test_torchao_special_amax_values_spec_6_2() -> None:
    s = torchao_amax_to_scale(np.array([0.0, np.inf, np.nan], np.float32), "e4m3")
    assert s[0] == np.float32(448e12) and s[1] == 0.0 and math.isnan(s[2])
    assert torchao_amax_to_scale(np.float32(0), "e5m2") == np.float32(5.7344e16)


def test_torchao_bad_arguments() -> None:
    with pytest.raises(ValueError, match="granularity must be 'tensorwise' or 'axiswise'"):
        quantize_torchao(np.ones(4, np.float32), granularity="rowwise")
    with pytest.raises(ValueError, match="axiswise_dim 2 out of range"):
        quantize_torchao(np.ones((4, 4), np.float32), granularity="axiswise", axiswise_dim=2)


# ---- FP8 block scaling: an independent reference of spec 5.3 written here -----------------------


def _ref_block(x: np.ndarray, bm: int, bn: int, pow2: bool, value_for_inf: float) -> tuple[np.ndarray, np.ndarray]:
    """Plain loops over blocks; scale per spec 5.1/5.3 with Python floats and explicit rounding."""
    m, n = x.shape
    scales = np.zeros((-(-m // bm), -(-n // bn)), np.float32)
    codes = np.zeros((scales.shape[0] * bm, scales.shape[1] * bn), np.uint8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            blk = x[i * bm : (i + 1) * bm, j * bn : (j + 1) * bn]
            finite_or_inf = np.abs(blk[~np.isnan(blk)])
            amax = float(finite_or_inf.max()) if finite_or_inf.size else 0.0
            if amax == 0 or math.isinf(amax):
                s = 1.0
            else:
                s = float(np.float32(448.0) / np.float32(amax))
                if math.isinf(s):
                    s = value_for_inf
                if pow2:
                    s = 2.0 ** math.floor(math.log2(s)) if s > 0 else s
            scales[i, j] = np.float32(1.0) / np.float32(s)
            scaled = blk.astype(np.float32) * np.float32(s)
            clipped = np.clip(scaled, -448, 448)  # satfinite == clamp then RN (spec 2.3)
            codes[i * bm : i * bm + blk.shape[0], j * bn : j * bn + blk.shape[1]] = clipped.astype(
                ml_dtypes.float8_e4m3fn
            ).view(np.uint8)
    return scales, codes


@pytest.mark.parametrize(
    ("kw", "bm", "bn"), [({}, 1, 128), ({"block_dim": 2}, 128, 128), ({"columnwise": True}, 128, 1)]
)
@pytest.mark.parametrize("pow2", [True, False])
def test_block_scaling_matches_reference(kw: dict, bm: int, bn: int, pow2: bool) -> None:
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((200, 300)) * np.exp2(rng.integers(-20, 20, (200, 1)))).astype(np.float32)
    x[0, :128] = 0.0
    x[5, 7], x[9, 200], x[150, 3] = np.inf, np.nan, -np.inf
    x[130:140, 260:300] = 1e-44  # tiny amax: 448/amax overflows
    q = quantize_block_scaling(x, "e4m3", pow2=pow2, **kw)
    scales, codes = _ref_block(x, bm, bn, pow2, FLT_MAX)
    assert np.array_equal(q.scales.view(np.uint32), scales.view(np.uint32))
    nan_both = np.isnan(fp8sim.decode(q.codes, "e4m3")) & np.isnan(fp8sim.decode(codes, "e4m3"))
    assert ((q.codes == codes) | nan_both).all()
    assert q.dequantize().shape == x.shape


def test_block_scaling_value_for_inf_is_the_input_dtype_max() -> None:
    torch = require("torch")
    x = torch.full((1, 128), 1e-38, dtype=torch.bfloat16)  # 448/1e-38 overflows float32
    q = quantize_block_scaling(x, pow2=False)
    bf16_max = float(torch.finfo(torch.bfloat16).max)
    assert q.scales[0, 0] == np.float32(1) / np.float32(bf16_max)
    assert quantize_block_scaling(x, pow2=True).scales[0, 0] == np.float32(2.0**-127)


def test_block_scaling_bad_arguments() -> None:
    with pytest.raises(ValueError, match="block_dim must be 1"):
        quantize_block_scaling(np.ones((4, 4), np.float32), block_dim=3)
    with pytest.raises(ValueError, match="need a 2-D tensor"):
        quantize_block_scaling(np.ones((2, 4, 4), np.float32), block_dim=2)
    assert quantize_block_scaling(np.ones((2, 3, 130), np.float32)).scales.shape == (2, 3, 2)
