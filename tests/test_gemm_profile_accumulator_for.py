"""``DeviceProfile.accumulator_for``: the preset for ``use_fast_accum`` under float32 accumulation, the device's
float16-accumulate preset, and the whole refusals (the argument and its allowed values; where no float16 rule is
known, where the measurements are and which devices are modelled)."""

from __future__ import annotations

import pytest

from fp8sim.gemm.profiles import DeviceProfile


def test_the_preset_follows_use_fast_accum_and_the_accumulate_width() -> None:
    p = DeviceProfile("mine", "hopper_fast", "hopper_split", f16_accumulate="ada_fast_f16")
    assert p.accumulator_for(True) == "hopper_fast"
    assert p.accumulator_for(False) == "hopper_split"
    assert p.accumulator_for(True, "float16") == p.accumulator_for(False, "float16") == "ada_fast_f16"


def test_an_unknown_accumulate_width_is_named_with_the_allowed_values() -> None:
    p = DeviceProfile("mine", "hopper_fast", "hopper_split")
    with pytest.raises(ValueError) as info:
        p.accumulator_for(True, "bfloat16")
    assert str(info.value) == "accumulate must be 'float32' or 'float16'; got 'bfloat16'"


def test_a_profile_without_a_float16_rule_says_where_the_rule_is_known() -> None:
    p = DeviceProfile("mine", "hopper_fast", "hopper_split")
    with pytest.raises(ValueError) as info:
        p.accumulator_for(False, "float16")
    assert str(info.value) == (
        "profile 'mine' has no float16-accumulate model: its mma.sync .f16 rule is not known "
        "(reports/hardware_f16_accumulate.md); modelled on Ada (rtx4060_cublaslt_12_8, l40s: ada_fast_f16)"
    )


def test_decide_names_where_a_split_came_from() -> None:
    """``DeviceProfile.decide``'s ``SplitChoice``: a split given with ``with_splits`` is an ``override`` (the
    five-key entry before the shape's), any zero-size GEMM accumulates nothing, a shape of ones is a real GEMM."""
    from fp8sim.gemm.profiles import SplitChoice, SplitKUnknownError

    p = DeviceProfile("mine", "hopper_fast", "hopper_split").with_splits(
        {(16, 32, 64, "float32", True): (2, "serial"), (16, 32, 64): (4, "serial")}
    )
    given = "given with DeviceProfile.with_splits"
    assert p.decide(16, 32, 64, "float32", True) == SplitChoice(2, "serial", "override", given)
    assert p.decide(16, 32, 64, "float32", False) == SplitChoice(4, "serial", "override", given)
    zero = SplitChoice(1, "none", "zero-size", "nothing is accumulated")
    for m, n, k in ((0, 32, 64), (16, 0, 64), (16, 32, 0), (0, 0, 0)):
        assert p.decide(m, n, k, "float32", True) == zero
    for m, n, k in ((1, 32, 64), (16, 1, 64), (16, 32, 1), (1, 1, 1)):
        with pytest.raises(SplitKUnknownError, match=f"for {m}x{n}x{k}|M={m}|{m}, {n}, {k}"):
            p.decide(m, n, k, "float32", True)
