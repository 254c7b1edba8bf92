"""``fp8sim.testing.strategies``: edges that the mutation run of ``fp8sim.testing`` found unpinned (issue 30.1,
``reports/mutation_testing.md``).

Oracles: ml_dtypes' ``finfo`` and decoding of every code; the documented contents of ``near_grid_values``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

require("hypothesis")
from fp8sim.testing.strategies import near_grid_values  # noqa: E402


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_near_grid_values_of_a_format_without_zero_hold_the_dtypes_smallest_subnormal(dtype: str) -> None:
    """E8M0 has no zero code, so no grid point's neighbour is the dtype's smallest subnormal: the table adds it."""
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    tiny = float(ml_dtypes.finfo(dt).smallest_subnormal)
    table = near_grid_values("e8m0", dt).astype(np.float64)
    assert tiny in table and -tiny in table
