"""``QuantizedData``: a per-row global scale over zero-padded codes (row-scaled NVFP4 keeps one global scale
per original row; the codes' padded rows get none) and the record's repr.  Values by hand from E2M1's grid
(ml_dtypes' ``float4_e2m1fn`` decodes the codes)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from fp8sim.formats import E2M1, E4M3
from fp8sim.scaling.quantized import QuantizedData


def _e2m1_code(v: float) -> int:
    return int(np.array(v, np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)) & 0xF


def test_per_row_global_scale_over_padded_rows_and_columns() -> None:
    rows, cols = 5, 20  # codes padded to (8, 32) in blocks of (4, 16)
    codes = np.zeros((8, 32), np.uint8)
    codes[:rows, :cols] = _e2m1_code(1.5)
    codes[:rows, 3] = _e2m1_code(-6.0)
    scales = np.full((2, 2), 2.0, np.float32)
    scales[0, 1] = 0.5
    g = np.arange(1, rows + 1, dtype=np.float32).reshape(rows, 1)
    qt = QuantizedData(codes, scales, E2M1, (4, 16), (rows, cols), "float32", global_scale=g)
    got = qt.dequantize()
    assert got.shape == (rows, cols) and got.dtype == np.float32
    blk = np.repeat(np.repeat(scales, 4, 0), 16, 1)[:rows, :cols]
    want = np.full((rows, cols), 1.5, np.float32)
    want[:, 3] = -6.0
    want = want * blk * g  # every product exact in float32
    np.testing.assert_array_equal(got, want)


def test_repr_names_format_shape_blocks_scales_and_dtype() -> None:
    qt = QuantizedData(np.zeros((8, 32), np.uint8), np.ones((8, 2), np.float32), E2M1, (1, 16), (5, 20), "bfloat16")
    assert repr(qt) == "QuantizedData(fmt=e2m1, shape=(5, 20), block=(1, 16), scales=float32(8, 2), dtype=bfloat16)"
    qt = QuantizedData(
        np.zeros((4, 16), np.uint8), np.zeros((4, 1), np.uint8), E2M1, (1, 16), (4, 16), "float32", scale_format=E4M3
    )
    assert repr(qt) == "QuantizedData(fmt=e2m1, shape=(4, 16), block=(1, 16), scales=e4m3(4, 1), dtype=float32)"
