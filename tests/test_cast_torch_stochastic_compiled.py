"""torch backend stochastic rounding on the CPU (a compiled pass when numba is installed) gives the
numpy backend's bits, every class of float32 included (subnormal range, Inf, NaN, overflow)."""

from __future__ import annotations

import numpy as np
import pytest

import fp8sim
from fp8sim.testing.oracles import require

torch = require("torch")


@pytest.mark.parametrize("numba_on", ["1", "0"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "e3m2", "e8m0", "ue5m3"])
@pytest.mark.parametrize("saturate", [True, False])
def test_torch_stochastic_equals_numpy_backend(monkeypatch, numba_on: str, fmt: str, saturate: bool) -> None:  # noqa: ANN001
    if numba_on == "1":
        require("numba")
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


hypothesis = require("hypothesis")
st = hypothesis.strategies


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(
    n=st.integers(1, 3 * (1 << 16) + 7),
    data_seed=st.integers(0, 2**32 - 1),
    rounding_seed=st.integers(0, 2**64 - 1),
    fmt=st.sampled_from(["e4m3", "e5m2", "e2m1"]),
)
def test_compiled_blocks_equal_numpy_backend_across_block_edges(
    n: int, data_seed: int, rounding_seed: int, fmt: str
) -> None:
    """The compiled pass works in blocks of ``_SR_BLOCK`` elements, each listing its exact-path
    elements (subnormal range, Inf, NaN) itself: any length, with such elements in any block and at
    block edges, gives the numpy backend's bits."""
    require("numba")
    from fp8sim.cast import torch_backend

    if torch_backend._sr_kernel() is None:
        pytest.skip("FP8SIM_NUMBA=0")
    rng = np.random.default_rng(data_seed)
    x = (rng.standard_normal(n) * np.exp2(rng.uniform(-14, 10, n))).astype(np.float32)
    edges = np.arange(torch_backend._SR_BLOCK - 1, n, torch_backend._SR_BLOCK)
    x[edges] = rng.choice(np.array([np.nan, -np.inf, 1e-3, -3e-3], np.float32), edges.size)
    x[rng.integers(0, n, max(1, n // 50))] = np.float32(2.0**-8)
    got = fp8sim.encode(torch.from_numpy(x), fmt, rounding="stochastic", saturate=False, seed=rounding_seed)
    ref = fp8sim.encode(x, fmt, rounding="stochastic", saturate=False, seed=rounding_seed)
    bad = np.flatnonzero(got.numpy() != ref)
    assert bad.size == 0, (
        f"{fmt}: first diff at {bad[0]}: x={x[bad[0]]!r} got {got.numpy()[bad[0]]:#04x} want {ref[bad[0]]:#04x}"
    )


def test_every_table_format_takes_the_compiled_pass_and_the_fallback_gives_the_same_bits(monkeypatch) -> None:  # noqa: ANN001
    """The SIMD pass needs the shift table's three-class shape; every format with a float32 table has
    it but non-saturating UE5M3 (-0 and negative float32 subnormals share a class there and give 0 and
    NaN: that class is exact-path only on the negative side), and where a table has not, the numpy
    backend's pass runs instead (same bits)."""
    require("numba")
    from fp8sim.cast import torch_backend
    from fp8sim.cast._tables import f32_stochastic_tables, f32_table_ok
    from fp8sim.formats import format_names, get_format

    for name in format_names():
        f = get_format(name)
        if f32_table_ok(f):
            for sat in (True, False):
                shaped = torch_backend._sr_classes(f32_stochastic_tables(f, sat)[0]) is not None
                assert shaped == (f.signed or not f.has_zero or sat), (name, sat)
    x = (np.random.default_rng(2).standard_normal(5000) * 30).astype(np.float32)
    x[:3] = [np.nan, np.inf, 1e-4]
    ref = fp8sim.encode(x, "e4m3", rounding="stochastic", seed=7)
    monkeypatch.setattr(torch_backend, "_sr_classes", lambda table: None)
    got = fp8sim.encode(torch.from_numpy(x), "e4m3", rounding="stochastic", seed=7)
    assert np.array_equal(got.numpy(), ref)
    x[3:6] = [-0.0, -1e-41, -1e-4]  # UE5M3 without saturation: 0, NaN, NaN through the numpy pass
    for sat in (False, True):
        ref = fp8sim.encode(x, "ue5m3", rounding="stochastic", seed=7, saturate=sat)
        got = fp8sim.encode(torch.from_numpy(x), "ue5m3", rounding="stochastic", seed=7, saturate=sat)
        assert np.array_equal(got.numpy(), ref) and list(ref[3:6]) == ([0, 0, 0] if sat else [0, 255, 255])
