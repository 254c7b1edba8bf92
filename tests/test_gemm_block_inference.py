"""Float32 block scales without ``block_shape`` (``strict=False``): the tiling is inferred from the scale shapes
(blocks that divide M, N and K exactly), and each shape that does not divide is refused naming the argument,
the axis and the dimension.  Oracle: a float64 sum written here, every term exact (small integer codes,
power-of-two scales), with ``scale_a[i // bm, t // bk] * scale_b[t // bk, j // bn]``."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim import decode
from fp8sim.gemm import scaled_mm

KW = {"out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3", "strict": False}
POW2 = np.array([0.25, 0.5, 1.0, 2.0, 4.0], np.float32)


@pytest.mark.parametrize("acc", ["dequantized_fp32", "exact"])
def test_an_inferred_tiling_scales_each_block(acc: str) -> None:
    m, n, k, (bm, bn, bk) = 6, 4, 32, (2, 2, 16)
    rng = np.random.default_rng(9)
    a, b = rng.integers(0x30, 0x48, (m, k)).astype(np.uint8), rng.integers(0xB0, 0xC8, (k, n)).astype(np.uint8)
    sa, sb = rng.choice(POW2, (m // bm, k // bk)), rng.choice(POW2, (k // bk, n // bn))
    got = scaled_mm(a, b, sa, sb, accumulator=acc, **KW)
    va, vb = decode(a, "e4m3").astype(np.float64), decode(b, "e4m3").astype(np.float64)
    want = np.array([[sum(va[i, t] * sa[i // bm, t // bk] * vb[t, j] * sb[t // bk, j // bn] for t in range(k))
                      for j in range(n)] for i in range(m)])  # fmt: skip
    assert np.array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize(
    ("sa", "sb", "message"),
    [
        ((2, 3), (3, 2), "scale_a has 3 columns, which does not divide K=32 into equal blocks; its columns must be "
                         "one of 1, 2, 4, 8, 16, 32; pass block_shape=(block_m, block_n, block_k) "
                         "for a tiling with partial edge blocks"),
        ((2, 2), (3, 2), "scale_b has 3 rows, which does not divide K=32 into equal blocks; its rows must be one of "
                         "1, 2, 4, 8, 16, 32; pass block_shape="),
        ((2, 2), (4, 2), "scale_a has 2 K-blocks and scale_b 4: A and B share one K tiling, so scale_b must have "
                         "2 rows"),
    ],
)  # fmt: skip
def test_a_shape_that_does_not_tile_is_refused_naming_it(sa: tuple, sb: tuple, message: str) -> None:
    a, b = np.full((6, 32), 0x38, np.uint8), np.full((32, 4), 0x38, np.uint8)
    with pytest.raises(ValueError) as err:
        scaled_mm(a, b, np.ones(sa, np.float32), np.ones(sb, np.float32), **KW)
    assert str(err.value) == message if "edge blocks" in message else str(err.value).startswith(message)


@pytest.mark.parametrize("shape", [(2, 2, 0), (2, -2, 16), (True, 2, 16), (2, 2, 16.0), (2, 2), "2x2x16"])
def test_block_shape_must_be_three_positive_integers(shape: object) -> None:
    a, b = np.full((4, 32), 0x38, np.uint8), np.full((32, 4), 0x38, np.uint8)
    with pytest.raises(ValueError) as err:
        scaled_mm(a, b, np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), block_shape=shape, **KW)
    assert str(err.value) == (
        "block_shape must be (block_m, block_n, block_k), three positive integers (CUTLASS's scale granularity "
        f"M x N x K, e.g. (128, 64, 128) or (1, 128, 128)); got {shape!r}"
    )


def test_block_shape_takes_numpy_integers() -> None:
    a, b = np.full((4, 32), 0x38, np.uint8), np.full((32, 4), 0x38, np.uint8)  # E4M3 1.0: sums are 32
    shape = (np.int64(2), np.int32(2), np.int64(16))
    got = scaled_mm(a, b, np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), block_shape=shape, **KW)
    assert np.array_equal(got, np.full((4, 4), 32.0, np.float32))
