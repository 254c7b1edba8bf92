"""torch backend stochastic rounding on the CPU (a compiled pass when numba is installed) gives the
numpy backend's bits, every class of float32 included (subnormal range, Inf, NaN, overflow)."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("numba_on", ["1", "0"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "e3m2", "e8m0"])
@pytest.mark.parametrize("saturate", [True, False])
def test_torch_stochastic_equals_numpy_backend(monkeypatch, numba_on: str, fmt: str, saturate: bool) -> None:  # noqa: ANN001
    if numba_on == "1":
        pytest.importorskip("numba")
    monkeypatch.setenv("FP8SIM_NUMBA", numba_on)
    from fp8sim.cast import torch_backend

    torch_backend._sr_kernel.cache_clear()
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(1 << 16) * np.exp2(rng.uniform(-30, 30, 1 << 16))).astype(np.float32)
    x[::97] = np.nan
    x[1::97] = np.inf
    x[2::97] = -np.inf
    x[3::97] = 0.0
    x[4::97] = np.float32(3e38)
    got = fp8sim.encode(torch.from_numpy(x), fmt, rounding="stochastic", saturate=saturate, seed=99)
    ref = fp8sim.encode(x, fmt, rounding="stochastic", saturate=saturate, seed=99)
    assert np.array_equal(got.numpy(), ref), f"first diff at {np.argwhere(got.numpy() != ref)[0]}"
    torch_backend._sr_kernel.cache_clear()
