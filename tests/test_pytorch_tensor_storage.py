"""TE's tensor-side API: the ``*TensorStorage`` hierarchy, ``_get_quantizer`` / ``update_quantizer``,
``tensor.utils.replace_raw_data`` and ``quantize_master_weights`` (single process).

References written from NVIDIA/TransformerEngine at d0067d0:

- ``pytorch/quantized_tensor.py`` ``QuantizedTensorStorage`` (line 53; ``_get_quantizer`` 132-147:
  the tensor's quantizer else ``_build_default_quantizer``, which raises ``ValueError``;
  ``update_quantizer`` 156-162: ``RuntimeError`` without a quantizer, a warning when it changes);
  ``QuantizedTensor(torch.Tensor)`` (line 707) is not a storage; each tensor is
  ``XTensor(XTensorStorage, QuantizedTensor)`` (``tensor/float8_tensor.py`` 440, ``mxfp8_tensor.py`` 227,
  ``float8_blockwise_tensor.py`` 258, ``nvfp4_tensor.py`` 405, ``identity_tensor.py`` 172), each storage a
  ``QuantizedTensorStorage`` (``tensor/storage/*.py``); MXFP8's default quantizer is
  ``MXFP8Quantizer(fp8_dtype)`` (``mxfp8_tensor.py`` 300-302), NVFP4's ``NVFP4Quantizer()`` (``nvfp4_tensor.py``
  500-508);
- ``pytorch/tensor/utils.py`` ``replace_raw_data`` (lines 30-98): copy the raw buffer into the new one and
  make it the tensor's (``_data`` / ``_rowwise_data`` / ``_hp_data``), ``ValueError`` on a dtype mismatch,
  ``NotImplementedError`` for MXFP8; ``quantize_master_weights`` (204-344): master cast to the model
  weight's dtype, delayed scaling (371-463) casts the flat fragment with the quantizer's scale, folds the
  amax, then ``scale_inv = 1/scale``; current scaling (466-590) takes the master's amax, ``scale`` from it,
  writes ``scale_inv`` and casts the fragment with ``scale``.
"""

from __future__ import annotations

import warnings

import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

import fp8sim.pytorch as te  # noqa: E402
from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    Float8BlockwiseQTensorStorage,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    Float8TensorStorage,
    IdentityQuantizer,
    IdentityTensor,
    IdentityTensorStorage,
    MXFP8Quantizer,
    MXFP8Tensor,
    MXFP8TensorStorage,
    NVFP4Quantizer,
    NVFP4Tensor,
    NVFP4TensorStorage,
    QuantizedTensor,
    QuantizedTensorStorage,
)
from fp8sim.pytorch.tensor.utils import cast_master_weights_to_fp8, quantize_master_weights, replace_raw_data  # noqa: E402

torch.set_num_threads(1)
E4M3 = DType.kFloat8E4M3


def _x(shape: tuple = (32, 64), seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _delayed(scale: float = 1.0) -> Float8Quantizer:
    return Float8Quantizer(torch.tensor([scale]), torch.zeros(1), E4M3)


QUANTIZERS = {
    "float8": (_delayed, Float8Tensor, Float8TensorStorage),
    "mxfp8": (lambda: MXFP8Quantizer(E4M3), MXFP8Tensor, MXFP8TensorStorage),
    "block": (
        lambda: Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True),
        Float8BlockwiseQTensor,
        Float8BlockwiseQTensorStorage,
    ),
    "nvfp4": (NVFP4Quantizer, NVFP4Tensor, NVFP4TensorStorage),
    "identity": (IdentityQuantizer, IdentityTensor, IdentityTensorStorage),
}


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_tensor_classes_follow_tes_storage_hierarchy(name: str) -> None:
    make, cls, storage = QUANTIZERS[name]
    assert cls.__mro__[1] is storage and issubclass(storage, QuantizedTensorStorage)
    assert not issubclass(storage, torch.Tensor) and not issubclass(QuantizedTensor, QuantizedTensorStorage)
    q = make()
    t = q(_x())
    assert isinstance(t, storage) and isinstance(t, QuantizedTensorStorage) and isinstance(t, QuantizedTensor)
    assert t._get_quantizer() is t._quantizer
    assert te.Float8TensorStorage is Float8TensorStorage and te.QuantizedTensorStorage is QuantizedTensorStorage


def test_update_quantizer_warns_and_later_in_place_quantization_uses_it() -> None:
    t = Float8CurrentScalingQuantizer(E4M3)(_x())
    new = Float8CurrentScalingQuantizer(E4M3, force_pow_2_scales=True)
    with pytest.warns(UserWarning, match="Quantizer is being updated, this may affect model behavior"):
        t.update_quantizer(new)
    assert t._get_quantizer() is new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.update_quantizer(new)  # the same quantizer: no warning
    x = _x(seed=1)
    t.quantize_(x)
    amax = x.abs().max()
    scale = torch.tensor(448.0) / amax
    pow2 = torch.exp2(torch.floor(torch.log2(scale)))  # force_pow_2_scales: round the scale down to 2^k
    assert torch.equal(t._scale_inv, (1 / pow2).reshape(1))
    bare = Float8Tensor(shape=(4, 4), dtype=torch.float32, data=torch.zeros(4, 4, dtype=torch.uint8), fp8_scale_inv=1.0)
    with pytest.raises(RuntimeError, match="To be updated, quantizer must be set"):
        bare.update_quantizer(new)
    with pytest.raises(ValueError, match="Float8Tensor has no quantizer and no default quantizer"):
        bare.quantize_(torch.ones(4, 4))


def test_block_tensors_without_a_quantizer_use_tes_default_one() -> None:
    x = _x()
    m = MXFP8Quantizer(DType.kFloat8E5M2)(x)
    m._quantizer = None
    d = m._get_quantizer()
    assert isinstance(d, MXFP8Quantizer) and d.dtype == DType.kFloat8E5M2 and not d.with_2d_quantization
    m.quantize_(2 * x)
    ref = MXFP8Quantizer(DType.kFloat8E5M2)(2 * x)
    assert torch.equal(m._rowwise_data, ref._rowwise_data) and torch.equal(m._rowwise_scale_inv, ref._rowwise_scale_inv)
    n = NVFP4Quantizer(with_2d_quantization=True)(x)
    n._quantizer = None
    d = n._get_quantizer()
    assert isinstance(d, NVFP4Quantizer) and not (d.with_2d_quantization or d.with_rht or d.stochastic_rounding)


@pytest.mark.parametrize("name", ["float8", "block", "nvfp4", "identity"])
def test_replace_raw_data_moves_the_buffer_and_keeps_the_values(name: str) -> None:
    make, _, _ = QUANTIZERS[name]
    t = make()(_x())
    attr = {"float8": "_data", "identity": "_hp_data"}.get(name, "_rowwise_data")
    old = getattr(t, attr).clone()
    before = t.dequantize().clone()
    buf = torch.empty(old.numel() + 8, dtype=old.dtype)[8:].view(old.shape)  # inside a bigger (ZeRO) buffer
    replace_raw_data(t, buf)
    assert getattr(t, attr) is buf and torch.equal(buf, old) and torch.equal(t.dequantize(), before)
    wrong = torch.empty(old.shape, dtype=torch.float64 if old.dtype != torch.float64 else torch.float32)
    with pytest.raises(ValueError, match="The data types of raw data don't match"):
        replace_raw_data(t, wrong)


def test_replace_raw_data_refuses_what_te_refuses() -> None:
    with pytest.raises(NotImplementedError, match="replace_raw_data for MXFP8Tensor is not supported yet"):
        replace_raw_data(MXFP8Quantizer(E4M3)(_x()), torch.empty(32, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="replace_raw_data for .* is not supported yet"):
        replace_raw_data(torch.zeros(3), torch.zeros(3))


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    """satfinite RN to E4M3 by torch's own cast, as uint8 codes."""
    return x.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def test_quantize_master_weights_delayed_scaling_casts_the_fragment_with_the_quantizers_scale() -> None:
    q = _delayed(scale=64.0)
    q.amax.fill_(0.5)
    w = q(torch.zeros(16, 32, dtype=torch.bfloat16))
    old = w._data.clone()
    master = _x((100,), seed=2) * 0.1  # float32 master shard of elements 40..139
    w._high_precision_init_val = torch.ones(1)
    w.clear_high_precision_init_val = lambda: setattr(w, "_high_precision_init_val", None)
    quantize_master_weights([w], [master], [40], group=None)
    want = old.reshape(-1).clone()
    want[40:140] = _e4m3(master.to(torch.bfloat16).float() * 64.0)
    assert torch.equal(w._data.reshape(-1), want) and w._high_precision_init_val is None
    amax = torch.fmax(torch.tensor(0.5), master.to(torch.bfloat16).float().abs().max())
    assert torch.equal(q.amax, amax.reshape(1)) and torch.equal(w._scale_inv, torch.tensor([1 / 64.0]))


def test_quantize_master_weights_current_scaling_takes_the_scale_from_the_master_amax() -> None:
    q = Float8CurrentScalingQuantizer(E4M3)
    w1, w2 = q(_x((16, 32), seed=3)), q(_x((8, 32), seed=4))
    m1 = _x((16 * 32,), seed=5) * 3  # the whole weight
    old2 = w2._data.clone()
    cast_master_weights_to_fp8([w1, w2], [m1, None], [0, None], group=None)
    amax = m1.abs().max()
    scale = torch.tensor(448.0) / amax
    assert torch.equal(w1._scale_inv, (1 / scale).reshape(1))
    assert torch.equal(w1._data.reshape(-1), _e4m3(m1 * scale))
    # a weight whose master shard is on another rank: amax 0 -> scale 1, codes untouched
    assert torch.equal(w2._scale_inv, torch.ones(1)) and torch.equal(w2._data, old2)
    with pytest.raises(ValueError, match="All model weights must have the same force_pow_2_scales"):
        w3 = Float8CurrentScalingQuantizer(E4M3, force_pow_2_scales=True)(_x((8, 32)))
        quantize_master_weights([w1, w3], [m1, None], [0, None], group=None)
    with pytest.raises(ValueError, match="NVFP4 2D quantization must be enabled."):  # TE utils.py line 779
        quantize_master_weights([NVFP4Quantizer()(_x())], [_x().reshape(-1)], [0], group=None)


def test_clear_columnwise_cache_and_is_custom_follow_te() -> None:
    """TE ``tensor/utils.py`` ``clear_columnwise_cache`` (lines 1523-1535) and ``is_custom`` (1538-1547)."""
    from fp8sim.pytorch.tensor.utils import clear_columnwise_cache, is_custom

    b = MXFP8Quantizer(E4M3)(_x())
    clear_columnwise_cache(b)
    assert b._columnwise_data is None and b._columnwise_scale_inv is None and b._rowwise_data is not None
    f = _delayed()(_x())
    clear_columnwise_cache(f)
    assert f._transpose is None and f._transpose_invalid and f._data is not None
    q = IdentityQuantizer()
    assert not is_custom() and not is_custom(torch.zeros(1)) and not is_custom(f) and not is_custom(q)
    q.custom = True
    assert is_custom(q)
    with pytest.raises(AssertionError, match="Object must be a Quantizer or QuantizedTensorStorage instance"):
        is_custom(3)


def test_quantize_master_weights_block_scaling_casts_the_shard_per_128x128_tile() -> None:
    """TE ``tensor/utils.py`` ``_cast_master_weights_to_fp8_blockwise_scaling`` (lines 593-749) with
    ``common/recipe/fp8_block_scaling.cu`` (partial amax: the shard's elements of each 128x128 tile, flat
    index ``i`` at row ``i // w``; partial cast ``fp8(master * scale)``) and ``recipe_common.cuh``'s scale;
    the columnwise copy is dropped and remade from the rowwise one in the next training step."""
    q = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)
    w = q(torch.zeros(256, 192, dtype=torch.bfloat16))
    old = w._rowwise_data.clone().reshape(-1)
    start, n = 200, 30000
    master = torch.randn(n, generator=torch.Generator().manual_seed(6)) * 2
    quantize_master_weights([w], [master], [start], group=None)
    mb = master.to(torch.bfloat16).float()
    idx = torch.arange(start, start + n)
    tile = (idx // 192) // 128 * 2 + (idx % 192) // 128  # 2 x 2 tiles
    amax = torch.zeros(4).scatter_reduce(0, tile, mb.abs(), reduce="amax").reshape(2, 2)
    scale = torch.exp2(torch.floor(torch.log2(torch.tensor(448.0) / amax)))  # force_pow_2_scales (TE default)
    assert torch.equal(w._rowwise_scale_inv[:2, :2], 1 / scale) and torch.all(w._rowwise_scale_inv[:, 2:] == 1)
    got = w._rowwise_data.reshape(-1)
    want = (mb * scale.reshape(-1)[tile]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(got[start : start + n], want)
    assert torch.equal(got[:start], old[:start]) and torch.equal(got[start + n :], old[start + n :])
    assert w._columnwise_data is None
    w.update_usage(columnwise_usage=True)  # 2D tiles: the transpose of the rowwise copy
    assert torch.equal(w._columnwise_data, w._rowwise_data.t()) and torch.equal(
        w._columnwise_scale_inv[:2, :2], w._rowwise_scale_inv[:2, :2].t()
    )


def test_quantize_master_weights_1x128_runs_tes_128x128_tile_kernels_into_the_1x128_layout() -> None:
    """TE ``tensor/utils.py`` lines 293-330 route every ``Float8BlockQuantizer`` to the blockwise cast
    (lines 593-749), whose kernels (``fp8_partial_cast.cpp`` 11-45, block_len 128) compute 128x128-tile amaxes
    into ``amax[tile_h * stride_h + tile_w]`` of the ``get_scale_shape`` buffer, which for 1x128 is
    ``(ceil(K/128), round_up(M, 4))``; ``scale_inv`` is that buffer's reciprocal scale."""
    from fp8sim._util.upstream_quirk import UpstreamQuirkWarning

    q = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)
    w = q(torch.zeros(256, 384, dtype=torch.bfloat16))
    master = torch.randn(256 * 384, generator=torch.Generator().manual_seed(7)) * 2
    with pytest.warns(UpstreamQuirkWarning, match="1x128"):
        quantize_master_weights([w], [master], [0], group=None)
    mb = master.to(torch.bfloat16).float()
    idx = torch.arange(256 * 384)
    flat = ((idx // 384) // 128) * 256 + (idx % 384) // 128  # tile (i, j) at [i, j] of the (3, 256) buffer
    amax = torch.zeros(3 * 256).scatter_reduce(0, flat, mb.abs(), reduce="amax")
    scale = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(448.0 / amax))), torch.ones(()))
    assert torch.equal(w._rowwise_scale_inv, (1 / scale).reshape(3, 256))
    want = (mb * scale[flat]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(w._rowwise_data.reshape(-1), want)
    tall = q(torch.zeros(512, 128, dtype=torch.bfloat16))  # 4 x 1 tiles, a (1, 512) buffer: TE writes past it
    with pytest.warns(UpstreamQuirkWarning), pytest.raises(ValueError, match="do not fit"):
        quantize_master_weights([tall], [torch.ones(512 * 128)], [0], group=None)


def _ref_e8m0(amax: torch.Tensor) -> torch.Tensor:
    """TE ``float_to_e8m0(amax * fl32(1/448))`` for normal values: the exponent field, plus one unless the
    mantissa is zero (round up); 0 for a zero amax (``util/ptx.cuh``, ``multi_tensor/compute_scale.cu``)."""
    val = amax.float() * torch.tensor(1 / 448, dtype=torch.float32)
    bits = val.view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(val == 0, torch.zeros_like(e), e).to(torch.uint8)


def test_quantize_master_weights_mxfp8_casts_both_copies_of_the_shard() -> None:
    """TE ``tensor/utils.py`` ``_cast_master_weights_to_fp8_mxfp8_scaling`` (lines 1015-1126) with
    ``common/recipe/mxfp8_scaling.cu``: bf16 amaxes of the shard per 1x32 (rowwise) and 32x1 (columnwise)
    block, E8M0 scales over the whole buffers, ``fp8(x * 2^(127 - e))`` into both copies."""
    q = MXFP8Quantizer(E4M3)
    w = q(torch.zeros(64, 96, dtype=torch.bfloat16))
    old_r, old_c = w._rowwise_data.clone().reshape(-1), w._columnwise_data.clone().reshape(-1)
    start, n = 40, 5000
    master = torch.randn(n, generator=torch.Generator().manual_seed(8)) * 5
    quantize_master_weights([w], [master], [start], group=None)
    mb = master.to(torch.bfloat16)
    idx = torch.arange(start, start + n)
    r, c = idx // 96, idx % 96
    row_amax = torch.zeros(64 * 3, dtype=torch.bfloat16).scatter_reduce(0, r * 3 + c // 32, mb.abs(), "amax")
    col_amax = torch.zeros(2 * 96, dtype=torch.bfloat16).scatter_reduce(0, (r // 32) * 96 + c, mb.abs(), "amax")
    row_e, col_e = _ref_e8m0(row_amax).reshape(64, 3), _ref_e8m0(col_amax).reshape(2, 96)
    assert torch.equal(w._rowwise_scale_inv[:64, :3], row_e) and torch.equal(w._columnwise_scale_inv[:2, :96], col_e)
    for data, old, e in ((w._rowwise_data, old_r, row_e[r, c // 32]), (w._columnwise_data, old_c, col_e[r // 32, c])):
        mult = torch.exp2(127 - e.to(torch.float32))
        want = (mb.float() * mult).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        got = data.reshape(-1)
        assert torch.equal(got[start : start + n], want)
        assert torch.equal(got[:start], old[:start]) and torch.equal(got[start + n :], old[start + n :])
    with pytest.raises(RuntimeError, match="amax should be bf16"):
        quantize_master_weights([q(_x((64, 96)))], [master], [0], group=None)


def test_quantize_master_weights_nvfp4_2d_casts_the_shard_per_16x16_tile() -> None:
    """TE ``tensor/utils.py`` ``_cast_master_weights_to_nvfp4_2d`` (lines 752-965) with ``common/recipe/nvfp4.cu``:
    tile amax of the shard (``nvfp4_2d_compute_partial_amax_kernel``, 81-128) and its global amax
    (``nvte_compute_amax``); ``S_enc = fmin(2688 / amax, FLT_MAX)`` (``nvfp4_compute_global_scale_kernel``,
    661-676); tile scale ``fmin(tile_amax * fl32(S_enc * fl32(1/6)), FLT_MAX)`` as E4M3 on each row of the tile
    (``nvfp4_fused_scale_kernel``, 735-790), ``_amax_rowwise`` = amax; ``e2m1(x * fl32(1 / fl32(e4m3 *
    fl32(1 / S_enc))))`` into the shard's nibbles (``nvfp4_2d_partial_cast_kernel``, 130-260); ml_dtypes casts."""
    import ml_dtypes
    import numpy as np

    q = NVFP4Quantizer(with_2d_quantization=True)
    w = q(torch.zeros(32, 64, dtype=torch.bfloat16))
    old = w._rowwise_data.clone().reshape(-1)
    start, n = 37, 1500  # odd start: the first element shares its byte with one the shard does not own
    master = torch.randn(n, generator=torch.Generator().manual_seed(9)) * 3
    quantize_master_weights([w], [master], [start], group=None)
    mb = master.to(torch.bfloat16).float().numpy()
    idx = np.arange(start, start + n)
    tile = (idx // 64) // 16 * 4 + (idx % 64) // 16  # 2 x 4 tiles
    tamax = np.zeros(8, np.float32)
    np.maximum.at(tamax, tile, np.abs(mb))
    g = np.float32(np.abs(mb).max())
    s_enc = np.float32(np.float32(2688) / g)
    sv = (tamax * np.float32(s_enc * (np.float32(1) / np.float32(6)))).astype(np.float32)
    e4m3 = sv.astype(ml_dtypes.float8_e4m3fn)
    assert torch.equal(w._amax_rowwise, torch.tensor([g]))
    want_s = np.repeat(e4m3.view(np.uint8).reshape(2, 4), 16, axis=0)
    assert np.array_equal(w._rowwise_scale_inv[:32, :4].numpy(), want_s)
    assert torch.all(w._rowwise_scale_inv[32:] == 0)
    enc = (np.float32(1) / (e4m3.astype(np.float32) * (np.float32(1) / s_enc))).astype(np.float32)
    codes = (mb * enc[tile]).astype(np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    got = w._rowwise_data.reshape(-1).numpy()
    nib = np.stack([got & 0xF, got >> 4], axis=-1).reshape(-1)
    old_nib = np.stack([old.numpy() & 0xF, old.numpy() >> 4], axis=-1).reshape(-1)
    assert np.array_equal(nib[start : start + n], codes)
    assert np.array_equal(nib[:start], old_nib[:start]) and np.array_equal(nib[start + n :], old_nib[start + n :])
    assert w._columnwise_data is None  # dropped until the next all-gather makes it again


def test_base_quantized_tensor_refuses_views_with_tes_message() -> None:
    """quantized_tensor.py:929-931 (TE's test_quantized_tensor.py:822-828): the base class refuses aten.view."""
    from fp8sim.pytorch.tensor import QuantizedTensor

    qt = QuantizedTensor((128, 128), torch.bfloat16)
    with pytest.raises(NotImplementedError, match="^QuantizedTensor class does not support tensor views$"):
        qt.view(-1)


_DATA_SETTERS = {  # TE: tensor/<class file>.py _set_data, and the buffer that takes over the other's
    "Float8Tensor": (lambda: te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3), "_data"),
    "MXFP8Tensor": (lambda: te.MXFP8Quantizer(DType.kFloat8E4M3), "_rowwise_data"),
    "NVFP4Tensor": (lambda: te.NVFP4Quantizer(), "_rowwise_data"),
    "Float8BlockwiseQTensor": (
        lambda: te.Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True),
        "_rowwise_data",
    ),
}


@pytest.mark.parametrize("name", list(_DATA_SETTERS))
def test_assigning_data_quantizes_into_the_tensor(name: str) -> None:
    """TE's ``data = property(_get_data, _set_data)`` (float8_tensor.py, mxfp8_tensor.py, nvfp4_tensor.py,
    float8_blockwise_tensor.py 528-579): ``.data`` is the tensor; assigning a high-precision tensor casts
    it with the tensor's quantizer; assigning a tensor of the same class takes its buffers.  fp8sim
    ignored the assignment silently."""
    make, buf = _DATA_SETTERS[name]
    torch.manual_seed(0)
    t = make()(torch.randn(64, 64))
    assert type(t).__name__ == name and t.data is t
    y = torch.randn(64, 64) * 3
    t.data = y
    assert torch.equal(t.dequantize(), make()(y).dequantize())
    other = make()(torch.randn(64, 64))
    t.data = other
    assert getattr(t, buf) is getattr(other, buf)


def test_blockwise_data_setter_refuses_another_shape() -> None:
    """float8_blockwise_tensor.py 551-557: size, stride and layout must match (no re-wrap, unlike Float8Tensor)."""
    q = te.Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True)
    t = q(torch.randn(64, 64))
    with pytest.raises(ValueError, match="^Invalid tensor for updating Float8BlockwiseQTensor data$"):
        t.data = torch.randn(32, 64)
    f8 = te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(torch.randn(64, 64))
    f8.data = f8q = te.Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(torch.randn(32, 64))
    assert f8.shape == (32, 64) and torch.equal(f8.dequantize(), f8q.dequantize())  # float8_tensor.py re-wraps
