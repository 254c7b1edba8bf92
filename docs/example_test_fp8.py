"""Test your FP8 code against fp8sim: a complete example to copy into your own tests/.

The three ``my_*`` functions stand in for the code under test (your kernels); the tests check
them bit for bit against fp8sim.  Needs fp8sim, torch, pytest and hypothesis; run it with the
fp8sim pytest plugin enabled:

    pytest --fp8sim test_fp8.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import fp8sim
from fp8sim.gemm.torch_cpu import fallback_kernel
from fp8sim.recipe import Float8CurrentScaling, Format
from fp8sim.testing import assert_bit_exact, assert_matches_emulator, compare, emulate
from fp8sim.testing.strategies import float_arrays_near_grid, fp8_arrays

# -- the code under test (replace with yours) --------------------------------------------------


def my_cast_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating cast to float8_e4m3fn (as torchao and TransformerEngine cast)."""
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def my_current_scaling(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor current scaling to E4M3: returns the FP8 data and the dequantization scale."""
    amax = x.abs().max().float()
    scale = torch.tensor(448.0) / amax
    data = my_cast_to_e4m3(x.float() * scale)
    return data, torch.ones_like(scale) / scale


def my_scaled_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> torch.Tensor:
    """FP8 GEMM with a float32 output (here torch's own _scaled_mm)."""
    return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32)


# -- the tests -------------------------------------------------------------------------------------


def test_cast_matches_fp8sim_on_every_float16() -> None:
    """All 65,536 float16 bit patterns: round to nearest even, saturate, NaN stays NaN."""
    x = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.float16))
    assert_matches_emulator(my_cast_to_e4m3(x), "cast", x, fmt="e4m3", saturate=True)


@settings(max_examples=25, deadline=None)
@given(x=float_arrays_near_grid("e4m3", shape=256))
def test_cast_at_ties_and_range_edges(x: np.ndarray) -> None:
    """Hypothesis draws float32 values at midpoints, one ulp beside them and at the range edges."""
    assert_matches_emulator(my_cast_to_e4m3(torch.from_numpy(x)), "cast", x, fmt="e4m3")


def test_current_scaling_matches_transformer_engine() -> None:
    """Data and scale_inv bit for bit against TE's Float8CurrentScaling quantizer."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 3
    assert_matches_emulator(my_current_scaling(x), Float8CurrentScaling(fp8_format=Format.E4M3), x)


@settings(max_examples=25, deadline=None)
@given(codes=fp8_arrays("e4m3", (4, 32), specials=False))
def test_dequantize_is_exact(codes: np.ndarray) -> None:
    """Every finite E4M3 code times a power-of-two scale is exact in float32."""
    data = torch.from_numpy(codes).view(torch.float8_e4m3fn)
    assert_bit_exact(data.float() * 2.0**-3, fp8sim.decode(codes, "e4m3") * np.float32(2.0**-3))


def test_gemm_matches_dequantize_then_fp32_matmul() -> None:
    """A GEMM checked against fp8sim's model of its accumulator, here 'dequantized_fp32'; on a GPU
    name the tensor-core model instead (e.g. accumulator='hopper_split') and, if your kernel's
    summation order differs, allow a few ULPs with ulp_budget=."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(32, 64, generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn(48, 64, generator=gen).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    sa, sb = torch.tensor(0.5), torch.tensor(2.0)
    with fallback_kernel():  # AVX-512-FP16/AMX CPUs would run oneDNN, whose summation order is its own
        out = my_scaled_gemm(a, b, sa, sb)
    assert_matches_emulator(out, "scaled_mm", a, b, sa, sb, out_dtype=torch.float32, accumulator="dequantized_fp32")


def test_every_recipe_round_trips(fp8_recipe) -> None:  # fp8_recipe: the fp8sim plugin's fixture
    """Runs once per TransformerEngine recipe: quantize as the recipe does, dequantize, and bound
    the relative error by the element format's precision."""
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(2))
    qt = emulate(fp8_recipe, x)
    err = np.linalg.norm(qt.dequantize() - x.numpy()) / np.linalg.norm(x.numpy())
    assert err < {"e4m3": 0.05, "e5m2": 0.1, "e2m1": 0.15}[qt.fmt.name], compare(qt.dequantize(), x.numpy())


@pytest.mark.gpu
def test_cast_on_the_gpu() -> None:
    """Skipped unless a CUDA device with float8 support is present (the plugin's gpu marker)."""
    x = torch.randn(1 << 16, device="cuda") * 100
    assert_matches_emulator(my_cast_to_e4m3(x), "cast", x, fmt="e4m3")
