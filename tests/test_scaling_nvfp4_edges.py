"""NVFP4 edges of ``fp8sim.scaling`` (TE, TE 4over6, TE stochastic rounding, torchao) that the main oracle tests
do not reach: overflowing products and amaxes, all-NaN and empty tensors, row-scaled dequantization, signalling
NaNs, and the exact messages of refused arguments.  References, zero tolerance:

- TE's Python reference ``_quantize_blockwise_reference`` (``tests/_te_nvfp4_reference.py``, written from
  ``pytorch/custom_recipes/reference_nvfp4.py`` at d0067d0);
- TE's ``dequantize_fp4_kernel`` (``common/cast/nvfp4/dequantize_nvfp4.cuh`` at d0067d0):
  ``final = fl32(fl32(float(scale_e4m3) * amax[row]) * fl32(1 / (6 * E4M3_MAX)))``, ``out = fl32(e2m1 * final)``,
  written here one float32 operation per element with ml_dtypes decoding the codes;
- ``core_nvfp4.cuh`` ``compute_global_encode_scaling_factor_FP4``: ``fminf(6 * E4M3_MAX / amax, FLT_MAX)``, 1
  when the amax is 0; TE's amax kernels take ``fmaxf`` from 0 (NaN skipped, so an all-NaN tensor has amax 0);
- torchao 0.18's own ``nvfp4_quantize`` (single level, ``per_tensor_scale=None``).
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from _te_nvfp4_reference import quantize_1x16  # noqa: E402

from fp8sim.scaling.nvfp4 import dequantize_nvfp4, quantize_nvfp4  # noqa: E402
from fp8sim.scaling.nvfp4_4over6 import dequantize_nvfp4_te, quantize_nvfp4_4over6  # noqa: E402
from fp8sim.scaling.nvfp4_te_sr import quantize_nvfp4_te_sr_rht  # noqa: E402
from fp8sim.scaling.packing import pack_fp4  # noqa: E402
from fp8sim.scaling.swizzle import blocked_size, to_blocked, unswizzle_mm_scales  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
SNAN = np.array([0x7F800001], np.uint32).view(np.float32)[0]  # a signalling NaN


def _e4m3(codes: np.ndarray) -> np.ndarray:
    return np.asarray(codes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)


def _e2m1(codes: np.ndarray) -> np.ndarray:
    return np.asarray(codes, np.uint8).view(ml_dtypes.float4_e2m1fn).astype(F32)


def _te_dequantize(codes: np.ndarray, scales: np.ndarray, amax: np.ndarray, e4m3_max: int) -> np.ndarray:
    """dequantize_fp4_kernel, element by element: amax has one value per row (or one for the tensor)."""
    rows, cols = codes.shape
    amax = np.broadcast_to(np.asarray(amax, F32).reshape(-1), (rows,))
    factor = F32(1) / F32(6 * e4m3_max)
    out = np.empty((rows, cols), F32)
    s, v = _e4m3(scales), _e2m1(codes)
    for r in range(rows):
        for c in range(cols):
            final = F32(F32(s[r, c // 16] * amax[r]) * factor)
            out[r, c] = F32(v[r, c] * final)
    return out


# -- TE NVFP4 ---------------------------------------------------------------------------------------------------


def test_te_block_whose_scale_underflows_saturates_like_the_reference_without_a_warning() -> None:
    """A block far below the global amax gets E4M3 scale 0, so its coefficient is FLT_MAX and ``x * FLT_MAX``
    overflows: TE clamps it to +-6 (code 0x7), silently."""
    x = torch.zeros(16, 32)
    x[0, :16] = torch.linspace(2.0, 3.0, 16)
    x[0, 16:] = 1e7
    x[1, :16] = -2.5
    want_packed, want_scales, _ = quantize_1x16(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_nvfp4(x, flavor="te")
    assert q.scales[0, 0] == 0 and (q.codes[0, :16] == 0x7).all() and (q.codes[1, :16] == 0xF).all()
    np.testing.assert_array_equal(pack_fp4(q.codes), want_packed.numpy())
    np.testing.assert_array_equal(q.scales, want_scales.numpy())


def test_te_shape_messages_name_the_offending_dims() -> None:
    with pytest.raises(ValueError, match=r"^x: last dim 20 must be divisible by the NVFP4 block size 16"):
        quantize_nvfp4(np.ones((16, 32, 20), np.float32))
    with pytest.raises(ValueError, match=r"^x must have at least 2 dims for flavor='torchao' \(nvfp4_quantize\)"):
        quantize_nvfp4(np.ones(32, np.float32), flavor="torchao")


def test_row_scaled_te_dequantize_uses_each_rows_amax() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(32, 48, generator=g) * torch.exp2(torch.arange(32.0) - 16).reshape(32, 1)
    q = quantize_nvfp4(x, flavor="te", row_scaled=True)
    want = _te_dequantize(q.codes, q.scales, q.global_amax, 448)
    np.testing.assert_array_equal(dequantize_nvfp4(q), want)


# -- TE 4over6 --------------------------------------------------------------------------------------------------


def test_4over6_te_dequantize_per_row_and_per_tensor_rounds_in_float32() -> None:
    """TE's amax is a float32 tensor: an amax given as Python floats is rounded to float32 first, and every step
    rounds to float32."""
    rng = np.random.default_rng(11)
    codes = rng.integers(0, 16, (3, 32)).astype(np.uint8)
    scales = rng.integers(0x08, 0x78, (3, 2)).astype(np.uint8)  # finite, normal and subnormal E4M3
    amax = [float(v) for v in rng.random(3) * 1000 + 1]  # float64 values, not float32 ones
    for e4m3_max in (256, 448):
        want = _te_dequantize(codes, scales, np.array(amax, F32), e4m3_max)
        np.testing.assert_array_equal(dequantize_nvfp4_te(codes, scales, amax, e4m3_max), want)
        want = _te_dequantize(codes, scales, np.array(amax[:1], F32), e4m3_max)
        np.testing.assert_array_equal(dequantize_nvfp4_te(codes, scales, amax[0], e4m3_max), want)


def test_4over6_all_nan_and_empty_tensors_have_amax_zero_and_global_scale_one() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_nvfp4_4over6(np.full((2, 32), np.nan, F32))
        assert q.global_amax == 0.0 and q.global_scale == 1.0
        assert (q.codes == 0x7).all()  # cvt.rn.satfinite of NaN, taken as +6 (module docstring)
        x = np.ones((2, 32), F32)
        x[0] = np.nan
        r = quantize_nvfp4_4over6(x, row_scaled=True)
        np.testing.assert_array_equal(r.global_amax.reshape(-1), [0.0, 1.0])
        assert r.global_scale.reshape(-1)[0] == 1.0
        empty = quantize_nvfp4_4over6(np.zeros((0, 32), F32))
        assert empty.codes.shape == (0, 32) and empty.global_amax == 0.0 and empty.global_scale == 1.0


def test_4over6_subnormal_amax_caps_the_encode_scale_at_flt_max_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for e4m3_max in (256, 448):
            q = quantize_nvfp4_4over6(np.full((1, 16), 1e-40, F32), e4m3_max=e4m3_max)
            assert F32(q.global_scale) == F32(1) / FLT_MAX


def test_4over6_messages() -> None:
    with pytest.raises(ValueError, match=r"^row_scaled: TE 'Row-scaled NVFP4 quantization does not support 2D"):
        quantize_nvfp4_4over6(np.ones((16, 16), F32), block_2d=True, row_scaled=True)
    with pytest.raises(ValueError, match=r"^global_amax: expected 1 values, got 2$"):
        quantize_nvfp4_4over6(np.ones((2, 16), F32), global_amax=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"^global_amax: expected 2 values, got 1$"):
        quantize_nvfp4_4over6(np.ones((2, 16), F32), global_amax=[1.0], row_scaled=True)


# -- TE stochastic rounding with RHT ----------------------------------------------------------------------------


def test_fused_rht_cast_makes_only_the_requested_copies() -> None:
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    rowwise_only = quantize_nvfp4_te_sr_rht(x, None, (7, 0), fused=True, columnwise=False)
    assert rowwise_only.columnwise is None and rowwise_only.rowwise.codes.shape == (64, 128)
    with pytest.raises(ValueError, match=r"^at least one of rowwise or columnwise must be True$"):
        quantize_nvfp4_te_sr_rht(x, None, (7, 0), rowwise=False, columnwise=False)


# -- torchao single level ---------------------------------------------------------------------------------------


def test_torchao_single_level_signalling_nan_equals_nvfp4_quantize_without_a_warning() -> None:
    nv = require("torchao.prototype.mx_formats.nvfp4_tensor")
    from torchao.prototype.mx_formats.kernels import unpack_uint4

    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(2))
    x.view(-1)[5] = torch.from_numpy(np.array([SNAN]))[0]
    x.view(-1)[40] = torch.from_numpy(np.array([-SNAN]))[0]
    s, d = nv.nvfp4_quantize(x.clone(), 16, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = quantize_nvfp4(x, flavor="torchao", single_level=True)
    np.testing.assert_array_equal(q.codes, unpack_uint4(d).numpy().reshape(q.codes.shape))
    np.testing.assert_array_equal(q.scales, s.view(torch.uint8).numpy().reshape(q.scales.shape))


# -- packing and swizzling --------------------------------------------------------------------------------------


def test_pack_fp4_messages_name_codes_and_the_allowed_range() -> None:
    with pytest.raises(ValueError, match=r"^codes: code 16 out of range; 4-bit codes must be in \[0, 15\]$"):
        pack_fp4(torch.tensor([[1, 16]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^codes: last dim 3 must be even to pack two FP4 codes per byte"):
        pack_fp4(np.zeros((2, 3), np.uint8))


def test_unswizzle_leaves_scales_alone_unless_both_are_blocked_uint8_codes() -> None:
    """``torch._scaled_mm`` takes MX scales blocked only as a pair of flat uint8 code arrays; one flat uint8
    array next to float32 scales is not such a pair and comes back as given."""
    m = n = 128
    k = 128  # 4 blocks of 32
    sa = to_blocked(np.arange(m * 4, dtype=np.uint8).reshape(m, 4) % 127)
    assert sa.ndim == 1 and sa.size == blocked_size(m, 4)
    sb = np.ones(blocked_size(n, 4), F32)
    for pair in ((sa, sb), (sb, sa)):
        got = unswizzle_mm_scales(None, None, pair[0], pair[1], m, k, n, False)
        assert got[0] is pair[0] and got[1] is pair[1]
