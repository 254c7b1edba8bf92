"""The ``exact`` accumulator on products that span more binades than float64 holds (E5M2 x E5M2: 2^-32 to
2^31.8; ``strict=False``, as cuBLAS refuses the pair), numpy and torch backends, against the exact sum of the
products (``fractions.Fraction`` of ml_dtypes' decoded values) rounded once to float32 nearest-even in the test."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import fp8sim.gemm as g
from fp8sim.testing.oracles import require


def _rne_f32(x: Fraction) -> np.float32:
    """float32 nearest-even of an exact rational (the candidates around float64's nearest are compared exactly)."""
    near = np.float32(float(x))
    cands = {near, np.nextafter(near, np.float32(np.inf)), np.nextafter(near, np.float32(-np.inf))}
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))
    return np.float32(best)


def _reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    va = [[Fraction(float(v)) for v in row] for row in a.astype(np.float64)]
    vb = [[Fraction(float(v)) for v in row] for row in b.astype(np.float64)]
    k = len(vb)
    return np.array(
        [[_rne_f32(sum((ra[t] * vb[t][j] for t in range(k)), Fraction(0))) for j in range(len(vb[0]))] for ra in va],
        np.float32,
    )


def _operands() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(30)
    # E5M2 codes of every binade (subnormals to 57344), both signs: products from 2^-32 to 2^31.8
    a = rng.integers(0, 0x7B, (16, 16), dtype=np.uint8) | (rng.integers(0, 2, (16, 16), dtype=np.uint8) << 7)
    b = rng.integers(0, 0x7B, (16, 16), dtype=np.uint8) | (rng.integers(0, 2, (16, 16), dtype=np.uint8) << 7)
    a, b = a.view(ml_dtypes.float8_e5m2), b.view(ml_dtypes.float8_e5m2)
    # row 0 x column 0: 2^30 + 2^6 + 2^-32, a float32 tie at 2^30 broken only by the 2^-32 float64 loses
    a[0] = 0
    b[:, 0] = 0
    a[0, :3] = np.array([2.0**15, 2.0**3, 2.0**-16], np.float32)
    b[:3, 0] = np.array([2.0**15, 2.0**3, 2.0**-16], np.float32)
    return a, b


def _run(backend: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if backend == "numpy":
        return g.scaled_mm(
            a.view(np.uint8),
            b.view(np.uint8),
            1.0,
            1.0,
            out_dtype="float32",
            accumulator="exact",
            backend="numpy",
            a_format="e5m2",
            b_format="e5m2",
            strict=False,
        )
    torch = require("torch")
    ta = torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e5m2)
    tb = torch.from_numpy(b.view(np.uint8).T.copy()).view(torch.float8_e5m2).t()
    one = torch.tensor(1.0)
    out = g.scaled_mm(ta, tb, one, one, out_dtype=torch.float32, accumulator="exact", backend="torch", strict=False)
    return out.numpy()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_exact_accumulator_rounds_sums_beyond_float64_once(backend: str) -> None:
    a, b = _operands()
    got = _run(backend, a, b)
    want = _reference(a, b)
    assert got[0, 0] == np.float32(2.0**30 + 2.0**7)  # the tie broken upward by 2^-32
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_band_width_leaves_room_for_both_operands_significands(backend: str) -> None:
    """K = 3, A holds powers of two (``mbits_a = 0``), B values of up to 31 significant bits (``mbits_b = 30``):
    the products 1 + 2^-24, 2^-26 + 2^-56 and -2^-26 sum to 1 + 2^-24 + 2^-56, just above float32's tie between
    1 and 1 + 2^-23.  Whatever the order, one float64 sum of them is 1 + 2^-24 (57 bits do not fit 53), a tie
    that rounds to 1; only bands narrow enough for B's 31 bits (27 binades apart) keep the 2^-56."""
    a = [[1.0, 1.0, 1.0]]
    b = [[1.0 + 2.0**-24], [2.0**-26 * (1.0 + 2.0**-30)], [-(2.0**-26)]]
    if backend == "numpy":
        from fp8sim.gemm._exact import exact_matmul_f32

        got = exact_matmul_f32(np.array(a), np.array(b), 0, 30)
    else:
        torch = require("torch")
        from fp8sim.gemm._torch_exact import exact_matmul_f32

        got = exact_matmul_f32(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), 0, 30)
        got = got.numpy()
    assert float(np.float64(1.0) + 2.0**-24 + 2.0**-56) == 1.0 + 2.0**-24  # float64 loses the 2^-56
    assert got.dtype == np.float32 and got.tolist() == [[1.0 + 2.0**-23]]


def _terms() -> np.ndarray:
    rng = np.random.default_rng(7)
    rows = rng.choice([-1.0, 1.0], (300, 5)) * np.ldexp(
        1.0 + rng.integers(0, 1 << 20, (300, 5)) / 2.0**20, rng.integers(-70, 70, (300, 5))
    )
    rows[rng.random((300, 5)) < 0.2] = 0.0
    planted = []
    for big, mid, tiny in [
        (2.0**30, 2.0**6, 2.0**-40),
        (2.0**30, 2.0**6, -(2.0**-40)),
        (-1.0, -(2.0**-24), -(2.0**-80)),
    ]:
        for order in ([big, mid, tiny], [big, tiny, mid], [tiny, big, mid], [mid, tiny, big], [tiny, mid, big]):
            planted.append([*order, 0.0, 0.0])  # float32 ties at big broken only by tiny
    return np.vstack([rows, planted])


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_distilled_sum_is_the_exact_sum_rounded_once_to_float32(backend: str) -> None:
    terms = _terms()
    if backend == "numpy":
        from fp8sim.gemm._exact import _distill, round_sum_to_f32

        got = round_sum_to_f32(*_distill(list(terms.T)))
    else:
        torch = require("torch")
        from fp8sim.gemm._torch_exact import rn_sum_f32

        got = rn_sum_f32(torch.from_numpy(terms)).numpy()
    want = np.array([_rne_f32(sum((Fraction(float(t)) for t in row), Fraction(0))) for row in terms], np.float32)
    assert got[-15:].tolist()[:2] == [2.0**30 + 2.0**7, 2.0**30 + 2.0**7]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
