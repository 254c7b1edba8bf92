"""Block-scaled ``scaled_mm`` of any tiling (A scales per m-block x k-block, B per k-block x n-block)
against references written here: exact rationals (``Fraction``) and the float32 FMA orders kernels
use, read from TE (``tests/pytorch/references/blockwise_fp8_gemm_reference.py``: per K-block partial,
``fma(fl32(P * s1), s2, y)``) and CUTLASS (``include/cutlass/gemm/collective/fp8_accumulation.hpp``
``scale_core``: ``accum += accum_temp * scaleA * scaleB``, or ``accum += accum_temp * scale`` with
``scale = scaleA * scaleB`` formed first, ``sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp``).
Includes NVIDIA/cutlass#3596 (256x128x128, scale granularity 128x64x128: D[128, 0] is 512)."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from fp8sim.gemm import scaled_mm
from fp8sim.testing.oracles import require

E4 = ml_dtypes.float8_e4m3fn
ACCUMULATORS = ["exact", "dequantized_fp32", "hopper_split", "hopper_fast", "ada_fast", "blackwell", "blackwell_mma"]


def _f32(x: Fraction) -> float:
    """Nearest-even float32 of an exact rational (normal range), independent of fp8sim."""
    w = np.float32(float(x))
    cands = [np.nextafter(w, np.float32(-np.inf)), w, np.nextafter(w, np.float32(np.inf))]
    return float(min(cands, key=lambda v: (abs(Fraction(float(v)) - x), int(np.array(v).view(np.uint32)) & 1)))


def _e4(v: np.ndarray) -> np.ndarray:
    c = np.asarray(v, np.float32).astype(E4)
    assert np.array_equal(c.astype(np.float32), np.asarray(v, np.float32))
    return c.view(np.uint8)


@pytest.mark.parametrize("acc", ACCUMULATORS)
@pytest.mark.parametrize("inferred", [False, True])
def test_cutlass_3596_128x64x128_granularity(acc: str, inferred: bool) -> None:
    """FP8 ones; A scales 2 and 4 on the two 128-row bands, B scales 1 and 2 on the two 64-column bands:
    every output is 128 * sa(row band) * sb(column band); the buggy kernel gave 1024 at D[128, 0]."""
    m, n, k = 256, 128, 128
    a = _e4(np.ones((m, k)))
    b = _e4(np.ones((k, n)))
    sa = np.array([[2.0], [4.0]], np.float32)  # (M / 128, K / 128)
    sb = np.array([[1.0, 2.0]], np.float32)  # (K / 128, N / 64)
    kw = {"strict": False} if inferred else {"block_shape": (128, 64, 128)}
    d = scaled_mm(a, b, sa, sb, out_dtype="float32", accumulator=acc, a_format="e4m3", b_format="e4m3", **kw)
    want = np.array([[128.0 * sa[i // 128, 0] * sb[0, j // 64] for j in range(n)] for i in range(m)], np.float32)
    assert d[128, 0] == 512.0
    assert np.array_equal(d, want)


def _reference(va, vb, sa, sb, tiling, order) -> np.ndarray:  # noqa: ANN001
    """Exact per-K-block sums rounded once to float32, then each block's FMA in ``order``, with every
    float32 operation evaluated exactly and rounded once (``_f32``)."""
    bm, bn, bk = tiling
    m, k = va.shape
    n = vb.shape[1]
    out = np.zeros((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            y = Fraction(0)
            for t, k0 in enumerate(range(0, k, bk)):
                p = Fraction(
                    _f32(sum(Fraction(float(va[i, q])) * Fraction(float(vb[q, j])) for q in range(k0, min(k0 + bk, k))))
                )
                s_a, s_b = Fraction(float(sa[i // bm, t])), Fraction(float(sb[t, j // bn]))
                if order == "scale_a_first":
                    y = Fraction(_f32(Fraction(_f32(p * s_a)) * s_b + y))
                elif order == "scale_b_first":
                    y = Fraction(_f32(Fraction(_f32(p * s_b)) * s_a + y))
                else:
                    y = Fraction(_f32(p * Fraction(_f32(s_a * s_b)) + y))
            out[i, j] = float(y)
    return out


TILINGS = [(1, 1, 32), (1, 3, 32), (2, 3, 16), (4, 1, 64), (1, 6, 64), (2, 2, 32)]


@pytest.mark.parametrize("tiling", TILINGS)
@pytest.mark.parametrize("order", ["scale_a_first", "scale_b_first", "scale_product"])
def test_any_tiling_with_the_exact_accumulator_against_rationals(tiling: tuple, order: str) -> None:
    """1x32 / 1x64 activation blocks, 2D blocks on either side or both; random FP8 and random float32 scales
    (not powers of two, so the FMA orders differ)."""
    rng = np.random.default_rng(sum(tiling) * 7 + len(order))
    m, n, k = 4, 6, 64
    va = (rng.standard_normal((m, k)) * 20).astype(np.float32).astype(E4).astype(np.float32)
    vb = (rng.standard_normal((k, n)) * 20).astype(np.float32).astype(E4).astype(np.float32)
    bm, bn, bk = tiling
    sa = rng.uniform(0.01, 3.0, (m // bm, k // bk)).astype(np.float32)
    sb = rng.uniform(0.01, 3.0, (k // bk, n // bn)).astype(np.float32)
    want = _reference(va, vb, sa, sb, tiling, order)
    for kw in ({"block_shape": tiling}, {}):  # small shapes: strict=False lifts torch's multiple-of-16 rule
        got = scaled_mm(_e4(va), _e4(vb), sa, sb, out_dtype="float32", accumulator="exact", a_format="e4m3",
                        b_format="e4m3", block_order=order, strict=False, **kw)  # fmt: skip
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (kw, order)


def test_block_order_is_honoured_and_the_default_follows_te() -> None:
    rng = np.random.default_rng(5)
    m, n, k, tiling = 4, 6, 64, (2, 1, 32)  # 2D A, 1D B: TE multiplies by sb first
    va = (rng.standard_normal((m, k)) * 20).astype(np.float32).astype(E4).astype(np.float32)
    vb = (rng.standard_normal((k, n)) * 20).astype(np.float32).astype(E4).astype(np.float32)
    sa = rng.uniform(0.01, 3.0, (2, 2)).astype(np.float32)
    sb = rng.uniform(0.01, 3.0, (2, 6)).astype(np.float32)
    kw = {"out_dtype": "float32", "accumulator": "exact", "a_format": "e4m3", "b_format": "e4m3", "strict": False}
    kw["block_shape"] = tiling
    outs = {
        o: scaled_mm(_e4(va), _e4(vb), sa, sb, block_order=o, **kw)
        for o in ("scale_a_first", "scale_b_first", "scale_product")
    }
    assert len({o.tobytes() for o in outs.values()}) == 3  # the three orders differ on these scales
    assert np.array_equal(scaled_mm(_e4(va), _e4(vb), sa, sb, **kw), outs["scale_b_first"])
    kw["block_shape"] = (1, 2, 32)  # 1D A: TE multiplies by sa first
    sa1 = rng.uniform(0.01, 3.0, (4, 2)).astype(np.float32)
    sb1 = rng.uniform(0.01, 3.0, (2, 3)).astype(np.float32)
    assert np.array_equal(scaled_mm(_e4(va), _e4(vb), sa1, sb1, **kw),
                          scaled_mm(_e4(va), _e4(vb), sa1, sb1, block_order="scale_a_first", **kw))  # fmt: skip


def test_torch_layouts_keep_their_meaning_and_equal_the_explicit_tiling() -> None:
    """1x128 A x 128x128 B as torch takes it (partial last N block) is the tiling (1, 128, 128)."""
    rng = np.random.default_rng(9)
    m, n, k = 3, 200, 256
    a = _e4((rng.standard_normal((m, k)) * 9).astype(np.float32).astype(E4).astype(np.float32))
    b = _e4((rng.standard_normal((k, n)) * 9).astype(np.float32).astype(E4).astype(np.float32))
    sa = rng.uniform(0.1, 2, (m, 2)).astype(np.float32)
    sb = rng.uniform(0.1, 2, (2, 2)).astype(np.float32)
    kw = {"out_dtype": "float32", "accumulator": "hopper_split", "a_format": "e4m3", "b_format": "e4m3"}
    torch_way = scaled_mm(a, b, sa, sb, strict=False, **kw)
    assert np.array_equal(torch_way, scaled_mm(a, b, sa, sb, block_shape=(1, 128, 128), strict=False, **kw))
    # the same shapes read as a dividing tiling (N blocks of 100) is another GEMM: only on request
    other = scaled_mm(a, b, sa, sb, block_shape=(1, 100, 128), strict=False, **kw)
    assert not np.array_equal(torch_way, other)


@pytest.mark.parametrize("acc", ["hopper_split", "ada_fast", "blackwell_mma"])
def test_torch_backend_runs_any_tiling_as_the_numpy_path(acc: str) -> None:
    require("torch")
    rng = np.random.default_rng(11)
    a = _e4((rng.standard_normal((8, 128)) * 30).astype(np.float32).astype(E4).astype(np.float32))
    b = _e4((rng.standard_normal((128, 12)) * 30).astype(np.float32).astype(E4).astype(np.float32))
    sa = rng.uniform(0.1, 2, (4, 2)).astype(np.float32)
    sb = rng.uniform(0.1, 2, (2, 3)).astype(np.float32)
    kw = {"out_dtype": "float32", "accumulator": acc, "a_format": "e4m3", "b_format": "e4m3", "strict": False}
    kw["block_shape"] = (2, 4, 64)
    ref = scaled_mm(a, b, sa, sb, backend="numpy", **kw)
    assert np.array_equal(scaled_mm(a, b, sa, sb, backend="torch", **kw).view(np.uint32), ref.view(np.uint32))


def test_dequantized_fp32_with_any_tiling_against_float64() -> None:
    """Dequantize each operand with its block's scale, one float32 matmul: exact here (small integers
    times powers of two), so float64 is the reference."""
    rng = np.random.default_rng(2)
    m, n, k = 6, 4, 32
    va = rng.integers(-8, 9, (m, k)).astype(np.float32)
    vb = rng.integers(-8, 9, (k, n)).astype(np.float32)
    sa = np.exp2(rng.integers(-3, 4, (3, 4))).astype(np.float32)  # block_m 2, block_k 8
    sb = np.exp2(rng.integers(-3, 4, (4, 2))).astype(np.float32)  # block_n 2
    da = va.astype(np.float64) * np.repeat(np.repeat(sa, 2, 0), 8, 1)
    db = vb.astype(np.float64) * np.repeat(np.repeat(sb, 8, 0), 2, 1)
    got = scaled_mm(_e4(va), _e4(vb), sa, sb, out_dtype="float32", accumulator="dequantized_fp32", a_format="e4m3",
                    b_format="e4m3", block_shape=(2, 2, 8), strict=False)  # fmt: skip
    assert np.array_equal(got, (da @ db).astype(np.float32))


def _args(m: int = 256, n: int = 128, k: int = 128) -> tuple:
    return _e4(np.ones((m, k))), _e4(np.ones((k, n)))


def test_a_tiling_that_does_not_divide_names_the_argument_and_the_allowed_values() -> None:
    a, b = _args()
    kw = {"out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3", "strict": False}
    with pytest.raises(ValueError, match=r"scale_a has 3 rows, which does not divide M=256 .* one of 1, 2, 4, 8, 16"):
        scaled_mm(a, b, np.ones((3, 1), np.float32), np.ones((1, 2), np.float32), **kw)
    with pytest.raises(ValueError, match=r"scale_b has 3 columns, which does not divide N=128 .* block_shape="):
        scaled_mm(a, b, np.ones((2, 1), np.float32), np.ones((1, 3), np.float32), **kw)
    with pytest.raises(ValueError, match=r"scale_b must have 1 rows"):
        scaled_mm(a, b, np.ones((2, 1), np.float32), np.ones((2, 2), np.float32), **kw)


def test_explicit_block_shape_is_checked_against_the_scale_shapes() -> None:
    a, b = _args()
    kw = {"out_dtype": "float32", "a_format": "e4m3", "b_format": "e4m3"}
    sa, sb = np.ones((2, 1), np.float32), np.ones((1, 2), np.float32)
    with pytest.raises(
        ValueError, match=r"scale_a must have shape \(4, 1\) for block_shape=\(64, 64, 128\) with M=256"
    ):
        scaled_mm(a, b, sa, sb, block_shape=(64, 64, 128), **kw)
    with pytest.raises(ValueError, match=r"scale_b must have shape \(1, 1\) for block_shape=\(128, 128, 128\)"):
        scaled_mm(a, b, sa, sb, block_shape=(128, 128, 128), **kw)
    with pytest.raises(ValueError, match=r"block_shape must be \(block_m, block_n, block_k\), three positive integers"):
        scaled_mm(a, b, sa, sb, block_shape=(128, 64), **kw)
    with pytest.raises(
        ValueError, match="block_order must be None or one of scale_a_first, scale_b_first, scale_product"
    ):
        scaled_mm(a, b, sa, sb, block_shape=(128, 64, 128), block_order="cutlass", **kw)
    with pytest.raises(ValueError, match="block_order applies to float32 block scales; these scales are tensorwise"):
        scaled_mm(a, b, np.float32(1), np.float32(1), block_order="scale_product", **kw)


def test_strict_keeps_torchs_layouts_and_points_at_the_extension() -> None:
    """torch._scaled_mm takes 1x128 / 128x128 only: strict=True (the default, what emulate_scaled_mm uses)
    refuses another tiling with torch's message plus how to ask for it."""
    a, b = _args()
    with pytest.raises(
        ValueError, match=r"(?s)Invalid scaling configuration\..*block_shape=\(block_m, block_n, block_k\)"
    ):
        scaled_mm(a, b, np.ones((2, 1), np.float32), np.ones((1, 2), np.float32), out_dtype="float32",
                  a_format="e4m3", b_format="e4m3")  # fmt: skip
