"""The ULP statistics of a torchao op treat a NaN code as casts do: a NaN against a number is a mismatch with
no count of grid steps (left out of max and mean ULP), never the distance of zero to that number.  Truth:
the committed CPU capture's torchao 0.18 outputs; one NaN and one code one step off are planted."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from fp8sim.native.compare import compare_capture
from fp8sim.native.fileformat import read_bundle, write_bundle

COMMITTED = Path(__file__).resolve().parents[1] / "reports" / "captures" / "cpu-torch2.13.fp8cap"
NAME = "torchao/e4m3/tensorwise/pow2=True"


def test_a_nan_code_is_a_mismatch_outside_the_ulp_statistics(tmp_path: Path) -> None:
    header, arrays = read_bundle(COMMITTED)
    codes, scale = arrays[NAME + "/codes"].copy(), arrays[NAME + "/scale"]
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    big = np.unravel_index(np.argmax(np.abs(vals)), vals.shape)  # far from zero: many steps from it
    assert abs(vals[big]) >= 256
    small = np.unravel_index(np.argmax((np.abs(vals) > 1) & (np.abs(vals) < 2)), vals.shape)
    codes[big] = 0x7F  # NaN in e4m3fn
    codes[small] += 1  # the next value of the same sign: one step
    stepped = codes.view(ml_dtypes.float8_e4m3fn)[small].astype(np.float64)
    assert abs(stepped) - abs(vals[small]) == 2.0**-3  # e4m3's spacing in [1, 2]: one grid step
    op = next(o for o in header["ops"] if o["name"] == NAME)
    doc = {"meta": header["meta"], "ops": [op], "suite": header["suite"], "suite_version": header["suite_version"]}
    path = write_bundle(tmp_path / "nan.fp8cap", {NAME + "/codes": codes, NAME + "/scale": scale}, doc)
    (res,) = compare_capture(path, infer="none").ops
    assert (res.n, res.bit_exact, res.clusters["codes"]) == (8193, 8191, [8192, 2])
    assert res.max_ulp == 1.0  # the planted step; the NaN is not 'as far as zero is'
    assert res.mean_ulp == 1 / 8192  # 8192 finite distances: 8191 codes and the scale
