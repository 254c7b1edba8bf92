"""One row (M = 1): a (1, K/128) scale_a is both torch's 1x128 layout (M, K/128) and its 128x128 layout
(M/128, K/128); with a 128x128 scale_b that is the 1x128 x 128x128 pair torch takes (only both 128x128 is
refused).  Exact accumulator, power-of-two scales: the result is the float64 matmul of ml_dtypes' decoded
values (exact for K = 128) times the scales, rounded once to float32."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import fp8sim.gemm as g


def test_one_row_with_a_128x128_scale_b_is_taken_as_1x128_by_128x128() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 0x7F, (1, 128), dtype=np.uint8)
    b = rng.integers(0, 0x7F, (128, 256), dtype=np.uint8)
    sa, sb = np.array([[2.0]], np.float32), np.array([[0.5, 4.0]], np.float32)
    got = g.scaled_mm(a, b, sa, sb, out_dtype="float32", a_format="e4m3", b_format="e4m3", accumulator="exact")
    va = a.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    vb = b.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    want = ((va @ vb) * 2.0 * np.repeat([0.5, 4.0], 128)).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
