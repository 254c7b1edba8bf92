"""The torch backend's float16 rounding of exact float64 sums (``_torch_chain._rn16``, the float16-accumulate
chains) against numpy's float64 -> float16 conversion, which rounds once to nearest even (IEEE 754): the
subnormal quantum 2^-24, ties there, the largest finite 65504 and the overflow to Inf from 65520 on."""

from __future__ import annotations

import numpy as np

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.gemm._torch_chain import _rn16  # noqa: E402


def test_rn16_is_ieee_round_to_nearest_even_into_float16() -> None:
    q = 2.0**-24
    values = [0.0, q, 1.5 * q, 2.5 * q, 3 * q, 0.75 * q, 0.5 * q, 0.25 * q, 2.0**-14, 2.0**-14 - 0.5 * q,
              1 / 3, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 1000.1, 65503.0, 65504.0, 65519.99, 65520.0, 1e6]  # fmt: skip
    x = np.array(values + [-v for v in values], np.float64)
    got = _rn16(torch.from_numpy(x)).numpy()
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float64)
    assert np.array_equal(got, want), np.stack([x, got, want], 1)[got != want]
    assert np.array_equal(np.signbit(got), np.signbit(want))
