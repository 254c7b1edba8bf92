"""``dot_add``'s refusals, whole messages: codes outside the format's 2^bits codes (E4M3 256, E2M1 16), and
float16 accumulation on the round-to-nearest models, whose float16 rule is not known."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.gemm.instructions import dot_add

ONES = np.full((2, 32), 0x38, np.uint8)  # E4M3 1.0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"a": np.full((2, 32), 256)}, "a holds codes outside [0, 255] for e4m3"),
        ({"a": np.full((2, 32), -1)}, "a holds codes outside [0, 255] for e4m3"),
        ({"b": np.full((2, 32), 16), "b_format": "e2m1"}, "b holds codes outside [0, 15] for e2m1"),
    ],
)
def test_codes_outside_the_format_are_refused(kw: dict, message: str) -> None:
    args = {"a": ONES, "b": ONES, "c": 0.0, "model": "hopper_wgmma", **kw}
    with pytest.raises(ValueError) as err:
        dot_add(**args)
    assert str(err.value) == message


def test_the_top_codes_are_taken() -> None:
    out = dot_add(np.full((1, 32), 255), np.full((1, 32), 0x38), 0.0, model="hopper_wgmma")
    assert np.isnan(out).all()  # 0xFF is E4M3's NaN
    out = dot_add(ONES[:1], np.full((1, 32), 15), 0.0, model="hopper_wgmma", b_format="e2m1")
    assert out.tolist() == [-6.0 * 32]  # 0xF is E2M1's -6


@pytest.mark.parametrize("model", ["blackwell_mma", "blackwell_mma_km"])
def test_float16_accumulation_of_the_round_to_nearest_models_is_refused(model: str) -> None:
    with pytest.raises(ValueError) as err:
        dot_add(ONES, ONES, 0.0, model=model, out_dtype="float16")
    assert str(err.value) == (
        f"{model}: float16 accumulation is not modelled (the rule is open; see reports/hardware_f16_accumulate.md)"
    )
