"""The compiled tensor-core chains (``fp8sim.gemm._numba``, extra ``fast``) give the numpy
reference path's bits (``FP8SIM_NUMBA=0``), on random and adversarial operands."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.gemm import scaled_mm
from fp8sim.testing.oracles import require

require("numba")

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
ACCS = ("hopper_fast", "hopper_split", "ada_fast", "ada_split", "blackwell", "blackwell_split")


def _both(monkeypatch, a, b, **kw):  # noqa: ANN001, ANN003, ANN202
    kw = {"out_dtype": "float32", "strict": False, **kw}
    monkeypatch.setenv("FP8SIM_NUMBA", "0")
    ref = scaled_mm(a, b, np.float32(1), np.float32(1), **kw)
    monkeypatch.setenv("FP8SIM_NUMBA", "1")
    got = scaled_mm(a, b, np.float32(1), np.float32(1), **kw)
    return got.view(np.uint32), ref.view(np.uint32)


def _codes(rng, shape, fmt, scale):  # noqa: ANN001, ANN202
    v = (rng.standard_normal(shape) * scale).astype(np.float32).clip(-440, 440)
    return v.astype(ML[fmt]).view(np.uint8)


@pytest.mark.parametrize("acc", ACCS)
@pytest.mark.parametrize(("fa", "fb"), [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
def test_compiled_chain_equals_the_numpy_path(monkeypatch, acc: str, fa: str, fb: str) -> None:  # noqa: ANN001
    rng = np.random.default_rng(hash((acc, fa, fb)) % 2**32)
    k = 520  # a ragged last instruction and promotion chunk
    a = _codes(rng, (9, k), fa, 40.0)
    b = _codes(rng, (k, 7), fb, 0.05)
    a[0, :200] = _codes(rng, (200,), fa, 1e-3)  # subnormals and zeros
    a[2, : k // 2] = a[2, k // 2 :]  # cancellation against an antisymmetric column
    b[: k // 2, 3] = b[k // 2 :, 3] ^ 0x80
    got, ref = _both(monkeypatch, a, b, accumulator=acc, a_format=fa, b_format=fb)
    assert np.array_equal(got, ref), f"{acc} {fa}x{fb}: first diff at {np.argwhere(got != ref)[0]}"


@pytest.mark.parametrize("split", [(3, "contiguous"), (5, "pairwise")])
def test_compiled_chain_under_split_k(monkeypatch, split) -> None:  # noqa: ANN001
    rng = np.random.default_rng(3)
    a, b = _codes(rng, (4, 1024), "e4m3", 40.0), _codes(rng, (1024, 5), "e4m3", 0.05)
    got, ref = _both(monkeypatch, a, b, accumulator="hopper_fast", a_format="e4m3", b_format="e4m3", split_k=split)
    assert np.array_equal(got, ref)


@settings(max_examples=25, deadline=None)
@given(
    a=st.lists(st.integers(0, 255), min_size=64, max_size=64),
    b=st.lists(st.integers(0, 255), min_size=64, max_size=64),
    acc=st.sampled_from(ACCS),
)
def test_compiled_chain_equals_numpy_on_any_finite_codes(a: list, b: list, acc: str) -> None:
    """Any finite E4M3 codes (NaN codes 0x7F/0xFF replaced by zero): the law is equality of the paths."""
    import os

    av = np.array(a, np.uint8).reshape(1, 64)
    bv = np.array(b, np.uint8).reshape(64, 1)
    av[(av & 0x7F) == 0x7F] = 0
    bv[(bv & 0x7F) == 0x7F] = 0
    old = os.environ.get("FP8SIM_NUMBA")
    try:
        os.environ["FP8SIM_NUMBA"] = "0"
        ref = scaled_mm(av, bv, np.float32(1), np.float32(1), out_dtype="float32", accumulator=acc,
                        a_format="e4m3", b_format="e4m3", strict=False)  # fmt: skip
        os.environ["FP8SIM_NUMBA"] = "1"
        got = scaled_mm(av, bv, np.float32(1), np.float32(1), out_dtype="float32", accumulator=acc,
                        a_format="e4m3", b_format="e4m3", strict=False)  # fmt: skip
    finally:
        os.environ.pop("FP8SIM_NUMBA", None) if old is None else os.environ.__setitem__("FP8SIM_NUMBA", old)
    assert got.view(np.uint32)[0, 0] == ref.view(np.uint32)[0, 0]


@pytest.mark.parametrize("lanes", [True, False])
@pytest.mark.parametrize("acc", ["hopper_split", "blackwell"])
def test_compiled_chain_tiles_and_both_kernels(monkeypatch, lanes: bool, acc: str) -> None:  # noqa: ANN001
    """Ragged 8-row x 64-column tiles (13 x 70), promotion inside K; the SIMD-lane kernel and the
    per-output kernel (the fallback where float32/int32 would not be exact) both give the numpy bits."""
    from fp8sim.gemm import _numba

    if not lanes:
        monkeypatch.setattr(_numba, "_lanes_exact", lambda *a: False)
    rng = np.random.default_rng(11)
    a, b = _codes(rng, (13, 300), "e4m3", 40.0), _codes(rng, (300, 70), "e5m2", 0.05)
    got, ref = _both(monkeypatch, a, b, accumulator=acc, a_format="e4m3", b_format="e5m2")
    assert np.array_equal(got, ref)


def test_lane_kernel_exactness_conditions() -> None:
    """float32 products and int32 sums are exact for FP8 with 13 or 25 alignment bits, not 35."""
    from fp8sim.formats import get_format
    from fp8sim.gemm import _numba
    from fp8sim.gemm.instructions import _decoded

    t = {f: _decoded(get_format(f)) for f in ("e4m3", "e5m2")}
    tab = {f: (v[0], v[2]) for f, v in t.items()}
    assert _numba._lanes_exact(tab["e4m3"], tab["e5m2"], 32, 13)
    assert _numba._lanes_exact(tab["e5m2"], tab["e5m2"], 32, 25)
    assert not _numba._lanes_exact(tab["e4m3"], tab["e4m3"], 32, 35)  # 32 terms below 2^36 overflow int32
    assert _numba._bits(np.array([1.75, 0.5, 3.0])) == 3
