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
