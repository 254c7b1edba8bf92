"""A NaN block scale NaNs exactly the outputs it scales, on both backends: an E8M0 0xFF (MXFP8) or a UE4M3
0x7F/0xFF (NVFP4: the sign bit is ignored) in row i of scale_a makes row i NaN, in column j of scale_b
column j; every other output stays finite (the block-scale MMA multiplies each block's sum by both scales,
and NaN times anything is NaN: PTX ``tcgen05.mma`` block-scale semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.gemm import scaled_mm
from fp8sim.testing.oracles import require

require("torch")  # the torch backend


def _where_nan(fmt: str, backend: str, nan_a: tuple | None, nan_b: tuple | None, code: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    if fmt == "mx":
        a, b = rng.integers(0, 100, (3, 64)).astype(np.uint8), rng.integers(0, 100, (64, 4)).astype(np.uint8)
        sa, sb, kw = np.full((3, 2), 127, np.uint8), np.full((2, 4), 127, np.uint8), {"a_format": "e4m3"}
    else:
        a, b = rng.integers(1, 8, (3, 64)).astype(np.uint8), rng.integers(1, 8, (64, 4)).astype(np.uint8)
        sa, sb, kw = np.full((3, 4), 0x38, np.uint8), np.full((4, 4), 0x38, np.uint8), {"a_format": "e2m1"}
    kw["b_format"] = kw["a_format"]
    if nan_a:
        sa[nan_a] = code
    if nan_b:
        sb[nan_b] = code
    got = scaled_mm(a, b, sa, sb, out_dtype="float32", strict=False, accumulator="blackwell", backend=backend, **kw)
    return np.isnan(got)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("fmt", "code"), [("mx", 0xFF), ("nvfp4", 0x7F), ("nvfp4", 0xFF)])
def test_a_nan_scale_nans_its_row_or_column_only(backend: str, fmt: str, code: int) -> None:
    rows = np.zeros((3, 4), bool)
    rows[1] = True
    cols = np.zeros((3, 4), bool)
    cols[:, 2] = True
    assert np.array_equal(_where_nan(fmt, backend, (1, 1), None, code), rows)
    assert np.array_equal(_where_nan(fmt, backend, None, (1, 2), code), cols)
    assert np.array_equal(_where_nan(fmt, backend, (1, 0), (0, 2), code), rows | cols)
