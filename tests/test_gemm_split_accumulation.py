"""Split accumulation by its definition (``fp8sim.gemm.accumulators``, DeepSeek-V3 section 3.3): every
``promote_every`` = 128 of K the chain restarts from 0 and its result is added into a float32 register with
float32 round-to-nearest.  So ``hopper_split`` over K = 512 equals the float32 sum, in K order, of four
``hopper_fast`` chains over the 128-wide slices (each a chain from 0), on the numpy chains with numba on and off."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim.gemm as g

E4 = {"a_format": "e4m3", "b_format": "e4m3", "out_dtype": "float32"}


@pytest.mark.parametrize("numba", ["1", "0"])
def test_split_accumulation_is_a_float32_sum_of_restarted_chains(monkeypatch: pytest.MonkeyPatch, numba: str) -> None:
    monkeypatch.setenv("FP8SIM_NUMBA", numba)
    rng = np.random.default_rng(5)
    a = rng.integers(0, 0x7F, (4, 512), dtype=np.uint8) | (rng.integers(0, 2, (4, 512), dtype=np.uint8) << 7)
    b = rng.integers(0, 0x7F, (512, 16), dtype=np.uint8)
    a[a == 0xFF] = 0
    # row 0: 448 * 448, then 2^-9 * 2^-9, then -448 * 448: float32 registers lose the 2^-18 (a float64 one would not)
    a[0] = 0
    a[0, [0, 128, 256]] = [0x7E, 0x01, 0xFE]
    b[[0, 128, 256]] = np.array([[0x7E], [0x01], [0x7E]], np.uint8)
    got = g.scaled_mm(a, b, 1.0, 1.0, accumulator="hopper_split", **E4)
    reg = np.zeros((4, 16), np.float32)
    for g0 in range(0, 512, 128):
        part = g.scaled_mm(a[:, g0 : g0 + 128], b[g0 : g0 + 128], 1.0, 1.0, accumulator="hopper_fast", **E4)
        reg = (reg + part).astype(np.float32)
    assert np.abs(reg).max() > 1e4 and reg[0, 0] == 0.0
    np.testing.assert_array_equal(got.view(np.uint32), reg.view(np.uint32))
