"""The compiled tensor-core chains (``fp8sim.gemm._numba``, extra ``fast``) give the numpy
reference path's bits (``FP8SIM_NUMBA=0``), on random and adversarial operands."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.gemm import scaled_mm

pytest.importorskip("numba")

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
