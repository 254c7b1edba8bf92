"""The 128x4 blocked ("swizzled") scale layout against torchao 0.18's own conversion
(``torchao/prototype/mx_formats/utils.py`` ``to_blocked`` / ``from_blocked``, and the swizzled scales of
``MXTensor.to_mx(..., is_swizzled_scales=True)`` / ``NVFP4Tensor.to_nvfp4(..., is_swizzled_scales=True)``),
and ``scaled_mm`` taking blocked scales as ``torch._scaled_mm`` does.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8sim.gemm import scaled_mm
from fp8sim.scaling.mx import quantize_mx
from fp8sim.scaling.nvfp4 import quantize_nvfp4
from fp8sim.scaling.swizzle import blocked_size, from_blocked, to_blocked
from fp8sim.testing.oracles import require

torch = require("torch")
ao_utils = require("torchao.prototype.mx_formats.utils")

SHAPES = [(1, 1), (128, 4), (130, 7), (256, 8), (5, 33), (0, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_to_blocked_equals_torchao(shape):
    x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    want = ao_utils.to_blocked(x).numpy()
    got = to_blocked(x.numpy())
    assert got.shape == want.shape == (blocked_size(*shape),) and np.array_equal(got, want)
    assert np.array_equal(from_blocked(want, *shape), x.numpy())
    assert np.array_equal(ao_utils.from_blocked(torch.from_numpy(got), *shape).numpy(), x.numpy())


def test_torch_tensors_keep_dtype_and_values():
    x = torch.randint(0, 255, (130, 7), dtype=torch.uint8).view(torch.float8_e8m0fnu)
    got = to_blocked(x)
    assert got.dtype == torch.float8_e8m0fnu
    assert torch.equal(got.view(torch.uint8), ao_utils.to_blocked(x.view(torch.uint8)))
    assert torch.equal(from_blocked(got, 130, 7).view(torch.uint8), x.view(torch.uint8))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 300), st.integers(0, 20), st.integers(0, 2**31 - 1))
def test_from_blocked_inverts_to_blocked(rows, cols, seed):
    x = np.random.default_rng(seed).integers(0, 256, (rows, cols), dtype=np.uint8)
    b = to_blocked(x)
    assert b.size == blocked_size(rows, cols) and np.array_equal(from_blocked(b, rows, cols), x)
    assert (b == 0).sum() >= b.size - x.size  # the padding is zeros


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="2-D"):
        to_blocked(np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="512 in the 128x4 layout"):
        from_blocked(np.zeros(100, np.uint8), 3, 2)
    with pytest.raises(ValueError, match="rows must be an int"):
        from_blocked(np.zeros(512, np.uint8), -1, 2)


@pytest.mark.parametrize("shape", [(130, 96), (128, 64), (16, 32)], ids=str)
def test_quantize_mx_swizzle_equals_torchao_mxtensor(shape):
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    want = MXTensor.to_mx(x, torch.float8_e4m3fn, 32, is_swizzled_scales=True).scale.view(torch.uint8).reshape(-1)
    q = quantize_mx(x, swizzle=True)
    assert np.array_equal(q.blocked_scales, want.numpy())
    assert quantize_mx(x).blocked_scales is None


@pytest.mark.parametrize("single_level", [True, False], ids=["single", "two_level"])
def test_quantize_nvfp4_swizzle_equals_torchao_nvfp4tensor(single_level):
    nv = require("torchao.prototype.mx_formats.nvfp4_tensor")
    x = torch.randn(130, 64, generator=torch.Generator().manual_seed(2))
    pts = None if single_level else nv.per_tensor_amax_to_scale(torch.max(torch.abs(x)))
    t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts, is_swizzled_scales=True)
    q = quantize_nvfp4(x, flavor="torchao", single_level=single_level, swizzle=True)
    assert np.array_equal(q.blocked_scales, t.scale.view(torch.uint8).numpy().reshape(-1))


def _mm(a, b, sa, sb, fmt):
    return scaled_mm(a, b, sa, sb, out_dtype="float32", accumulator="exact", a_format=fmt, b_format=fmt, strict=False)


@pytest.mark.parametrize("fmt,bs", [("e4m3", 32), ("e2m1", 16), ("e2m1", 32)])
def test_scaled_mm_takes_blocked_scales_like_plain_ones(fmt, bs):
    """torch._scaled_mm takes MX/NVFP4 scales flat in the blocked layout, ``scale_b`` as the blocked
    ``(N, K/bs)`` matrix (torchao ``mx_formats/mx_tensor.py`` / ``nvfp4_tensor.py`` mm paths)."""
    rng = np.random.default_rng(3)
    m, k, n = 5, 64, 7
    top = 16 if fmt == "e2m1" else 0x7F
    a = rng.integers(0, top, (m, k)).astype(np.uint8)
    b = rng.integers(0, top, (k, n)).astype(np.uint8)
    a[a == 0x7F] = 0  # no NaN codes
    b[b == 0x7F] = 0
    lo, hi = (0x30, 0x40) if bs == 16 else (120, 135)
    sa = rng.integers(lo, hi, (m, k // bs)).astype(np.uint8)
    sb = rng.integers(lo, hi, (k // bs, n)).astype(np.uint8)
    want = _mm(a, b, sa, sb, fmt)
    flat_a, flat_b = to_blocked(sa), to_blocked(np.ascontiguousarray(sb.T))
    if fmt == "e2m1" and bs == 32:  # numpy codes are ambiguous for FP4: say E8M0 with a torch dtype
        flat_a = torch.from_numpy(flat_a).view(torch.float8_e8m0fnu)
        flat_b = torch.from_numpy(flat_b).view(torch.float8_e8m0fnu)
    assert np.array_equal(_mm(a, b, flat_a, flat_b, fmt), want)
