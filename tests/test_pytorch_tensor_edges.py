"""Edges of TE's quantized-tensor classes that the mutation sample of ``fp8sim/pytorch/tensor`` found
untested (issue 30, ``reports/mutation_pytorch_tensor.md``).  Each expectation is written from
NVIDIA/TransformerEngine at d0067d0 (file and line in each test) or from torch's own ops, never from
fp8sim's formula:

- ``pytorch/quantized_tensor.py``: ``half`` (822-824), ``new_empty`` (934-952), ``empty_like`` (955-971);
- ``pytorch/tensor/float8_tensor.py``: ``new_zeros`` refuses a tensor without data (815);
- ``pytorch/tensor/float8_blockwise_tensor.py``: ``get_columnwise_shape`` (213-233);
- ``pytorch/tensor/nvfp4_tensor.py``: ``nvfp4_e4m3_max`` is 448 unless 4over6 (169-171), the FSDP2 gather's
  usages (715); ``mxfp8_tensor.py`` (687-756); ``pytorch/csrc/quantizer.cpp`` (2742-2743);
- ``pytorch/quantization.py``: ``_handle_delayed_scaling_requests`` (1754-1838: an existing state is reused
  when its dtype, slot count and history length fit);
- ``pytorch/tensor/storage/float8_blockwise_tensor_storage.py``: FSDP2 buffer fields and gather (541-667);
- ``pytorch/tensor/utils.py``: ``quantize_master_weights`` (204-344), the blockwise messages (640-658) and
  ``common/recipe/fp8_block_scaling.cu`` (partial cast, 80-120: ``static_cast<fp8>``, CUDA's satfinite
  ``__nv_fp8_e4m3(float)``), ``common/recipe/recipe_common.cuh`` (``compute_scale_from_amax``, 14-45).
"""

from __future__ import annotations

import numpy as np
import pytest

from fp8sim.testing.oracles import require

torch = require("torch")

from fp8sim.pytorch.constants import DType  # noqa: E402
from fp8sim.pytorch.tensor import (  # noqa: E402
    DelayedScalingRequest,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    HybridQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizerRole,
    custom_recipe_quantizers,
)
from fp8sim.pytorch.tensor.storage import Float8TensorStorage  # noqa: E402
from fp8sim.pytorch.tensor.storage.quantized_tensor_storage import as_storage  # noqa: E402
from fp8sim.pytorch.tensor.utils import quantize_master_weights  # noqa: E402
from fp8sim.recipe import CustomRecipe, Format  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
E4M3 = DType.kFloat8E4M3


def _x(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _current(**kw: object) -> Float8CurrentScalingQuantizer:
    return Float8CurrentScalingQuantizer(E4M3, "cpu", **kw)


# --- quantized_tensor.py: half, new_empty, quantize_ ---------------------------------------------------------


def test_half_dequantizes_straight_to_float16() -> None:
    """TE ``quantized_tensor.py:822-824``: ``dequantize(dtype=torch.float16)``; the value is TE's dequantize
    kernel's float32 product ``fp8 * scale_inv`` rounded once to float16 (torch's own ops here)."""
    t = _current()(_x((16, 32)).to(torch.bfloat16))
    h = t.half()
    assert type(h) is torch.Tensor and h.dtype == torch.float16
    want = (t._data.view(torch.float8_e4m3fn).float() * t._scale_inv).to(torch.float16)
    assert torch.equal(h, want)


def test_new_empty_keeps_the_nominal_dtype_or_takes_the_given_one() -> None:
    """TE ``quantized_tensor.py:934-952``: ``dtype = kwargs.get("dtype", tensor.dtype)``, made by the quantizer."""
    t = _current()(_x((16, 32)).to(torch.bfloat16))
    same = t.new_empty((4, 32))
    assert type(same) is type(t) and same.dtype == torch.bfloat16 and tuple(same.shape) == (4, 32)
    assert t.new_empty((4, 32), dtype=torch.float16).dtype == torch.float16


def test_new_empty_without_a_quantizer_names_the_tensor_class() -> None:
    """TE ``quantized_tensor.py:940-944``: ``f"{type(tensor).__name__} does not have a quantizer; ..."``."""
    t = _current()(_x((16, 32)))
    t._quantizer = None
    with pytest.raises(RuntimeError, match="^Float8Tensor does not have a quantizer; cannot create new_empty"):
        t.new_empty((4, 32))


def test_quantize_into_a_tensor_of_another_shape_names_both_shapes() -> None:
    """fp8sim's refusal (TE's C++ would fail deeper in the kernel launch): the message names both shapes."""
    t = _current()(_x((16, 32)))
    with pytest.raises(ValueError, match=r"cannot quantize a tensor of shape \(3, 4\) into \(16, 32\)"):
        t.quantize_(torch.zeros(3, 4))


def test_float8_new_zeros_without_rowwise_or_columnwise_data_is_tes_error() -> None:
    """TE ``float8_tensor.py:815``."""
    t = _current(rowwise=True, columnwise=False)(_x((16, 32)))
    t.update_usage(rowwise_usage=False)
    with pytest.raises(RuntimeError, match="^Float8Tensor.new_zeros requires rowwise or columnwise data$"):
        t.new_zeros((16, 32))


# --- custom_recipe.py ------------------------------------------------------------------------------------------

ROLE = [QuantizerRole("linear", "grad_output", "fc1")]


def test_custom_recipe_needs_roles_or_a_count() -> None:
    with pytest.raises(ValueError, match="^give roles or num_quantizers$"):
        custom_recipe_quantizers(CustomRecipe(qfactory=lambda r: DelayedScalingRequest()), None)


def test_custom_recipe_reuses_a_backward_e4m3_state() -> None:
    """TE ``quantization.py:1815-1822``: reused when ``num_quantizers``, ``dtype`` (the request's format in
    this direction: E4M3 in the backward pass for ``Format.E4M3``, not HYBRID's E5M2) and ``amax_history_len``
    fit."""
    recipe = CustomRecipe(qfactory=lambda r: DelayedScalingRequest(amax_history_len=4, fp8_format=Format.E4M3))
    first = custom_recipe_quantizers(recipe, ROLE, mode="backward")
    assert first.scaler.fmt.name == "e4m3"
    again = custom_recipe_quantizers(recipe, ROLE, mode="backward", existing=first.scaler)
    assert again.scaler is first.scaler


# --- float8_blockwise_tensor.py / nvfp4_tensor.py -------------------------------------------------------------


def test_blockwise_columnwise_copy_of_a_3d_tensor_made_from_the_rowwise_one() -> None:
    """TE ``float8_blockwise_tensor.py:229-233``: the columnwise data of shape (A, B, K) is (K, A, B); made from
    the rowwise copy (2D tiles) it equals the columnwise copy a direct quantization gives."""
    x = _x((2, 128, 256), seed=3)
    rowwise = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=2)(x)
    both = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)(x)
    rowwise.update_usage(rowwise_usage=True, columnwise_usage=True)
    assert tuple(rowwise._columnwise_data.shape) == (256, 2, 128)
    assert torch.equal(rowwise._columnwise_data, both._columnwise_data)
    assert torch.equal(rowwise._columnwise_scale_inv, both._columnwise_scale_inv)


def test_nvfp4_e4m3_max_is_448_unless_4over6() -> None:
    """TE ``nvfp4_tensor.py:169-171``: ``nvfp4_e4m3_max if nvfp4_use_4over6 else 448``, then checked."""
    assert NVFP4Quantizer(nvfp4_e4m3_max=256).nvfp4_e4m3_max == 448
    assert NVFP4Quantizer(nvfp4_e4m3_max=7).nvfp4_e4m3_max == 448  # ignored, so not refused
    assert NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=256).nvfp4_e4m3_max == 256
    with pytest.raises(ValueError, match="nvfp4_e4m3_max must be 448 or 256"):
        NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=7)


def test_row_scaled_nvfp4_quantize_with_amax_is_tes_error() -> None:
    """TE ``pytorch/csrc/quantizer.cpp:2742-2743``."""
    q = NVFP4Quantizer(columnwise=False, row_scaled_nvfp4=True)
    with pytest.raises(
        RuntimeError, match=r"^quantize_with_amax is not supported for row-scaled NVFP4 quantization\.$"
    ):
        q.quantize_with_amax(_x((32, 32)), 1.0)


def test_a_storage_view_is_tes_storage_class_over_the_tensors_buffers() -> None:
    """TE's ``internal=True`` quantizers return ``*TensorStorage`` objects that are no ``torch.Tensor``
    (``quantized_tensor.py:53``, ``tensor/storage/float8_tensor_storage.py``); fp8sim's view of a tensor as one
    reads the very buffers and dequantizes to the same values."""
    t = _current()(_x((8, 16)))
    s = as_storage(t)
    assert isinstance(s, Float8TensorStorage) and not isinstance(s, torch.Tensor)
    assert s._data is t._data and s._scale_inv is t._scale_inv
    assert torch.equal(s.dequantize(), t.dequantize())


# --- float8_blockwise_tensor_storage.py: FSDP2 buffers ---------------------------------------------------------


def test_blockwise_fsdp_fields_are_tes_and_1d_scaling_is_tes_error() -> None:
    """TE ``float8_blockwise_tensor_storage.py:541-555``: the fields in TE's order, and TE's exact message."""
    t = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)(_x((128, 256)))
    assert t.fsdp_buffer_fields() == (
        "_rowwise_data",
        "_rowwise_scale_inv",
        "_columnwise_data",
        "_columnwise_scale_inv",
    )
    one_d = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=1)(_x((128, 256)))
    with pytest.raises(NotImplementedError) as err:
        one_d.fsdp_buffer_fields()
    assert str(err.value) == (
        "FSDP2 for Float8BlockwiseQTensor requires 2D block scaling (block_scaling_dim=2). 1D block scaling is not "
        "supported because its scale layout has M in dim1, which is incompatible with FSDP2 dim-0 all-gather."
    )


def test_blockwise_fsdp_gather_of_3d_shards_flattens_the_leading_dims() -> None:
    """TE ``float8_blockwise_tensor_storage.py:626-640``: ``m_full`` is the product of all leading dims of the
    gathered data; two (2, 64, 256) shards (128 flattened rows each) gather into the (4, 64, 256) weight."""
    q = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=2)
    shards = [q(_x((2, 64, 256), seed=s)) for s in (4, 5)]
    parts = [s.fsdp_extract_buffers() for s in shards]
    gathered = tuple(torch.cat([p[0][i] for p in parts]) for i in range(2))
    full = q(torch.zeros(4, 64, 256))
    full.fsdp_assign_gathered(gathered, parts[0][1])
    assert torch.equal(full.dequantize(), torch.cat([s.dequantize() for s in shards]))


# --- utils.py: quantize_master_weights (128x128 blockwise) ---------------------------------------------------


def _block_weight(**kw: object) -> torch.Tensor:
    q = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=2, **kw)
    return q(torch.zeros(128, 128))


def test_blockwise_master_weights_need_one_amax_epsilon() -> None:
    """TE ``utils.py:653-658``."""
    a, b = _block_weight(), _block_weight(amax_epsilon=1e-3)
    with pytest.raises(ValueError, match="^All model weights must have the same amax_epsilon, expected 0.0 but got"):
        quantize_master_weights([a, b], [torch.zeros(16), torch.zeros(16)], [0, 0], group=None)


def _inf_master(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    master = torch.zeros(n, dtype=dtype)
    master[:4] = torch.tensor([float("-inf"), float("inf"), 2.0, -3.0])
    return master


@pytest.mark.parametrize(("dtype", "codes"), [(E4M3, [0xFE, 0x7E]), (DType.kFloat8E5M2, [0xFB, 0x7B])])
def test_blockwise_master_weight_infinities_saturate(dtype: DType, codes: list[int]) -> None:
    """The partial-cast kernel converts with ``static_cast<__nv_fp8_e4m3>`` / ``<__nv_fp8_e5m2>``
    (``fp8_block_scaling.cu:111``), CUDA's SATFINITE conversions: -inf -> -448 (0xFE) / -57344 (0xFB), +inf ->
    448 / 57344; torch's plain ``.to(float8_e5m2)`` keeps inf (0xFC)."""
    w = Float8BlockQuantizer(dtype, rowwise=True, columnwise=False, block_scaling_dim=2)(torch.zeros(128, 128))
    quantize_master_weights([w], [_inf_master(128 * 128)], [0], group=None)
    assert w._rowwise_data.reshape(-1)[:2].tolist() == codes


def test_blockwise_master_weight_with_an_infinity_keeps_scale_one() -> None:
    """Divergence fixed (2026-12-02): TE's partial amax (``fp8_block_scaling.cu:46-49``, ``fmaxf(amax,
    fabs(x))``) keeps an infinite element's amax infinite, and ``compute_scale_from_amax``
    (``recipe_common.cuh:24-26``) gives scale 1 for it, so the tile's finite elements cast unscaled (2 -> 0x40,
    -3 -> 0xC4).  fp8sim replaced inf by FLT_MAX (``nan_to_num``), giving scale 2^-120 and zero codes."""
    w = _block_weight()
    quantize_master_weights([w], [_inf_master(128 * 128)], [0], group=None)
    assert w._rowwise_scale_inv[0, 0].item() == 1.0
    assert w._rowwise_data.reshape(-1)[:4].tolist() == [0xFE, 0x7E, 0x40, 0xC4]


def test_mxfp8_master_weight_with_an_infinity_gets_tes_e8m0_of_infinity() -> None:
    """Divergence fixed (2026-12-02): TE's partial amax (``mxfp8_scaling.cu:48-50``) keeps inf, and
    ``float_to_e8m0`` (``util/ptx_arch_spec.cuh:89-91``) maps an infinite ``amax / 448`` to 0xFE; fp8sim had
    replaced inf by bfloat16's largest value (scale 0xF7)."""
    w = MXFP8Quantizer(E4M3)(torch.zeros(64, 64, dtype=torch.bfloat16))
    quantize_master_weights([w], [_inf_master(64 * 64)], [0], group=None)
    assert w._rowwise_scale_inv[0, 0].item() == 0xFE  # row 0, block 0: -inf, inf, 2, -3
    assert w._columnwise_scale_inv[0, :4].tolist() == [0xFE, 0xFE, 120, 120]  # 2, 3: 127 + ceil(log2(x / 448))


def test_nvfp4_master_weight_with_an_infinity_keeps_the_infinite_amax() -> None:
    """Divergence fixed (2026-12-02): TE's partial and global amax (``nvfp4.cu:102-123``, ``fmaxf`` of
    ``fabs``) keep inf, and the fused scale kernel writes the global amax into ``_amax_rowwise``
    (``utils.py:854-900``); fp8sim had stored FLT_MAX."""
    w = NVFP4Quantizer(with_2d_quantization=True, columnwise=False)(torch.zeros(32, 32))
    quantize_master_weights([w], [_inf_master(32 * 32)], [0], group=None)
    assert w._amax_rowwise.item() == float("inf")


def test_quantize_master_weights_refuses_lists_of_different_lengths() -> None:
    """fp8sim refuses what TE's ``zip`` (``utils.py:253-255``) would silently truncate: a weight left stale."""
    w1, w2 = _current()(_x((16, 32))), _current()(_x((16, 32), seed=1))
    with pytest.raises(ValueError, match="zip"):
        quantize_master_weights([w1, w2], [torch.zeros(16 * 32)], [0, 0], group=None)


# --- FSDP2 shard ops and gathers, in one process (``_fsdp2*.py``) ---------------------------------------------
# FSDP2 shards a parameter with ``split``/``new_zeros``/``narrow`` and rebuilds it with ``fsdp_post_all_gather``;
# the gathered buffers are built here as TE's ``fsdp_pre_all_gather`` sends them (the shard's codes and its
# scale rows without padding), so the rebuilt tensor must equal the quantization of the whole weight.


def test_a_partial_narrow_of_a_padded_fsdp2_shard_is_refused_naming_the_rows() -> None:
    full = MXFP8Quantizer(E4M3)(_x((128, 64)))
    padded = full.new_zeros((128, 64))  # FSDP2's padded shard
    with pytest.raises(NotImplementedError, match=r"uneven shards \(a shard of 64 rows in a padded shard of 128\)"):
        padded.narrow(0, 0, 64)


def test_mxfp8_backward_gather_of_the_columnwise_copy_sets_the_quantizers_usages() -> None:
    """TE ``mxfp8_tensor.py:687-756``: the columnwise-only gather (resharded, backward) rebuilds the columnwise
    copy, and ``out._quantizer.set_usage(rowwise=rowwise_usage, columnwise=columnwise_usage)``."""
    x = _x((128, 64), seed=6)
    q = MXFP8Quantizer(E4M3)
    full, shards = q(x), [q(x[:64]), q(x[64:])]
    gathered = (
        torch.cat([s._columnwise_data for s in shards]),
        torch.cat([s._columnwise_scale_inv[: 64 // 32] for s in shards]),
    )
    out, _ = shards[0].fsdp_post_all_gather(gathered, (E4M3, False, False, True, True), torch.float32)
    assert out._rowwise_data is None
    assert (out._quantizer.rowwise_usage, out._quantizer.columnwise_usage) == (False, True)
    assert torch.equal(out._columnwise_data, full._columnwise_data)
    assert torch.equal(out._columnwise_scale_inv, full._columnwise_scale_inv)


def test_nvfp4_gather_always_sets_rowwise_usage() -> None:
    """TE ``nvfp4_tensor.py:715``: ``out._quantizer.set_usage(rowwise=True, columnwise=columnwise_usage)``."""
    x = _x((32, 64), seed=7)
    q = NVFP4Quantizer(with_2d_quantization=True)
    shard = q(x)
    shard._quantizer.set_usage(rowwise=False)
    meta = (False, shard._amax_rowwise, shard._amax_columnwise, 64)
    out, _ = shard.fsdp_post_all_gather((shard._rowwise_data, shard._rowwise_scale_inv[:32]), meta, torch.float32)
    assert out._quantizer.rowwise_usage is True and out._quantizer.columnwise_usage is False
    assert torch.equal(out.dequantize(), q(x).dequantize())


def test_nvfp4_row_split_pieces_keep_the_fp4_dtype_codes_and_scales() -> None:
    """A 16-row-aligned split of a 2D-quantized NVFP4 weight (FSDP2's shards) gives NVFP4 pieces whose values are
    the rows of the weight's values (2D tiles do not straddle the cut)."""
    t = NVFP4Quantizer(with_2d_quantization=True)(_x((64, 64), seed=8))
    pieces = torch.split(t, 32)
    assert all(type(p) is type(t) and p._fp4_dtype == t._fp4_dtype for p in pieces)
    assert torch.equal(torch.cat([p.dequantize() for p in pieces]), t.dequantize())


def test_row_scaled_nvfp4_shards_are_refused() -> None:
    """fp8sim gathers one amax per weight; a row-scaled weight (one amax per row) is refused, not mis-gathered."""
    t = NVFP4Quantizer(columnwise=False, row_scaled_nvfp4=True)(_x((64, 64)))
    with pytest.raises(NotImplementedError, match="row-scaled NVFP4 weights"):
        t.new_zeros((32, 64))


# --- _quantized_data.py: the GEMM record of an NVFP4 tensor ---------------------------------------------------


def test_nvfp4_record_has_1x16_blocks_and_the_tensors_values() -> None:
    """TE's 1x16 NVFP4: one E4M3 scale per 16 elements of a row; the record dequantizes to the tensor's values
    (``fp4 * e4m3 scale / S_enc``; equal up to the order of the float32 products)."""
    t = NVFP4Quantizer(columnwise=False)(_x((32, 64), seed=9))
    rec = t.quantized_data()
    assert rec.block == (1, 16)
    np.testing.assert_allclose(rec.dequantize(), t.dequantize(dtype=torch.float32).numpy(), rtol=3e-7, atol=0)


def test_nvfp4_record_of_zeros_has_global_scale_one() -> None:
    """TE ``cast/nvfp4/core_nvfp4.cuh:87-93``: a zero global amax gives ``S_enc = 1`` (not FLT_MAX), so the record's
    global (decode) scale is 1."""
    rec = NVFP4Quantizer(columnwise=False)(torch.zeros(16, 32)).quantized_data()
    assert float(rec.global_scale) == 1.0


# --- hybrid_tensor.py / mxfp8_tensor.py ----------------------------------------------------------------------


def test_hybrid_storage_asked_for_a_dropped_columnwise_copy_is_tes_error() -> None:
    """TE ``tensor/storage/hybrid_tensor_storage.py:87-91``."""
    h = HybridQuantizer(
        rowwise_quantizer=MXFP8Quantizer(E4M3),
        columnwise_quantizer=NVFP4Quantizer(with_rht=False, with_post_rht_amax=False),
    )
    out = h.quantize(_x((32, 64)).to(torch.bfloat16))
    out.update_usage(columnwise_usage=False)
    with pytest.raises(
        RuntimeError,
        match="^Requested columnwise usage, but HybridQuantizedTensorStorage has no columnwise sub-storage$",
    ):
        out.update_usage(columnwise_usage=True)


def test_mxfp8_row_split_pieces_are_the_quantizations_of_the_pieces() -> None:
    """A 32-row-aligned split (FSDP2's shards): 1x32 rowwise and 32x1 columnwise blocks do not straddle the cut,
    so each piece's codes and scales (both copies, TE's padded scale layouts) are those of quantizing the piece's
    rows alone."""
    x = _x((96, 64), seed=10)
    q = MXFP8Quantizer(E4M3)
    pieces = torch.split(q(x), 32)
    for i, p in enumerate(pieces):
        alone = q(x[32 * i : 32 * (i + 1)])
        assert type(p) is type(alone) and tuple(p.shape) == (32, 64)
        for name in ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv"):
            assert torch.equal(getattr(p, name), getattr(alone, name)), name


# --- FSDP2 sharding ops of the block-scaled classes (``_fsdp2_block.py``, ``_fsdp2.py``) ---------------------


def test_unaligned_row_splits_fall_back_to_the_dequantized_values() -> None:
    """Splits that cut a scale block (MXFP8: 16 rows; 128x128 tiles: 64 rows) and 1x128 (1D) block scaling,
    whose scales keep M in dim 1, give TE's fallback: plain tensors holding the rows of the dequantized values."""
    mx = MXFP8Quantizer(E4M3)(_x((128, 64), seed=11))
    two_d = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=2)(_x((256, 128), seed=12))
    one_d = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=True, block_scaling_dim=1)(_x((256, 128), seed=13))
    for t, rows in ((mx, 16), (two_d, 64), (one_d, 128)):
        pieces = torch.split(t, rows)
        assert all(type(p) is torch.Tensor for p in pieces)
        assert torch.equal(torch.cat(pieces), t.dequantize())


def test_fsdp2_same_shape_as_strided_keeps_the_block_scaled_tensor() -> None:
    """FSDP2 views the gathered parameter with ``as_strided(size, stride)`` of its own shape: TE returns the
    tensor's class over the same buffers (a contiguous, same-shape view)."""
    t = MXFP8Quantizer(E4M3)(_x((128, 64)))
    view = torch.as_strided(t, t.shape, t.stride())
    assert type(view) is type(t) and view._rowwise_data is t._rowwise_data


def test_fsdp2_new_zeros_of_an_mxfp8_shard_has_zero_codes_and_scales_in_tes_layouts() -> None:
    """The padded shard FSDP2 copies into: both copies present, zero, with ``get_scale_shape``'s padded layouts
    (``mxfp8_tensor.py:164-176``: rowwise rows padded to 128, columnwise to 4)."""
    q = MXFP8Quantizer(E4M3)
    z = q(_x((128, 64))).new_zeros((64, 64))
    assert tuple(z._rowwise_scale_inv.shape) == q.get_scale_shape((64, 64), False) == (128, 4)
    assert tuple(z._columnwise_scale_inv.shape) == q.get_scale_shape((64, 64), True) == (4, 128)
    for name in ("_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"):
        assert not getattr(z, name).any(), name


def test_mxfp8_forward_gather_pads_the_rowwise_scales_to_tes_layout() -> None:
    """The rowwise gather (``mxfp8_tensor.py:687-756``): scale rows re-padded to a multiple of 128; the rebuilt
    tensor is the quantization of the whole weight."""
    x = _x((64, 64), seed=14)
    q = MXFP8Quantizer(E4M3)
    full, shards = q(x), [q(x[:32]), q(x[32:])]
    gathered = (torch.cat([s._rowwise_data for s in shards]), torch.cat([s._rowwise_scale_inv[:32] for s in shards]))
    out, _ = shards[0].fsdp_post_all_gather(gathered, (E4M3, False, True, False, False), torch.float32)
    assert tuple(out._rowwise_scale_inv.shape) == q.get_scale_shape((64, 64), False) == (128, 4)
    assert torch.equal(out._rowwise_scale_inv, full._rowwise_scale_inv)
    assert torch.equal(out._rowwise_data, full._rowwise_data)


def test_float8_gather_rebuilds_a_parameter_that_does_not_require_grad() -> None:
    """TE ``float8_tensor.py`` ``fsdp_post_all_gather``: ``Float8Tensor(..., requires_grad=False)`` over the
    gathered codes and scale; here (no process group) the whole weight's codes and scale stand for the gathered
    buffers, so the rebuilt values are the whole weight's."""
    xs = _x((64, 32), seed=15)
    full = _current()(xs)
    shard = _current()(xs[:32])
    meta = (full._scale_inv, True, False, E4M3)
    out, _ = shard.fsdp_post_all_gather((full._data.clone(),), meta, torch.float32)
    assert out.requires_grad is False
    assert torch.equal(out.dequantize(), full.dequantize())
