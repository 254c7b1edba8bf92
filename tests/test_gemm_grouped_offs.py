"""``offs`` edge cases of ``grouped_mm`` against torch's CPU ``torch._grouped_mm``: every group empty
(``offs`` all zero) and the last offset, not an earlier one, bounded by the grouped dim."""

from __future__ import annotations

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm.grouped import grouped_mm  # noqa: E402


def _offs(ends: list[int]) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


def test_all_groups_empty_is_all_zero_as_torch_takes_it() -> None:
    a, b = torch.ones(8, 16), torch.ones(2, 16, 4)
    want = torch._grouped_mm(a, b, offs=_offs([0, 0]))
    got = grouped_mm(a, b, offs=_offs([0, 0]))
    assert got.shape == want.shape == (8, 4) and (got == 0).all()


def test_only_the_last_offset_bounds_the_groups() -> None:
    a, b = torch.ones(8, 16), torch.ones(3, 16, 4)
    with pytest.raises(ValueError, match=r"^offs must be non-decreasing and at most 8 \(the size of a's dim 0\); "):
        grouped_mm(a, b, offs=_offs([2, 3, 9]))
    assert grouped_mm(a, b, offs=_offs([2, 3, 8])).shape == (8, 4)
