"""The numpy tensor-core chains work in blocks of 65536 / (N * instruction K) rows; with N = 2048 every row is
its own block.  Rows of a GEMM are independent: each row block's result equals the GEMM of that row alone.

``blackwell_mma`` (round-to-nearest, no alignment limit) on K = 32 is one instruction per output: the exact sum
of 32 E4M3 products rounded once to float32, which numpy's float64 matmul of ml_dtypes' decoded values gives here
(the products and their sums fit float64's 53 bits).  ``hopper_split`` (numba off) promotes every 128 of K = 256:
its register accumulator is per row block."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fp8sim.gemm as g

E4 = {"a_format": "e4m3", "b_format": "e4m3", "out_dtype": "float32"}


def _codes(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    c = rng.integers(0, 0x7F, shape, dtype=np.uint8) | (rng.integers(0, 2, shape, dtype=np.uint8) << 7)
    return np.where(c == 0xFF, 0, c).astype(np.uint8)


def test_every_row_block_is_computed_and_placed() -> None:
    rng = np.random.default_rng(3)
    a, b = _codes(rng, (3, 32)), _codes(rng, (32, 2048))
    got = g.scaled_mm(a, b, 1.0, 1.0, accumulator="blackwell_mma", **E4)
    va = a.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    vb = b.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    want = (va @ vb).astype(np.float32) + np.float32(0)
    assert got.shape == (3, 2048)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_split_accumulation_row_blocks_equal_their_rows_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP8SIM_NUMBA", "0")
    rng = np.random.default_rng(4)
    a, b = _codes(rng, (3, 256)), _codes(rng, (256, 2048))
    got = g.scaled_mm(a, b, 1.0, 1.0, accumulator="hopper_split", **E4)
    rows = [g.scaled_mm(a[i : i + 1], b, 1.0, 1.0, accumulator="hopper_split", **E4) for i in range(3)]
    assert np.abs(got).max() > 0
    np.testing.assert_array_equal(got.view(np.uint32), np.vstack(rows).view(np.uint32))
