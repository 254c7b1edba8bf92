"""Names fp8sim gives to what a user picks: a promotion variant of an accumulator preset, the hint for an
mmaemu profile name given where an fp8sim profile is expected, and a scalar bias of a one-column GEMM."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.gemm import PROFILES, get_accumulator, get_profile, scaled_mm


def test_a_promotion_variant_is_named_after_its_preset_and_interval() -> None:
    base = get_accumulator("hopper_fast")
    for every in (64, None):
        acc = base.with_promotion(every)
        assert acc.name == f"hopper_fast@{every}" and acc.promote_every == every


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("hopper", " (mmaemu's 'hopper' is fp8sim's 'h100_pcie_cublaslt_12_8')"),
        ("ada-te", " (mmaemu's 'ada-te' is fp8sim's 'rtx4060_cublaslt_12_8_te')"),
        ("a100", ""),
    ],
)
def test_an_unknown_profile_names_the_known_ones_and_mmaemus_counterpart(name: str, hint: str) -> None:
    with pytest.raises(ValueError) as err:
        get_profile(name)
    assert str(err.value) == f"unknown profile {name!r}{hint}; known: {', '.join(PROFILES)}"


@pytest.mark.parametrize("bias", [0.5, np.float32(0.5), np.array([0.5], np.float32)])
def test_a_scalar_bias_is_the_one_column_bias(bias: object) -> None:
    a, b = np.full((2, 32), 0x38, np.uint8), np.full((32, 1), 0x38, np.uint8)  # E4M3 1.0: each sum is 32
    kw = {"out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3", "strict": False}
    got = scaled_mm(a, b, np.float32(1), np.float32(1), bias=bias, **kw)
    assert np.array_equal(got, np.full((2, 1), 32.5, np.float32))
    with pytest.raises(RuntimeError, match="^Bias must be size 2 but got 1$"):
        scaled_mm(a, np.full((32, 2), 0x38, np.uint8), np.float32(1), np.float32(1), bias=bias, **kw)
