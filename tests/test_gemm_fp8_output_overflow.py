"""An FP8 output whose scaled value overflows float32 (``d * scale_result`` past 3.4e38) saturates to the
format's largest finite value (cuBLAS's satfinite epilogue: E4M3 448, code 0x7E; -448, 0xFE), silently:
no numpy RuntimeWarning reaches the user."""

from __future__ import annotations

import warnings

import numpy as np

import fp8sim.gemm as g


def test_an_fp8_output_past_float32_saturates_without_warnings() -> None:
    a = np.full((16, 32), 0x7E, np.uint8)  # E4M3 448
    b = np.full((32, 16), 0x7E, np.uint8)
    b[:, 8:] = 0xFE  # -448
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = g.scaled_mm(a, b, 1.0, 1.0, scale_result=3e38, out_dtype="e4m3", a_format="e4m3", b_format="e4m3")
    assert out.dtype == np.uint8
    assert (out[:, :8] == 0x7E).all() and (out[:, 8:] == 0xFE).all()
