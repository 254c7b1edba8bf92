"""``scaled_mm``'s argument refusals, whole messages, each naming the argument it refuses (numpy operands)."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim.gemm as g

A, B = np.zeros((16, 32), np.uint8), np.zeros((32, 16), np.uint8)
MX_A, MX_B = np.full((16, 1), 127, np.uint8), np.full((1, 16), 127, np.uint8)  # E8M0 1.0 per 32 of K


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        (
            {"scale_a": "1"},
            TypeError,
            "scale_a must be a torch tensor, a numpy array or a nested list or a number; got str",
        ),
        (
            {"scale_b": True},
            TypeError,
            "scale_b must be a torch tensor, a numpy array or a nested list or a number; got bool",
        ),
        ({"use_fast_accum": "yes"}, TypeError, "use_fast_accum must be True or False, got 'yes'"),
        ({"strict": 1}, TypeError, "strict must be True or False, got 1"),
        ({"backend": "cuda"}, ValueError, "backend must be None, 'numpy' or 'torch'; got 'cuda'"),
        (
            {"scale_a": MX_A, "scale_b": MX_B, "split_k": (2, "serial"), "accumulator": "blackwell"},
            ValueError,
            "split_k applies to tensorwise and rowwise scales; these scales are mx",
        ),
    ],
)
def test_refusals_name_the_argument(kw: dict, error: type, message: str) -> None:
    args = {"scale_a": 1.0, "scale_b": 1.0, "out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3", **kw}
    with pytest.raises(error) as err:
        g.scaled_mm(A, B, **args)
    assert str(err.value) == message


@pytest.mark.parametrize("arg", ["a_format", "b_format"])
def test_an_unknown_operand_format_names_its_argument(arg: str) -> None:
    args = {"a_format": "e4m3", "b_format": "e4m3", arg: "e9m9"}
    with pytest.raises(ValueError) as err:
        g.scaled_mm(A, B, 1.0, 1.0, out_dtype="float32", **args)
    assert str(err.value).startswith(f"unknown format 'e9m9' for {arg}; known: e4m3, e5m2, ")
