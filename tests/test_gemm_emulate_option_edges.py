"""``fp8sim run --scaled-mm NAME`` as the last option (nothing after the name): the name is still taken."""

from __future__ import annotations

import pytest

from fp8sim.gemm.emulate import split_scaled_mm_option


@pytest.mark.parametrize("argv", [["--scaled-mm", "hopper_fast"], ["--scaled-mm=hopper_fast"]])
def test_a_name_with_nothing_after_it_is_taken(argv: list) -> None:
    rest, line = split_scaled_mm_option(argv)
    assert rest == [] and line is not None and "emulate_scaled_mm(accumulator='hopper_fast')" in line
