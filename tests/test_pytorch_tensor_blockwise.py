"""TE's MXFP8, FP8 block-scaling and NVFP4 quantizer/tensor classes: TE's layouts (and, for MXFP8 and
FP8 block scaling, TE's dequantization formulas), written here from NVIDIA/TransformerEngine at d0067d0:

- MXFP8: ``pytorch/tensor/mxfp8_tensor.py`` ``get_scale_shape`` (lines 164-176), data in the logical
  shape for both copies (``get_columnwise_shape``, line 178); dequantize ``fp8 * 2^(e - 127)``;
- FP8 block scaling: ``pytorch/tensor/float8_blockwise_tensor.py`` ``get_scale_shape`` (lines 183-211)
  and ``get_columnwise_shape`` (213-230): columnwise data transposed, 1x128 scales stored ``[block, row]``;
- NVFP4: ``pytorch/tensor/nvfp4_tensor.py`` ``get_scale_shape`` (lines 297-307), packed E2M1 (element
  2i in the low nibble), ``_amax_rowwise`` / ``_amax_columnwise``.

The codes and scales themselves are fp8sim.scaling's (tested bit-exact against TE's references in
tests/test_scaling_*.py); here they are read back through TE's layouts.  NVFP4 ``dequantize()`` is
compared with fp8sim's own ``dequantize_nvfp4`` (a consistency check of the class, not an independent
oracle; the NVFP4 values are checked independently in tests/test_scaling_nvfp4.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    MXFP8Quantizer,
    MXFP8Tensor,
    NVFP4Quantizer,
    NVFP4Tensor,
)
from fp8sim.scaling import dequantize_nvfp4, quantize_block_scaling, quantize_mx, quantize_nvfp4  # noqa: E402

torch.set_num_threads(1)


def _ru(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _x(shape: tuple, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 4).to(dtype)


def _e8m0(codes: torch.Tensor) -> torch.Tensor:
    return torch.tensor([2.0 ** (int(c) - 127) for c in codes.reshape(-1)], dtype=torch.float32).reshape(codes.shape)


@pytest.mark.parametrize("shape", [(64, 96), (2, 32, 64)])
@pytest.mark.parametrize("fp8", [DType.kFloat8E4M3, DType.kFloat8E5M2], ids=lambda d: d.name)
def test_mxfp8_layout_and_values(shape: tuple, fp8: DType) -> None:
    x = _x(shape)
    t = MXFP8Quantizer(fp8)(x)
    m, k = math.prod(shape[:-1]), shape[-1]
    assert isinstance(t, MXFP8Tensor) and t.shape == x.shape and t.dtype == torch.float32
    assert t._rowwise_data.shape == t._columnwise_data.shape == x.shape
    assert t._rowwise_scale_inv.shape == (_ru(m, 128), _ru(k // 32, 4))
    assert t._columnwise_scale_inv.shape == (_ru(m // 32, 4), _ru(k, 128))
    fmt = "e4m3" if fp8 == DType.kFloat8E4M3 else "e5m2"
    x2 = x.reshape(m, k).numpy()
    row = quantize_mx(x2, fmt, axis=-1, block_size=32, scale_rule="rceil", flavor="te")
    col = quantize_mx(x2, fmt, axis=0, block_size=32, scale_rule="rceil", flavor="te")
    assert np.array_equal(t._rowwise_data.reshape(m, k).numpy(), row.codes)
    assert np.array_equal(t._rowwise_scale_inv[:m, : k // 32].numpy(), row.scales)
    assert np.array_equal(t._columnwise_data.reshape(m, k).numpy(), col.codes)
    assert np.array_equal(t._columnwise_scale_inv[: m // 32, :k].numpy(), col.scales)
    fp8_t = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    want = t._rowwise_data.reshape(m, k).view(fp8_t).float() * _e8m0(
        t._rowwise_scale_inv[:m, : k // 32]
    ).repeat_interleave(32, 1)
    assert torch.equal(t.dequantize(), want.reshape(shape))
    t.update_usage(rowwise_usage=False)
    want_c = t._columnwise_data.reshape(m, k).view(fp8_t).float() * _e8m0(
        t._columnwise_scale_inv[: m // 32, :k]
    ).repeat_interleave(32, 0)
    assert torch.equal(t.dequantize(), want_c.reshape(shape))


def test_mxfp8_2d_tiles_share_one_scale() -> None:
    """``with_2d_quantization`` (TE ``common/cast/mxfp8/quantize_mxfp8.cuh``, ``kIs2DBlockScaling``
    branches at lines 265 and 421: one E8M0 exponent from the 32x32 tile's amax, used by every row
    and column of the tile): a 32x32 tile whose maximum sits in every row and every column
    (here: on its diagonal) has the 1-D row and column scales equal to the tile scale, so the 2-D
    codes equal the 1-D ones; and the two 2-D copies always agree."""
    x = _x((64, 64)) / 8
    for i in range(64):
        x[i, i] = 7.0 * (1 + (i // 32))
        x[i, (i + 32) % 64] = 7.0 * (1 + (i // 32))
    one_d = MXFP8Quantizer(DType.kFloat8E4M3)(x)
    two_d = MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=True)(x)
    assert torch.equal(two_d._rowwise_data, one_d._rowwise_data)
    assert torch.equal(two_d._rowwise_scale_inv, one_d._rowwise_scale_inv)
    y = MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=True)(_x((64, 96), seed=3))
    assert torch.equal(y._rowwise_data, y._columnwise_data)
    s = y._rowwise_scale_inv[:64, :3]
    assert torch.equal(s[::32].repeat_interleave(32, 0), s)  # one scale per tile, on each of its rows


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("shape", [(200, 300), (3, 50, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_float8_block_layout_and_values(dim: int, shape: tuple, dtype: torch.dtype) -> None:
    x = _x(shape, dtype)
    q = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=dim)
    t = q(x)
    m, k = math.prod(shape[:-1]), shape[-1]
    assert isinstance(t, Float8BlockwiseQTensor) and t.dtype == dtype and t._is_2D_scaled == (dim == 2)
    assert t._rowwise_data.shape == x.shape and t._columnwise_data.shape == (k, *shape[:-1])
    if dim == 2:
        assert t._rowwise_scale_inv.shape == (-(-m // 128), _ru(-(-k // 128), 4))
        assert t._columnwise_scale_inv.shape == (-(-k // 128), _ru(-(-m // 128), 4))
    else:
        assert t._rowwise_scale_inv.shape == (-(-k // 128), _ru(m, 4))
        assert t._columnwise_scale_inv.shape == (-(-m // 128), _ru(k, 4))
    x2 = x.reshape(m, k).float().numpy() if dtype == torch.float32 else x.reshape(m, k)
    row = quantize_block_scaling(x2, "e4m3", block_dim=dim)
    assert np.array_equal(t._rowwise_data.reshape(m, k).numpy(), row.codes[:m, :k])
    stored = t._rowwise_scale_inv.numpy()
    if dim == 1:  # [block, row]
        assert np.array_equal(stored[:, :m].T, row.scales)
    else:
        assert np.array_equal(stored[:, : row.scales.shape[1]], row.scales)
    col = quantize_block_scaling(x2, "e4m3", block_dim=dim, columnwise=dim == 1)
    assert np.array_equal(t._columnwise_data.reshape(k, m).numpy(), col.codes[:m, :k].T)
    assert torch.equal(t.dequantize(dtype=torch.float32).reshape(m, k), torch.from_numpy(row.dequantize()))
    t.update_usage(rowwise_usage=False)
    assert torch.equal(t.dequantize(dtype=torch.float32).reshape(m, k), torch.from_numpy(col.dequantize()))


def test_float8_block_quantizer_arguments_are_tes() -> None:
    with pytest.raises(RuntimeError, match="Only 1D or 2D blocks are supported, but got block_scaling_dim=3"):
        Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True, block_scaling_dim=3)
    q = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=False)
    assert (q.block_len, q.force_pow_2_scales, q.block_scaling_dim, q.amax_epsilon) == (128, True, 2, 0.0)
    assert q(_x((128, 128)))._columnwise_data is None


@pytest.mark.parametrize(
    "kw",
    [{}, {"with_2d_quantization": True}, {"with_rht": True, "with_post_rht_amax": True}, {"row_scaled_nvfp4": True}],
    ids=str,
)
def test_nvfp4_layout_and_values(kw: dict) -> None:
    x = _x((64, 96), torch.bfloat16)
    t = NVFP4Quantizer(**kw)(x)
    m, k = 64, 96
    assert isinstance(t, NVFP4Tensor) and t._fp4_dtype == DType.kFloat4E2M1 and t.dtype == torch.bfloat16
    assert t._rowwise_data.shape == (m, k // 2) and t._columnwise_data.shape == (k, m // 2)
    assert t._rowwise_scale_inv.shape == (_ru(m, 128), _ru(-(-k // 16), 4))
    assert t._columnwise_scale_inv.shape == (_ru(k, 128), _ru(-(-m // 16), 4))
    two_d = kw.get("with_2d_quantization", False)
    row = quantize_nvfp4(x, flavor="te", block_2d=two_d, row_scaled=kw.get("row_scaled_nvfp4", False))
    lo, hi = t._rowwise_data & 0x0F, t._rowwise_data >> 4  # element 2i in the low nibble
    codes = torch.stack([lo, hi], dim=-1).reshape(m, k)
    assert np.array_equal(codes.numpy(), row.codes)
    want_amax = np.asarray(row.global_amax, np.float32).reshape(-1)
    assert np.array_equal(t._amax_rowwise.numpy(), want_amax)
    assert torch.equal(t.dequantize(dtype=torch.float32), torch.from_numpy(dequantize_nvfp4(row, "te")))
    rs = kw.get("row_scaled_nvfp4", False)  # row-scaled: one amax per column of x (TE's columnwise amax)
    col = quantize_nvfp4(x.t().contiguous(), flavor="te", block_2d=two_d, rht=kw.get("with_rht", False), row_scaled=rs)
    assert np.array_equal(t._amax_columnwise.numpy(), np.asarray(col.global_amax, np.float32).reshape(-1))
    t.update_usage(rowwise_usage=False)
    assert torch.equal(t.dequantize(dtype=torch.float32), torch.from_numpy(dequantize_nvfp4(col, "te")).t())


def test_nvfp4_unemulated_options_say_so() -> None:
    with pytest.raises(ValueError, match="nvfp4_e4m3_max must be 448 or 256"):
        NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=300)
    with pytest.raises(ValueError, match="fp4_dtype must be DType.kFloat4E2M1"):
        NVFP4Quantizer(DType.kFloat8E4M3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: MXFP8Quantizer(DType.kFloat8E4M3),
        lambda: Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True),
        lambda: NVFP4Quantizer(),
    ],
    ids=["mxfp8", "block", "nvfp4"],
)
def test_common_ops_on_block_scaled_tensors(make) -> None:  # noqa: ANN001
    q = make()
    x = _x((64, 128))
    t = q(x)
    ref = t.dequantize()
    assert torch.equal(t, ref) and torch.equal(t + 1, ref + 1) and torch.equal(t.t(), ref.t())
    # TE's _ViewFunc/_ReshapeFunc: the inner dim(s) must stay, else a warning and the dequantized values
    # (an MXFP8 reshape raises instead: mxfp8_tensor.py _ReshapeFunc)
    with pytest.warns(UserWarning, match="does not support"):
        assert torch.equal(t.view(128, 64), ref.view(128, 64))
    if isinstance(t, MXFP8Tensor):
        with pytest.raises(RuntimeError, match="MXFP8Tensor does not support reshaping inner dimension"):
            t.reshape(-1)
    else:
        with pytest.warns(UserWarning, match="does not support"):
            assert torch.equal(t.reshape(-1), ref.reshape(-1))
    if not getattr(t, "_is_2D_scaled", False):  # 128x128 blocks also keep the second-to-last dim
        v = t.reshape(2, 32, 128)
        assert type(v) is type(t) and v.shape == (2, 32, 128) and torch.equal(v.dequantize(), ref.reshape(2, 32, 128))
        assert v._rowwise_data.data_ptr() == t._rowwise_data.data_ptr()
    c, d = t.clone(), t.detach()
    assert type(c) is type(t) and torch.equal(c, ref) and d._rowwise_data is t._rowwise_data
    z = q(torch.zeros(64, 128))
    z.copy_(t)
    assert torch.equal(z, ref)
    z += 1.0
    assert type(z) is type(t) and torch.equal(z.dequantize(), q(ref + 1).dequantize())
    q.set_usage(rowwise=False)
    assert q(x)._rowwise_data is None and q.get_usages() == {"rowwise": False, "columnwise": True}
    q.set_usage(columnwise=False)
    with pytest.raises(ValueError, match="needs rowwise or columnwise usage"):
        q(x)


def _ref_float_to_e8m0(d: np.float32) -> int:
    """TE ``common/util/ptx_arch_spec.cuh`` ``float_to_e8m0`` (software path, rounding up): the
    exponent of d, plus one when any mantissa bit is set; fp32 subnormals, Inf and the cap as TE."""
    bits = int(np.float32(d).view(np.uint32))
    exp, mant = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exp == 0xFF:
        return 0xFF if mant else 0xFE
    if exp == 0:
        return 1 if mant > 0x400000 else 0
    return min(exp + (1 if mant else 0), 0xFE)


@pytest.mark.parametrize("shape", [(64, 96), (96, 32)])
def test_mxfp8_2d_against_a_per_tile_reference(shape: tuple) -> None:
    """Per 32x32 tile: ``e = float_to_e8m0(fl32(amax * fl32(1/448)))``, codes ``satfinite(RN(fl32(x *
    2^(127-e))))`` (``quantize_mxfp8.cuh`` lines 421-470)."""
    import ml_dtypes

    x = _x(shape, seed=7)
    x[0, 0] = 1e-30  # a tile-mate of normal values; a whole tiny tile follows
    x[32:64, :32] *= 1e-36
    t = MXFP8Quantizer(DType.kFloat8E4M3, with_2d_quantization=True)(x)
    m, k = shape
    xs = x.numpy()
    for i in range(0, m, 32):
        for j in range(0, k, 32):
            tile = xs[i : i + 32, j : j + 32]
            d = np.float32(np.abs(tile).max()) * np.float32(1 / 448)
            e = _ref_float_to_e8m0(d)
            r = np.float32(2.0 ** (127 - e))
            want = np.clip(tile * r, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            assert np.array_equal(t._rowwise_data[i : i + 32, j : j + 32].numpy(), want), (i, j)
            assert (t._rowwise_scale_inv[i : i + 32, j // 32] == e).all()
            assert (t._columnwise_scale_inv[i // 32, j : j + 32] == e).all()
