"""Error messages of ``fp8sim.gemm.scaled_mm`` that name the allowed values in full: the divisors a block
tiling's scale shape may take (the first 24, then "..."), and the kinds of mixed numpy/torch operands."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.gemm import scaled_mm
from fp8sim.testing.oracles import require

torch = require("torch")

KW = {"out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3", "strict": False}
# the divisors, by hand: 256 = 2^8 (9), 360 = 2^3 3^2 5 (24), 720 = 2^4 3^2 5 (30), 1296 = 2^4 3^4 (25)
DIVISORS = {
    256: "1, 2, 4, 8, 16, 32, 64, 128, 256",
    360: "1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 15, 18, 20, 24, 30, 36, 40, 45, 60, 72, 90, 120, 180, 360",
    720: "1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 15, 16, 18, 20, 24, 30, 36, 40, 45, 48, 60, 72, 80, 90, ...",
    1296: "1, 2, 3, 4, 6, 8, 9, 12, 16, 18, 24, 27, 36, 48, 54, 72, 81, 108, 144, 162, 216, 324, 432, 648, ...",
}


@pytest.mark.parametrize("m", sorted(DIVISORS))
def test_a_tiling_that_does_not_divide_m_lists_its_divisors(m: int) -> None:
    a, b = np.full((m, 32), 0x38, np.uint8), np.full((32, 16), 0x38, np.uint8)  # E4M3 1.0
    rows = 7 if m % 7 else 11  # divides none of them
    with pytest.raises(ValueError) as err:
        scaled_mm(a, b, np.ones((rows, 1), np.float32), np.ones((1, 1), np.float32), **KW)
    assert str(err.value) == (
        f"scale_a has {rows} rows, which does not divide M={m} into equal blocks; its rows must be one of "
        f"{DIVISORS[m]}; pass block_shape=(block_m, block_n, block_k) for a tiling with partial edge blocks"
    )


def test_a_zero_size_dim_takes_any_positive_count_of_blocks_but_not_zero() -> None:
    a, b = np.zeros((0, 32), np.uint8), np.zeros((32, 16), np.uint8)
    with pytest.raises(ValueError) as err:
        scaled_mm(a, b, np.ones((0, 2), np.float32), np.ones((2, 2), np.float32), **KW)
    assert (
        "scale_a has 0 rows, which does not divide M=0 into equal blocks; its rows must be one of 1, 2, 3, ... "
        "(any positive number); pass block_shape=" in str(err.value)
    )
    assert scaled_mm(a, b, np.ones((3, 2), np.float32), np.ones((2, 2), np.float32), **KW).shape == (0, 16)


def test_mixed_operands_are_named_by_kind() -> None:
    t = torch.zeros(16, 32).to(torch.float8_e4m3fn)
    n = np.zeros((32, 16), np.uint8)
    one = torch.tensor(1.0)
    with pytest.raises(TypeError) as err:
        scaled_mm(t, n, one, one, b_format="e4m3")
    assert str(err.value).endswith("; got Tensor and ndarray")
    with pytest.raises(TypeError) as err:
        scaled_mm(n.T.copy(), t.t(), one, one, a_format="e4m3")
    assert str(err.value).endswith("; got ndarray and Tensor")
    with pytest.raises(TypeError) as err:  # a Parameter (or any subclass) is still a torch Tensor
        scaled_mm(torch.nn.Parameter(t, requires_grad=False), n, one, one, b_format="e4m3")
    assert str(err.value).endswith("; got Tensor and ndarray")
