"""The ``dequantized_fp32`` accumulator (torchao ``emulate=True``, torch's CPU fallback): each operand times its
float32 scale, then float32 matmuls.  Oracles written here: float64 products of small integer codes and
power-of-two scales (every sum exact), and IEEE specials."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

from fp8sim import decode
from fp8sim.gemm import scaled_mm

KW = {"out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3", "strict": False}
KW["accumulator"] = "dequantized_fp32"
POW2 = np.array([0.25, 0.5, 1.0, 2.0, 4.0], np.float32)


def _codes(shape: tuple, seed: int) -> np.ndarray:
    """E4M3 codes of the integers -7..7 (exact in E4M3; products and sums exact in float32)."""
    vals = np.random.default_rng(seed).integers(-7, 8, shape).astype(np.float32)
    table = {float(decode(np.uint8(c), "e4m3")): c for c in range(256) if np.isfinite(decode(np.uint8(c), "e4m3"))}
    return np.vectorize(lambda v: table[float(v)], otypes=[np.uint8])(vals)


def test_blockwise_scales_with_partial_edge_blocks_on_every_dim() -> None:
    m, n, k, (bm, bn, bk) = 5, 3, 40, (2, 2, 16)
    a, b = _codes((m, k), 0), _codes((k, n), 1)
    rng = np.random.default_rng(2)
    sa, sb = rng.choice(POW2, (-(-m // bm), -(-k // bk))), rng.choice(POW2, (-(-k // bk), -(-n // bn)))
    got = scaled_mm(a, b, sa, sb, block_shape=(bm, bn, bk), **KW)
    va, vb = decode(a, "e4m3").astype(np.float64), decode(b, "e4m3").astype(np.float64)
    want = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            want[i, j] = sum(va[i, t] * sa[i // bm, t // bk] * vb[t, j] * sb[t // bk, j // bn] for t in range(k))
    assert np.array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("split", [(2, "contiguous"), (3, "pairwise"), (1, "none")])
def test_split_k_partial_sums_of_exact_products_are_the_whole_sum(split: tuple) -> None:
    a, b = _codes((4, 64), 3), _codes((64, 5), 4)
    sa, sb = np.float32(0.5), np.float32(4.0)
    want = (decode(a, "e4m3").astype(np.float64) @ decode(b, "e4m3").astype(np.float64)) * 2.0
    for layout in ("tensorwise", "rowwise"):
        s_a, s_b = (sa, sb) if layout == "tensorwise" else (np.full((4, 1), sa), np.full((1, 5), sb))
        got = scaled_mm(a, b, s_a, s_b, split_k=split, **KW)
        assert np.array_equal(got, want.astype(np.float32)), (split, layout)


def test_overflow_and_inf_times_zero_follow_ieee_without_warnings() -> None:
    a = np.array([[0x7B, 0x7C]], np.uint8)  # E5M2 57344 and +Inf
    b = np.array([[0x3C], [0x3C]], np.uint8)  # E5M2 1.0
    kw = {**KW, "a_format": "e5m2", "b_format": "e5m2"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        big = scaled_mm(a[:, :1], b[:1], np.float32(2.0**127), np.float32(1), **kw)
        nan = scaled_mm(a[:, 1:], b[1:], np.float32(0), np.float32(1), **kw)
    assert np.isposinf(big).all() and np.isnan(nan).all()


def test_without_torch_numpys_matmul_gives_the_same_exact_sums_and_specials(monkeypatch) -> None:  # noqa: ANN001
    a, b = _codes((4, 64), 7), _codes((64, 5), 8)
    want = scaled_mm(a, b, np.float32(0.5), np.float32(2), **KW)
    monkeypatch.setitem(sys.modules, "torch", None)
    assert np.array_equal(scaled_mm(a, b, np.float32(0.5), np.float32(2), **KW), want)
    test_overflow_and_inf_times_zero_follow_ieee_without_warnings()


def test_torchs_128x128_blocks_of_a_start_a_new_scale_at_row_128() -> None:
    """DeepSeek-style 128x128 scales of A ((ceil(M/128), K/128)): row i takes scale_a[i // 128]."""
    a, b = np.full((256, 128), 0x38, np.uint8), np.full((128, 16), 0x38, np.uint8)  # E4M3 1.0: sums are 128
    sa, sb = np.array([[1.0], [4.0]], np.float32), np.ones((1, 16), np.float32)
    got = scaled_mm(a, b, sa, sb, **KW)
    assert np.array_equal(got[:, 0], np.repeat(np.float32([128.0, 512.0]), 128))


def test_without_torch_overflowing_or_opposite_inf_sums_follow_ieee_quietly(monkeypatch) -> None:  # noqa: ANN001
    a = np.array([[0x7B, 0x7B], [0x7C, 0xFC]], np.uint8)  # E5M2: 57344, 57344; +Inf, -Inf
    b = np.array([[0x3C], [0x3C]], np.uint8)  # 1.0, 1.0
    kw = {**KW, "a_format": "e5m2", "b_format": "e5m2"}
    monkeypatch.setitem(sys.modules, "torch", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = scaled_mm(a, b, np.float32(2.0**112), np.float32(1), **kw)  # each product ~3e38: the sum overflows
    assert np.isposinf(got[0, 0]) and np.isnan(got[1, 0])
