"""``block_scale_format`` of ``fp8sim.gemm.scaled_mm`` (``fp8sim.gemm._block_formats``): which layout uint8
scale codes are read as, the partial last block of K, and the refusals with the allowed values in full.
The numerics of each variant are tested against Fraction sums in tests/test_scaling_nvfp4_variants.py; here
the oracle is the same GEMM with K padded by zero codes (E2M1 code 0 is +0: the sum cannot change)."""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.gemm import scaled_mm

FP4 = {"out_dtype": "float32", "a_format": "e2m1", "b_format": "e2m1", "strict": False, "accumulator": "exact"}
FP8 = {**FP4, "a_format": "e4m3", "b_format": "e4m3"}


def _fp4(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 16, (m, k)).astype(np.uint8), rng.integers(0, 16, (k, n)).astype(np.uint8)


@pytest.mark.parametrize(("fmt", "bs"), [("e4m3", 32), ("ue5m3", 16)])
def test_a_partial_last_k_block_is_k_padded_with_zeros(fmt: str, bs: int) -> None:
    """K = 48 with blocks of 32 (or 40 with 16): ceil(K / B) scales per row, the last block partial."""
    k = 48 if bs == 32 else 40
    kb = -(-k // bs)
    ac, bc = _fp4(4, k, 3, seed=bs)
    rng = np.random.default_rng(1)
    codes = np.array([0x38, 0x40, 0x30], np.uint8)  # E4M3 1, 2, 0.5; in UE5M3 other powers of two
    sa, sb = rng.choice(codes, (4, kb)), rng.choice(codes, (kb, 3))
    got = scaled_mm(ac, bc, sa, sb, block_scale_format=fmt, **FP4)
    pad = kb * bs - k
    ap, bp = np.pad(ac, ((0, 0), (0, pad))), np.pad(bc, ((0, pad), (0, 0)))
    want = scaled_mm(ap, bp, sa, sb, block_scale_format=fmt, **FP4)
    assert np.array_equal(got, want)


def test_e8m0_reads_mx_scales_of_fp8_operands_as_the_shape_does() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 100, (4, 64)).astype(np.uint8), rng.integers(0, 100, (64, 3)).astype(np.uint8)
    sa, sb = rng.integers(120, 130, (4, 2)).astype(np.uint8), rng.integers(120, 130, (2, 3)).astype(np.uint8)
    assert np.array_equal(scaled_mm(a, b, sa, sb, block_scale_format="e8m0", **FP8), scaled_mm(a, b, sa, sb, **FP8))


def test_e4m3_scales_need_e2m1_operands() -> None:
    """MX-shaped uint8 codes (M, K/32) with FP8 operands: E4M3 per 32 is an NVFP4 variant, FP4 only."""
    a, b = np.full((4, 64), 0x38, np.uint8), np.full((64, 3), 0x38, np.uint8)
    sa, sb = np.full((4, 2), 0x38, np.uint8), np.full((2, 3), 0x38, np.uint8)
    with pytest.raises(ValueError) as err:
        scaled_mm(a, b, sa, sb, block_scale_format="e4m3", **FP8)
    assert str(err.value) == (
        "block_scale_format='e4m3' takes uint8 scale codes shaped (M, K/B) and (K/B, N) with B = 16 or 32 and E2M1 "
        "operands; got scales (4, 2) uint8 and (2, 3) uint8 for M=4 K=64 N=3"
    )


def test_e8m0_refusal_names_its_one_block_size_and_no_operand_rule() -> None:
    ac, bc = _fp4(4, 64, 3)
    sa, sb = np.full((4, 4), 0x38, np.uint8), np.full((4, 3), 0x38, np.uint8)  # NVFP4's 16-blocks
    with pytest.raises(ValueError) as err:
        scaled_mm(ac, bc, sa, sb, block_scale_format="e8m0", **FP4)
    assert str(err.value) == (
        "block_scale_format='e8m0' takes uint8 scale codes shaped (M, K/B) and (K/B, N) with B = 32; got scales "
        "(4, 4) uint8 and (4, 3) uint8 for M=4 K=64 N=3"
    )


@pytest.mark.parametrize(("fmt", "kb", "layout"), [("e4m3", 2, "nvfp4_e4m3x32"), ("ue5m3", 4, "nvfp4_ue5m3")])
def test_variants_without_an_instruction_model_refuse_tensor_core_accumulators(fmt: str, kb: int, layout: str) -> None:
    ac, bc = _fp4(4, 64, 3)
    sa, sb = np.full((4, kb), 0x38, np.uint8), np.full((kb, 3), 0x38, np.uint8)
    with pytest.raises(NotImplementedError) as err:
        scaled_mm(ac, bc, sa, sb, block_scale_format=fmt, **{**FP4, "accumulator": "blackwell"})
    assert str(err.value) == (
        f"{layout} block scales have no tensor-core instruction model (Rubin's block-scaled MMA is not modelled); "
        "use accumulator='exact' or 'dequantized_fp32'"
    )
    for acc in ("exact", "dequantized_fp32"):
        assert scaled_mm(ac, bc, sa, sb, block_scale_format=fmt, **{**FP4, "accumulator": acc}).shape == (4, 3)
