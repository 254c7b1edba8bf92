"""The ``"e4m3x16"`` NVFP4 variant is TE's NVFP4 (module docstring of ``fp8sim.scaling.nvfp4_variants``): with
16x16 tiles, RHT, stochastic rounding, a given global amax, 3-D input and signed zeros it equals
``quantize_nvfp4(flavor="te")`` (itself checked against TE's kernels in ``tests/test_scaling_nvfp4.py``); and every
refusal of ``quantize_nvfp4_variant`` names its argument."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.scaling.nvfp4 import quantize_nvfp4
from fp8sim.scaling.nvfp4_variants import quantize_nvfp4_variant


def _x(shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))).astype(np.float32)
    x.reshape(-1)[:5] = [0.0, -0.0, 1e-30, -1e-30, 0.0]
    return x


@pytest.mark.parametrize(
    "kw",
    [
        {"block_2d": True},
        {"block_2d": True, "global_amax": 1000.0},
        pytest.param({"rht": True}, marks=pytest.mark.torch),  # the Hadamard transform runs in torch
        {"stochastic": True, "seed": 5},
        {"block_2d": True, "stochastic": True, "seed": 7},
        {},
    ],
    ids=["2d", "2d-amax", "rht", "sr", "2d-sr", "plain"],
)
@pytest.mark.parametrize("shape", [(32, 48), (2, 16, 32)])
def test_e4m3x16_is_tes_nvfp4(kw: dict, shape: tuple) -> None:
    x = _x(shape)
    got = quantize_nvfp4_variant(x, "e4m3x16", **kw)
    want = quantize_nvfp4(x, **kw)
    assert got.block == want.block and got.shape == want.shape == shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.scales, want.scales)
    np.testing.assert_array_equal(got.codes, want.codes)
    assert np.float32(got.global_scale) == np.float32(want.global_scale)
    assert np.float32(got.global_amax) == np.float32(want.global_amax)


@pytest.mark.parametrize(
    ("args", "kw", "exc", "msg"),
    [
        (("e4m3x16",), {"seed": 1}, ValueError, r"^seed is used only with stochastic=True$"),
        (
            ("ue5m3x16",),
            {"second_level_scale": False, "global_amax": 1.0},
            ValueError,
            r"^global_amax is unused with second_level_scale=False \(TE: disable_second_level_scale\)$",
        ),
        (
            ("e4m3x32",),
            {"block_2d": True},
            ValueError,
            r"^variant 'e4m3x32' \(E4M3 per 32\) supports no block_2d \(16x16 tiles\); use a 16-element variant$",
        ),
        (
            ("e4m3x32",),
            {"swizzle": True},
            ValueError,
            r"^variant 'e4m3x32' \(E4M3 per 32\) supports no swizzle \(its 4xNVFP4 scale layout is not emulated\)",
        ),
        (("ue5m3x16",), {"global_amax": -1.0}, ValueError, r"^global_amax must be one value >= 0 \(Inf allowed"),
        (("ue5m3x16",), {"global_amax": float("nan")}, ValueError, r"^global_amax must be one value >= 0"),
    ],
)
def test_variant_refusals_name_the_argument(args: tuple, kw: dict, exc: type, msg: str) -> None:
    with pytest.raises(exc, match=msg):
        quantize_nvfp4_variant(np.ones((32, 64), np.float32), *args, **kw)


def test_variant_shape_refusals() -> None:
    with pytest.raises(ValueError, match=r"^x: last dim 40 must be divisible by the e4m3x32 block size 32 \(shape"):
        quantize_nvfp4_variant(np.ones((2, 40), np.float32), "e4m3x32")
    with pytest.raises(ValueError, match=r"^x: dim -2 \(8\) must be divisible by 16 for 16x16 tiles$"):
        quantize_nvfp4_variant(np.ones((8, 32), np.float32), "e4m3x16", block_2d=True)
    with pytest.raises(ValueError, match=r"^x: dim -2 \(None\) must be divisible by 16 for 16x16 tiles$"):
        quantize_nvfp4_variant(np.ones(32, np.float32), "e4m3x16", block_2d=True)
    with pytest.raises((TypeError, ValueError), match="TE's high-precision dtypes"):
        quantize_nvfp4_variant(np.ones((2, 32), np.int32), "e4m3x16")


@pytest.mark.parametrize(
    ("x", "kw"),
    [
        (np.linspace(-0.01, 0.02, 512, dtype=np.float32).reshape(16, 32), {}),  # amax below 1
        (np.zeros((16, 32), np.float32), {}),  # amax 0: S_enc 1
        (np.full((16, 32), np.nan, np.float32), {}),  # NaN skipped: amax 0
        (np.zeros((0, 32), np.float32), {}),  # empty
        (np.linspace(-3, 3, 512, dtype=np.float32).reshape(16, 32), {"global_amax": 0.0}),
        (np.linspace(-3, 3, 512, dtype=np.float32).reshape(16, 32), {"global_amax": float("inf")}),
        (np.linspace(-3, 3, 512, dtype=np.float32).reshape(16, 32), {"global_amax": 1000.1}),  # rounded to float32
        (np.linspace(-3, 3, 512, dtype=np.float32).reshape(16, 32), {"global_amax": 1e-42}),
        (np.array([[np.inf, -np.inf, 1e-45] + [1.0] * 29] * 16, np.float32), {}),
    ],
    ids=["small", "zeros", "nan", "empty", "amax0", "amaxinf", "amax-f64", "amax-tiny", "inf"],
)
def test_e4m3x16_edges_equal_tes_nvfp4_without_warnings(x: np.ndarray, kw: dict) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = quantize_nvfp4_variant(x, "e4m3x16", **kw)
    want = quantize_nvfp4(x, **kw)
    np.testing.assert_array_equal(got.scales, want.scales)
    np.testing.assert_array_equal(got.codes, want.codes)
    assert np.float32(got.global_scale) == np.float32(want.global_scale)
    assert np.float32(got.global_amax) == np.float32(want.global_amax)


def test_variant_takes_bf16_and_fp16_and_checks_every_flag() -> None:
    import ml_dtypes

    x = np.linspace(-3, 3, 512, dtype=np.float32).reshape(16, 32)
    for dt in (ml_dtypes.bfloat16, np.float16):
        got = quantize_nvfp4_variant(x.astype(dt), "e4m3x16")
        want = quantize_nvfp4(x.astype(dt))
        assert got.dtype == want.dtype and np.array_equal(got.codes, want.codes)
    for flag in ("second_level_scale", "block_2d", "rht", "stochastic", "swizzle"):
        with pytest.raises(TypeError, match=rf"^{flag} must be True or False, got 'yes'"):
            quantize_nvfp4_variant(x, "e4m3x16", **{flag: "yes"})
